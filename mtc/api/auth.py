"""`Authorization: Token <key>` or `Bearer <key>` (OpenAI clients), checked by hash."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions

from ..tokens import key_hash

LAST_USED_EVERY = timedelta(minutes=1)  # one write a minute per token, not one per request


class TokenAuthentication(authentication.BaseAuthentication):
    keywords = ("token", "bearer")

    def authenticate(self, request):
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].lower().decode(errors="replace") not in self.keywords:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Invalid token header.")
        try:
            key = parts[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Invalid token header.") from None
        return self.authenticate_key(key)

    def authenticate_key(self, key: str):
        from ..models import ApiToken

        token = ApiToken.objects.select_related("user").filter(key_hash=key_hash(key)).first()
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid token.")
        now = timezone.now()
        if token.expires and token.expires <= now:
            raise exceptions.AuthenticationFailed("Token has expired.")
        if token.last_used is None or now - token.last_used >= LAST_USED_EVERY:
            ApiToken.objects.filter(pk=token.pk).update(last_used=now)
        return token.user, token

    def authenticate_header(self, request):
        return "Token"


try:  # the schema's security scheme (drf-spectacular finds extensions by subclassing)
    from drf_spectacular.extensions import OpenApiAuthenticationExtension

    class TokenScheme(OpenApiAuthenticationExtension):
        target_class = "mtc.api.auth.TokenAuthentication"
        name = "tokenAuth"

        def get_security_definition(self, auto_schema):
            return {
                "type": "apiKey",
                "in": "header",
                "name": "Authorization",
                "description": '"Token <key>" or "Bearer <key>"',
            }
except ImportError:  # pragma: no cover
    pass
