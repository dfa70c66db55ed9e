"""Hashed API tokens: nothing usable at rest, Token and Bearer headers, expiry, the
drf_create_token command, and the migration of DRF's plain keys."""

import importlib
import io
from datetime import timedelta

from django.apps import apps
from django.core.management import call_command
from django.db import connection, models
from django.utils import timezone
from rest_framework.test import APIClient

from mtc.models import ApiToken
from mtc.tokens import key_hash, token_create

URL = "/api/v1/clusters"


def _client(header: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    return client


def test_no_row_holds_the_key_and_both_headers_work(db, user):
    row, key = token_create(user=user, name="laptop")
    stored = ApiToken.objects.values_list("prefix", "key_hash", "name").get(pk=row.pk)
    assert key not in stored and stored[1] == key_hash(key) and stored[0] == key[:8]
    assert _client(f"Token {key}").get(URL).status_code == 200
    assert _client(f"Bearer {key}").get(URL).status_code == 200
    assert ApiToken.objects.get(pk=row.pk).last_used is not None
    assert _client(f"Bearer {key}x").get(URL).status_code == 401


def test_anonymous_and_expired_get_401(db, user):
    response = APIClient().get(URL)
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Token"
    row, key = token_create(user=user, expires_days=1)
    ApiToken.objects.filter(pk=row.pk).update(expires=timezone.now() - timedelta(seconds=1))
    response = _client(f"Token {key}").get(URL)
    assert response.status_code == 401
    assert "expired" in response.json()["error"]["message"]


def test_drf_create_token_prints_a_working_key(db, user):
    out = io.StringIO()
    call_command("drf_create_token", "uma", stdout=out)
    words = out.getvalue().split()
    assert words[0:2] == ["Generated", "token"] and words[3:] == ["for", "user", "uma"]
    first = words[2]
    assert _client(f"Token {first}").get(URL).status_code == 200
    out = io.StringIO()
    call_command("drf_create_token", "-r", "uma", stdout=out)
    second = out.getvalue().split()[2]
    assert _client(f"Token {second}").get(URL).status_code == 200
    assert _client(f"Token {first}").get(URL).status_code == 401  # --reset revoked it


def test_migration_moves_a_plain_authtoken_key(transactional_db, user):
    old = "0123456789abcdef0123456789abcdef01234567"
    # DRF's table as each database spells its columns (SQLite's datetime is no PostgreSQL type).
    fields = (models.CharField(max_length=40), models.IntegerField(), models.DateTimeField())
    key, user_id, created = (field.db_type(connection) for field in fields)
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE authtoken_token (key {key} PRIMARY KEY, "
            f"user_id {user_id} NOT NULL, created {created} NOT NULL)"
        )
        cursor.execute(
            "INSERT INTO authtoken_token VALUES (%s, %s, %s)", [old, user.pk, timezone.now()]
        )
    try:
        migration = importlib.import_module("mtc.migrations.0002_move_authtoken_keys")
        with connection.schema_editor() as editor:
            migration.move_keys(apps, editor)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM authtoken_token")
            assert cursor.fetchone()[0] == 0  # the plain keys are gone
        assert ApiToken.objects.get(key_hash=key_hash(old)).user == user
        assert _client(f"Token {old}").get(URL).status_code == 200
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE authtoken_token")


def test_token_page_shows_the_key_once_and_rotate_revokes(db, client, user, operator):
    client.force_login(user)
    page = client.post("/profile/tokens/", {"action": "create", "name": "ci", "expires_days": "30"})
    assert page.status_code == 200
    token = ApiToken.objects.get(user=user, name="ci")
    key = page.context["new_key"]
    assert key.startswith(token.prefix) and key in page.content.decode()
    again = client.get("/profile/tokens/")
    assert key not in again.content.decode() and token.prefix in again.content.decode()
    assert _client(f"Token {key}").get(URL).status_code == 200

    rotated = client.post("/profile/tokens/", {"action": "rotate", "token": token.pk})
    new_key = rotated.context["new_key"]
    assert _client(f"Token {key}").get(URL).status_code == 401
    assert _client(f"Bearer {new_key}").get(URL).status_code == 200

    bad = client.post("/profile/tokens/", {"action": "create", "name": "", "expires_days": "x"})
    assert bad.status_code == 400 and "whole number of days" in bad.content.decode()

    theirs, _ = token_create(user=operator, name="ops")
    assert (
        client.post("/profile/tokens/", {"action": "revoke", "token": theirs.pk}).status_code == 404
    )
    assert ApiToken.objects.filter(pk=theirs.pk).exists()


def test_tokens_api_own_only(db, user, operator):
    api = _client(f"Token {token_create(user=user)[1]}")
    made = api.post("/api/v1/tokens", {"name": "script"}, format="json")
    assert made.status_code == 201 and len(made.json()["key"]) == 40
    listed = api.get("/api/v1/tokens").json()["results"]
    assert {t["name"] for t in listed} == {"default", "script"} and "key" not in listed[0]
    bad = api.post("/api/v1/tokens", {"name": "x", "expires_days": 0}, format="json")
    assert bad.status_code == 400 and "expires_days" in bad.json()["error"]["fields"]
    theirs, _ = token_create(user=operator)
    assert api.delete(f"/api/v1/tokens/{theirs.pk}").status_code == 404
    assert api.delete(f"/api/v1/tokens/{made.json()['id']}").status_code == 204
    assert _client(f"Token {made.json()['key']}").get(URL).status_code == 401


def test_the_token_lookup_builds_what_the_orm_would(db, user, operator):
    """mtc/api/auth.py's one-statement lookup: every field of the token and its user as
    select_related would load them (datetimes as datetimes on SQLite too)."""
    from mtc.api.auth import token_lookup

    token_create(user=operator, name="other")
    row, key = token_create(user=user, name="ci", expires_days=3)
    ApiToken.objects.filter(pk=row.pk).update(last_used=timezone.now())
    found = token_lookup(key_hash(key))
    expected = ApiToken.objects.select_related("user").get(pk=row.pk)
    for model_fields, got, want in (
        (ApiToken._meta.concrete_fields, found, expected),
        (user._meta.concrete_fields, found.user, expected.user),
    ):
        for field in model_fields:
            assert getattr(got, field.attname) == getattr(want, field.attname), field.name
    assert found.user.username == user.username and not found._state.adding
    assert token_lookup(key_hash("not-a-key")) is None
