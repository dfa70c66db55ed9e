"""The API read cache (mtc/api/readcache.py) against the Redis `make test` starts: what a
client sees is kept for the TTL, a write through the API is seen by the next read, and
nothing is served to another user, to a revoked token, or when Redis is gone."""

from __future__ import annotations

import secrets
import time

import pytest
from rest_framework.test import APIClient

from mtc.api import readcache
from mtc.api.readcache import moved_paths
from mtc.devstack import free_port
from mtc.models import ApiToken
from mtc.tokens import token_create

from .waiting import wait_until


@pytest.fixture
def cache_on(settings, monkeypatch):
    settings.MTC_API_READ_CACHE_SECONDS = 30
    monkeypatch.setattr(readcache, "_store", readcache._Store())  # this test's settings
    namespace = f"mtc:api:test-{secrets.token_hex(4)}"  # no other test's answers
    monkeypatch.setattr(readcache, "_namespace", lambda: namespace)
    return settings


def client_of(user) -> tuple[APIClient, str]:
    row, key = token_create(user=user, name="cli")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client, row


def get(client, path):
    response = client.get(path, HTTP_ACCEPT="application/json")
    return response.status_code, response.headers.get("X-Mtc-Cache"), response.json()


@pytest.mark.django_db
def test_a_read_is_served_again_until_a_write_to_its_path(cache_on, operator):
    client, _ = client_of(operator)
    status, first, body = get(client, "/api/v1/tokens")
    assert (status, first, [t["name"] for t in body["results"]]) == (200, "miss", ["cli"])
    assert get(client, "/api/v1/tokens")[1:] == ("hit", body)
    # A change that did not come through the API shows only after the TTL...
    token_create(user=operator, name="made-elsewhere")
    assert get(client, "/api/v1/tokens")[1:] == ("hit", body)
    # A refused write changed nothing and leaves the answer kept...
    assert client.post("/api/v1/tokens", {"name": ""}, format="json").status_code == 400
    assert get(client, "/api/v1/tokens")[1:] == ("hit", body)
    # ...and a write through the API is seen by the next read, wherever it came from.
    made = client.post("/api/v1/tokens", {"name": "made-here"}, format="json")
    assert made.status_code == 201
    status, seen, body = get(client, "/api/v1/tokens")
    assert seen == "miss"
    assert sorted(t["name"] for t in body["results"]) == ["cli", "made-elsewhere", "made-here"]


@pytest.mark.django_db
def test_the_ttl_bounds_what_a_reader_may_miss(cache_on, operator):
    cache_on.MTC_API_READ_CACHE_SECONDS = 0.3
    client, _ = client_of(operator)
    get(client, "/api/v1/tokens")
    token_create(user=operator, name="made-elsewhere")
    began = time.monotonic()
    wait_until(
        lambda: len(get(client, "/api/v1/tokens")[2]["results"]) == 2,
        timeout=5,
        what="the token made elsewhere in the list",
    )
    assert time.monotonic() - began < 2


@pytest.mark.django_db
def test_an_answer_is_never_served_to_another_user(cache_on, operator, user):
    olga, _ = client_of(operator)
    uma, _ = client_of(user)
    get(olga, "/api/v1/me")
    assert get(olga, "/api/v1/me")[1] == "hit"
    status, seen, body = get(uma, "/api/v1/me")
    assert (status, seen, body["username"]) == (200, "miss", "uma")


@pytest.mark.django_db
def test_a_revoked_token_is_refused_though_its_answer_is_kept(cache_on, operator):
    client, row = client_of(operator)
    get(client, "/api/v1/me")
    assert get(client, "/api/v1/me")[1] == "hit"
    ApiToken.objects.filter(pk=row.pk).delete()
    status, seen, body = get(client, "/api/v1/me")
    assert status == 401 and seen is None and body["error"]["code"] == "UNAUTHENTICATED"


@pytest.mark.django_db
def test_without_redis_reads_are_answered_uncached(cache_on, operator):
    cache_on.MTC_API_READ_CACHE_URL = f"redis://127.0.0.1:{free_port()}/0"
    client, _ = client_of(operator)
    for _ in range(2):
        status, seen, body = get(client, "/api/v1/me")
        assert (status, seen, body["username"]) == (200, None, "olga")
    assert client.post("/api/v1/tokens", {"name": "n"}, format="json").status_code == 201


def test_a_write_moves_its_path_and_parents_below_the_top_collection():
    assert moved_paths("/api/v1/clusters") == ["/api/v1/clusters"]
    assert moved_paths("/api/v1/clusters/c") == ["/api/v1/clusters/c", "/api/v1/clusters"]
    jobs = "/api/v1/clusters/c/jobs"
    assert moved_paths(jobs) == [jobs, "/api/v1/clusters/c"]
    assert moved_paths("/api/v1/clusters/c/jobs/7/cancel") == [
        "/api/v1/clusters/c/jobs/7/cancel",
        "/api/v1/clusters/c/jobs/7",
        "/api/v1/clusters/c/jobs",
        "/api/v1/clusters/c",
    ]
