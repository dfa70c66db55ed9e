"""What a hostile tenant's job can do to mtc's control plane from this host, and what
their browser can do to sign-in and the API: Redis refuses an account without mtc's
credentials, a planted read-cache entry is ignored, the API rate limit answers 429 with
Retry-After, and 20 wrong passwords lock out one username from one address only, until
an operator unlocks it."""

from __future__ import annotations

import secrets
import subprocess
from io import StringIO
from urllib.parse import urlparse

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

from identity.runas import run_as
from identity.services import account_ensure
from mtc.api import readcache
from mtc.redisconn import redis_client
from mtc.tokens import token_create

from ..unix import spare_uids

pytestmark = [pytest.mark.security, pytest.mark.django_db]

REDIS_PROBE = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
for command in (b"PING", b"AUTH default x", b"AUTH mtc wrong", b"KEYS *", b"CLIENT LIST"):
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(command + b"\\r\\n")
        print(command.decode(), "->", s.recv(200).decode().strip())
"""


def test_a_job_that_reaches_redis_cannot_authenticate_or_read_the_password(local_identity, user):
    account = account_ensure(user=user)
    url = urlparse(django_settings.REDIS_URL)
    assert url.password, "make test starts Redis with a password (scripts/test.sh)"
    # A uid outside the jobs' range, which the firewall (mtc/firewall.py) lets through:
    # the path opened on purpose, as if a job had found a way past it.
    outsider = spare_uids()
    done = subprocess.run(
        ["/usr/bin/python3", "-c", REDIS_PROBE, url.hostname, str(url.port)],
        user=outsider,
        group=outsider,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 5, done.stderr
    assert all("-NOAUTH" in line or "-WRONGPASS" in line for line in lines), lines
    for secret in (django_settings.DATA_DIR / "redis_password",):
        if secret.exists():
            read = run_as(account, ["cat", str(secret)], capture_output=True, text=True)
            assert read.returncode != 0 and "Permission denied" in read.stderr


def test_a_read_cache_entry_planted_in_redis_is_ignored(settings, monkeypatch, operator):
    settings.MTC_API_READ_CACHE_SECONDS = 30
    monkeypatch.setattr(readcache, "_store", readcache._Store())
    namespace = f"mtc:api:test-{secrets.token_hex(4)}"
    monkeypatch.setattr(readcache, "_namespace", lambda: namespace)
    _, key = token_create(user=operator, name="cli")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    first = client.get("/api/v1/tokens", HTTP_ACCEPT="application/json")
    assert first.headers["X-Mtc-Cache"] == "miss"
    redis = redis_client(settings.REDIS_URL)
    keys = list(redis.scan_iter(f"{namespace}:r:*"))
    assert len(keys) == 1
    generation = redis.get(readcache._generation_key(namespace, "/api/v1/tokens")) or b"-"
    forged = b'{"g": "%s", "s": 200, "h": [["Content-Type", "application/json"]]}\n' % generation
    forged += b'{"results": [{"name": "FORGED BY A JOB"}]}'
    redis.set(keys[0], forged, px=30000)  # unsigned, as whoever got into Redis would
    again = client.get("/api/v1/tokens", HTTP_ACCEPT="application/json")
    assert again.headers["X-Mtc-Cache"] == "miss"
    assert "FORGED" not in again.content.decode()
    assert (
        client.get("/api/v1/tokens", HTTP_ACCEPT="application/json").headers["X-Mtc-Cache"] == "hit"
    )


def test_the_api_rate_limit_answers_429_with_retry_after(settings, operator, user):
    settings.MTC_API_RATE_PER_MINUTE = 5
    busy, calm = APIClient(), APIClient()
    busy.credentials(HTTP_AUTHORIZATION=f"Token {token_create(user=operator, name='a')[1]}")
    calm.credentials(HTTP_AUTHORIZATION=f"Token {token_create(user=user, name='b')[1]}")
    answers = [busy.get("/api/v1/clusters").status_code for _ in range(6)]
    assert answers[:5] == [200] * 5 and answers[5] == 429, answers
    refused = busy.get("/api/v1/clusters")
    assert refused.json()["error"]["code"] == "RESOURCE_EXHAUSTED"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert calm.get("/api/v1/clusters").status_code == 200  # another caller's own count


def sign_in(address: str, username: str, password: str):
    return Client(REMOTE_ADDR=address).post(
        "/accounts/login/", {"username": username, "password": password}
    )


def test_twenty_wrong_passwords_lock_out_that_user_and_address_until_an_operator_unlocks(
    django_user_model,
):
    name = f"lock{secrets.token_hex(3)}"
    django_user_model.objects.create_user(name, password="right-password-1")
    try:
        for _ in range(19):
            assert sign_in("10.9.0.1", name, "wrong").status_code == 200  # the form again
        assert sign_in("10.9.0.1", name, "wrong").status_code == 429  # the 20th locks
        locked = sign_in("10.9.0.1", name, "right-password-1")
        assert locked.status_code == 429
        assert "Sign-in locked" in locked.content.decode()
        # Another address still signs in: a tenant cannot lock an operator out.
        assert sign_in("10.9.0.2", name, "right-password-1").status_code == 302
        call_command("axes_reset_username", name, stdout=StringIO())  # the operator
        assert sign_in("10.9.0.1", name, "right-password-1").status_code == 302
    finally:
        call_command("axes_reset_username", name, stdout=StringIO())
