"""TensorBoard through mtc: "Open in TensorBoard" on a recipe job's page, and the proxy
that passes every request under /clusters/<cluster_id>/tensorboard/ to the signed-in
person's own TensorBoard of that cluster on 127.0.0.1 (which instance, and its port, come
from the session's user and mtc's own state, never from the request).

The login middleware guards both; the proxy checks again, so it never answers anonymously."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

from django.contrib import messages
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from identity.services import IdentityMissing
from jobs import selectors
from jobs.views import _cluster_or_404, _job_or_404
from mtc.loopback import check_peer

from . import tensorboard

CHUNK = 64 * 1024
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0
# Request headers TensorBoard uses; mtc's cookies and credentials are not passed on.
FORWARD_REQUEST_HEADERS = (
    "Accept",
    "Accept-Encoding",
    "Content-Type",
    "If-None-Match",
    "If-Modified-Since",
    "X-XSRF-Protected",
)
FORWARD_RESPONSE_HEADERS = (
    "Cache-Control",
    "Content-Disposition",
    "Content-Encoding",
    "Content-Length",
    "Content-Security-Policy",
    "ETag",
    "Expires",
    "Last-Modified",
    "X-Content-Type-Options",
)


@require_POST
def tensorboard_open(request, cluster_id: str, job_id: str):
    """Start (or reuse) the viewer's TensorBoard with this job's run, then go there."""
    cluster = _cluster_or_404(cluster_id)
    job = _job_or_404(request, cluster, job_id)
    if tensorboard.job_logdir(job) is None:
        messages.error(request, f"Job {job.job_id} is not a recipe run: it has no event files.")
        return redirect("jobs:detail", cluster.cluster_id, job.job_id)
    try:
        board = tensorboard.tensorboard_open(cluster=cluster, jobs=[job], viewer=request.user)
    except (tensorboard.TensorBoardError, IdentityMissing, OSError) as exc:
        messages.error(request, str(exc))
        return redirect("jobs:detail", cluster.cluster_id, job.job_id)
    return redirect(f"{board.prefix}/")


def _unavailable(request, cluster_id: str, message: str, status: int) -> HttpResponse:
    return render(
        request,
        "jobs/tensorboard_unavailable.html",
        {"cluster_id": cluster_id, "message": message},
        status=status,
    )


def _stream(connection: http.client.HTTPConnection, upstream) -> Iterator[bytes]:
    try:
        while chunk := upstream.read1(CHUNK):
            yield chunk
    finally:
        connection.close()


def _same_origin(request) -> bool:
    origin = request.headers.get("Origin")
    return origin is None or origin == f"{request.scheme}://{request.get_host()}"


# TensorBoard's own pages POST read-only queries (time series) without Django's CSRF
# token. Its POSTs change nothing; a cross-site one is refused by its Origin, and the
# session cookie (SameSite=Lax) does not go with it anyway.
@csrf_exempt
@require_http_methods(["GET", "HEAD", "POST"])
def tensorboard_proxy(request, cluster_id: str, subpath: str = ""):
    if not request.user.is_authenticated:  # the middleware sends pages to the login first
        return HttpResponse("Sign in to mtc first.", status=401, content_type="text/plain")
    if request.method == "POST" and not _same_origin(request):
        return HttpResponse("Cross-site request refused.", status=403, content_type="text/plain")
    # Only ever the asker's own instance: there is no way to name another's.
    board = tensorboard.tensorboard_get(cluster_id, viewer=request.user)
    if board is None:
        if not selectors.tensorboard_runs_exist_for(request.user, cluster_id):
            return _unavailable(
                request, cluster_id, "You have no recipe runs on this cluster to show.", 403
            )
        return _unavailable(
            request,
            cluster_id,
            "Your TensorBoard is not running for this cluster (it stops when nobody looks "
            "for a while). Open it again from a recipe job's page.",
            503,
        )
    if not selectors.tensorboard_viewable_by(request.user, board.job_pks):
        return _unavailable(request, cluster_id, "This TensorBoard is not yours.", 403)
    tensorboard.tensorboard_touch(board)

    headers = {h: request.headers[h] for h in FORWARD_REQUEST_HEADERS if h in request.headers}
    body = request.body if request.method == "POST" else None
    connection = http.client.HTTPConnection("127.0.0.1", board.port, timeout=CONNECT_TIMEOUT_S)
    try:
        # The path is mtc's own (it starts with the prefix the URL matched); the host and
        # port are TensorBoard's, from the state file, and the socket that answers must
        # be its account's (a process that took a freed port gets nothing).
        connection.connect()
        check_peer(connection.sock, board.uid, "TensorBoard's port")
        connection.request(request.method, request.get_full_path(), body=body, headers=headers)
        connection.sock.settimeout(READ_TIMEOUT_S)
        upstream = connection.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        return _unavailable(request, cluster_id, f"TensorBoard did not answer: {exc}", 502)

    response = StreamingHttpResponse(
        _stream(connection, upstream),
        status=upstream.status,
        content_type=upstream.getheader("Content-Type", "application/octet-stream"),
    )
    for name in FORWARD_RESPONSE_HEADERS:
        value = upstream.getheader(name)
        if value is not None:
            response[name] = value
    location = upstream.getheader("Location")
    if location and location.startswith(board.prefix):  # its own redirects (add a slash)
        response["Location"] = location
    return response
