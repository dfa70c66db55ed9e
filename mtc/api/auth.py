"""`Authorization: Token <key>` or `Bearer <key>` (OpenAI clients), checked by hash."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import connections, router
from django.utils import timezone
from rest_framework import authentication, exceptions

from ..tokens import key_hash

LAST_USED_EVERY = timedelta(minutes=1)  # one write a minute per token, not one per request


class TokenAuthentication(authentication.BaseAuthentication):
    keywords = ("token", "bearer")

    def authenticate(self, request):
        # The read cache (readcache.py) checked this request's token already.
        checked = getattr(getattr(request, "_request", request), "mtc_token_auth", None)
        if checked is not None:
            return checked
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

        token = token_lookup(key_hash(key))
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


class _TokenQuery:
    """``ApiToken.objects.select_related("user").get(key_hash=...)`` as one statement
    written once per database connection. Every API request runs it, and building the
    ORM query cost ~0.8 ms of CPU each time, against ~0.05 ms for the SQL itself. The
    rows become model instances as the ORM would make them: each column through its
    field's database converters (SQLite hands datetimes back as text), then from_db()."""

    def __init__(self, connection):
        from ..models import ApiToken

        qn = connection.ops.quote_name
        self.models = (ApiToken, get_user_model())
        self.fields = [list(m._meta.concrete_fields) for m in self.models]
        token_table, user_table = (qn(m._meta.db_table) for m in self.models)
        columns = [
            f"{qn(m._meta.db_table)}.{qn(f.column)}"
            for m, fields in zip(self.models, self.fields, strict=True)
            for f in fields
        ]
        user_pk = qn(self.models[1]._meta.pk.column)
        user_fk = qn(ApiToken._meta.get_field("user").column)
        key_column = qn(ApiToken._meta.get_field("key_hash").column)
        self.sql = (
            f"SELECT {', '.join(columns)} FROM {token_table}"
            f" INNER JOIN {user_table} ON ({user_table}.{user_pk} = {token_table}.{user_fk})"
            f" WHERE {token_table}.{key_column} = %s"
        )
        self.converters = []
        for m, fields in zip(self.models, self.fields, strict=True):
            for f in fields:
                col = f.get_col(m._meta.db_table)
                found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
                self.converters.append((col, found))

    def run(self, connection, digest: str):
        with connection.cursor() as cursor:
            cursor.execute(self.sql, [digest])
            row = cursor.fetchone()
        if row is None:
            return None
        values = list(row)
        for i, (col, found) in enumerate(self.converters):
            for converter in found:
                values[i] = converter(values[i], col, connection)
        split = len(self.fields[0])
        token_model, user_model = self.models
        token = token_model.from_db(
            connection.alias, [f.attname for f in self.fields[0]], values[:split]
        )
        user = user_model.from_db(
            connection.alias, [f.attname for f in self.fields[1]], values[split:]
        )
        token.user = user
        return token


_TOKEN_QUERIES: dict[tuple[str, str], _TokenQuery] = {}


def token_lookup(digest: str):
    """The ApiToken whose key_hash is ``digest``, its user loaded with it; None if none."""
    from ..models import ApiToken

    connection = connections[router.db_for_read(ApiToken)]
    cache_key = (connection.alias, connection.vendor)
    query = _TOKEN_QUERIES.get(cache_key)
    if query is None:
        query = _TOKEN_QUERIES[cache_key] = _TokenQuery(connection)
    return query.run(connection, digest)


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
