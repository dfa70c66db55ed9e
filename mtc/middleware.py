from django.conf import settings
from django.contrib.auth.views import redirect_to_login

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
