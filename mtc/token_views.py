"""The token page (/profile/tokens/) and /api/v1/tokens: own tokens only; a new key is
shown once, in the response that made it."""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from .api.errors import ApiError
from .tokens import token_create, token_revoke, token_rotate, tokens_of


def _parse(data) -> tuple[str, int | None, dict[str, str]]:
    name = str(data.get("name") or "").strip()
    errors = {}
    # Control characters have no place in a name (and PostgreSQL refuses NUL in text).
    if not name or len(name) > 100 or any(ord(c) < 32 or c == "\x7f" for c in name):
        errors["name"] = "Give a name of 1 to 100 characters, none of them control characters."
    raw = data.get("expires_days")
    days = None
    if raw not in (None, ""):
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


class TokenListView(APIView):
    def get(self, request):
        return Response({"results": [_body(t) for t in tokens_of(user=request.user)]})

    def post(self, request):
        name, days, errors = _parse(request.data)
        if errors:
            raise ApiError(code="INVALID_ARGUMENT", message="Invalid token.", fields=errors)
        token, key = token_create(user=request.user, name=name, expires_days=days)
        return Response({**_body(token), "key": key}, status=status.HTTP_201_CREATED)


class TokenDetailView(APIView):
    def delete(self, request, token_id: int):
        if not token_revoke(user=request.user, token_id=token_id):
            raise Http404
        return Response(status=status.HTTP_204_NO_CONTENT)
