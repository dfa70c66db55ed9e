"""Liveness and readiness probes, and plotly's JavaScript from its Python package."""

from functools import lru_cache
from pathlib import Path

import plotly
from django.conf import settings
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import cache_control
from django.views.decorators.csrf import csrf_exempt


def healthz(request):
    return HttpResponse("ok", content_type="text/plain")


def _check_database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return "ok"


def _check_redis() -> str:
    import redis

    redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1).ping()
    return "ok"


def _check_worker() -> str:
    from mtc.celery import app

    replies = app.control.ping(timeout=1.0)
    if not replies:
        raise RuntimeError("no Celery worker answered")
    return f"{len(replies)} worker(s)"


def readyz(request):
    checks, ready = {}, True
    for name, check in (
        ("database", _check_database),
        ("redis", _check_redis),
        ("worker", _check_worker),
    ):
        if name == "worker" and checks["redis"] != "ok":  # asking would only time out
            checks[name] = "unknown: the task queue is down"
            continue
        try:
            checks[name] = check()
        except Exception as exc:  # noqa: BLE001 - a probe reports, never raises
            checks[name] = f"error: {exc}"
            ready = False
    return JsonResponse({"ready": ready, "checks": checks}, status=200 if ready else 503)


@lru_cache(maxsize=1)
def _plotly_source() -> bytes:
    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()


@cache_control(max_age=86400, public=True)
def plotly_js(request):
    return HttpResponse(_plotly_source(), content_type="application/javascript")


@csrf_exempt  # any method on an unknown path is a JSON 404, not a CSRF page
def api_not_found(request, *args, **kwargs):
    from mtc.api.errors import error_body

    return JsonResponse(error_body("NOT_FOUND", f"No API endpoint at {request.path}."), status=404)
