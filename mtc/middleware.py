from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpResponseBadRequest

from .api.errors import api_error_response

# The API authenticates itself (session or token) and answers 401/403 in JSON;
# probes and static files need no login.
OPEN_PREFIXES = (
    "/healthz",
    "/readyz",
    "/metrics",  # authenticates itself (API token), like the API
    "/api/v1/",
    "/api/schema/",
    "/accounts/",
    "/static/",
    "/admin/",
)


class LoginRequiredMiddleware:
    """Every page needs a signed-in user, except the prefixes above."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        # The path test comes first: it spares open paths a session lookup.
        if not request.path.startswith(OPEN_PREFIXES) and not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        return self.get_response(request)


class NulInUrlMiddleware:
    """A NUL character in a URL's path or query is a 400: no name or search holds one,
    and PostgreSQL refuses one in any query text (SQLite would only find nothing)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if "\x00" in request.path or any(
            "\x00" in key or any("\x00" in value for value in values)
            for key, values in request.GET.lists()
        ):
            message = "The URL holds a NUL character."
            if request.path.startswith("/api/"):
                return api_error_response("INVALID_ARGUMENT", message, status=400)
            return HttpResponseBadRequest(message, content_type="text/plain")
        return self.get_response(request)


class ServerTimingMiddleware:
    """With MTC_SERVER_TIMING=1 (bench/fleet.py), each response says how long the server
    took and how many queries it made: ``Server-Timing: app;dur=12.3, db;desc="7"``.
    Off by default: it would tell every client how busy the database is."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        import time

        from django.db import connection

        count = 0

        def counted(execute, sql, params, many, context):
            nonlocal count
            count += 1
            return execute(sql, params, many, context)

        start = time.perf_counter()
        with connection.execute_wrapper(counted):
            response = self.get_response(request)
        ms = (time.perf_counter() - start) * 1000
        response["Server-Timing"] = f'app;dur={ms:.1f}, db;desc="{count}"'
        return response
