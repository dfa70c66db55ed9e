"""The token page (/profile/tokens/) and /api/v1/tokens: own tokens only; a new key is
shown once, in the response that made it."""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from .api.errors import ApiError
from .api.schema import errors
from .tokens import token_create, token_revoke, token_rotate, tokens_of


def _parse(data, *, json: bool = False) -> tuple[str, int | None, dict[str, str]]:
    """A form's fields are strings; a JSON body's name is a string and expires_days a
    whole number (as the schema says), nothing else."""
    if json and not isinstance(data, dict):
        return "", None, {"non_field_errors": "The body must be a JSON object."}
    if json and not isinstance(data.get("name"), str):
        return "", None, {"name": "Must be a string."}
    name = str(data.get("name") or "").strip()
    errors = {}
    # Control characters have no place in a name (and PostgreSQL refuses NUL in text).
    if not name or len(name) > 100 or any(ord(c) < 32 or c == "\x7f" for c in name):
        errors["name"] = "Give a name of 1 to 100 characters, none of them control characters."
    raw = data.get("expires_days")
    days = None
    if json and raw is not None and (isinstance(raw, bool) or not isinstance(raw, int)):
        errors["expires_days"] = "Must be a whole number of days from 1 to 3650."
    elif raw not in (None, ""):
        try:
            days = int(raw)
        except (TypeError, ValueError):
            days = 0
        if not 1 <= days <= 3650:
            errors["expires_days"] = "Must be a whole number of days from 1 to 3650."
    return name, days, errors


@require_http_methods(["GET", "POST"])
def token_page(request):
    new_key, errors = None, {}
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "create":
            name, days, errors = _parse(request.POST)
            if not errors:
                new_key = token_create(user=request.user, name=name, expires_days=days)[1]
        elif action in ("rotate", "revoke"):
            try:
                token_id = int(request.POST.get("token", ""))
            except ValueError:
                raise Http404 from None
            if action == "revoke":
                if not token_revoke(user=request.user, token_id=token_id):
                    raise Http404
                return redirect("token_page")
            made = token_rotate(user=request.user, token_id=token_id)
            if made is None:
                raise Http404
            new_key = made[1]
    context = {"tokens": tokens_of(user=request.user), "new_key": new_key, "errors": errors}
    return render(request, "mtc/tokens.html", context, status=400 if errors else 200)


def _body(token) -> dict:
    return {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "created": token.created,
        "expires": token.expires,
        "last_used": token.last_used,
    }


class TokenSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="The key's first characters, to tell keys apart")
    created = serializers.DateTimeField()
    expires = serializers.DateTimeField(allow_null=True)
    last_used = serializers.DateTimeField(allow_null=True)


class NewTokenSerializer(TokenSerializer):
    key = serializers.CharField(help_text="Shown once: send it as Authorization: Token <key>")


class TokenListSerializer(serializers.Serializer):
    results = TokenSerializer(many=True)


class TokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    expires_days = serializers.IntegerField(
        min_value=1, max_value=3650, required=False, allow_null=True, help_text="Default: never"
    )


class TokenListView(APIView):
    @extend_schema(operation_id="tokens_list", responses={200: TokenListSerializer})
    def get(self, request):
        return Response({"results": [_body(t) for t in tokens_of(user=request.user)]})

    @extend_schema(
        operation_id="tokens_create",
        request=TokenCreateSerializer,
        responses={201: NewTokenSerializer},
    )
    def post(self, request):
        name, days, problems = _parse(request.data, json=True)
        if problems:
            raise ApiError(code="INVALID_ARGUMENT", message="Invalid token.", fields=problems)
        token, key = token_create(user=request.user, name=name, expires_days=days)
        return Response({**_body(token), "key": key}, status=status.HTTP_201_CREATED)


class TokenDetailView(APIView):
    @extend_schema(operation_id="tokens_delete", responses={204: None, **errors(404)})
    def delete(self, request, token_id: int):
        if not token_revoke(user=request.user, token_id=token_id):
            raise Http404
        return Response(status=status.HTTP_204_NO_CONTENT)
