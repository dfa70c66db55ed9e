"""Bad input and failures on the API answer in its own JSON shape: 400 naming the
field, 404 for unknown paths whatever the method, 500 (never an HTML page) for a bug."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from clusters.models import Cluster
from jobs.models import Job

from .conftest import make_spec

SEPARATORS = ["\n", "\u2028", "\u2029", "\x85", "\x00"]


def error(response) -> dict:
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    return response.json()["error"]


@pytest.mark.parametrize("method", ["get", "post", "put", "patch", "delete"])
def test_unknown_api_paths_are_a_json_404_for_every_method(db, user, method):
    client = Client(enforce_csrf_checks=True)  # a browser session, no CSRF token
    client.force_login(user)
    response = getattr(client, method)("/api/v1/no-such-thing/42")
    assert response.status_code == 404 and error(response)["code"] == "NOT_FOUND"
    response = getattr(APIClient(), method)("/api/v1/clusters/x/nowhere")
    assert response.status_code in (401, 404) and error(response)["code"]


def test_a_session_post_without_csrf_is_a_json_403(db, user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post(
        "/api/v1/clusters/none/jobs", {"name": "x"}, content_type="application/json"
    )
    assert response.status_code == 403 and error(response)["code"] == "PERMISSION_DENIED"


def test_a_bug_in_an_api_view_is_a_json_500(db, user, monkeypatch):
    from clusters import selectors

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(selectors, "cluster_list", broken)
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(user)
    response = client.get("/api/v1/clusters")
    assert response.status_code == 500
    assert error(response) == {
        "code": "INTERNAL",
        "message": "The server failed on this request; the error is logged.",
        "fields": {},
    }


@pytest.mark.parametrize("separator", SEPARATORS)
def test_separators_in_a_job_name_or_env_value_are_refused(db, user_api, separator):
    Cluster.objects.create(cluster_id="bi", spec=make_spec("bi", nodes=1), state="RUNNING")
    response = user_api.post(
        "/api/v1/clusters/bi/jobs",
        {"name": f"a{separator}b", "script": "#!/bin/bash\n", "env": {"X": f"1{separator}2"}},
        format="json",
    )
    assert response.status_code == 400
    assert {"name", "env.X"} <= set(error(response)["fields"])
    assert not Job.objects.exists()


@pytest.mark.parametrize("separator", SEPARATORS)
def test_separators_in_a_cluster_spec_string_are_refused(db, operator_api, separator):
    spec = make_spec("sep", nodes=1, display_name=f"demo{separator}two")
    response = operator_api.post("/api/v1/clusters", spec, format="json")
    assert response.status_code == 400
    assert "display_name" in error(response)["fields"]
    assert not Cluster.objects.exists()


def test_a_cluster_id_with_a_trailing_newline_is_refused(db, operator_api):
    response = operator_api.post("/api/v1/clusters", make_spec("demo\n", nodes=1), format="json")
    assert response.status_code == 400
    assert "cluster_id" in error(response)["fields"]
    assert not Cluster.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/models/m%00",  # a lookup by name
        "/api/v1/models?q=a%00b",  # a search
        "/api/v1/clusters?state=RUNNING&x%00=1",  # a parameter's name
    ],
)
def test_a_nul_in_an_api_url_is_a_400(db, user_api, url):
    response = user_api.get(url)
    assert response.status_code == 400 and error(response)["code"] == "INVALID_ARGUMENT"


@pytest.mark.parametrize("url", ["/models/?q=a%00b", "/clusters/?q=%00", "/clusters/x%00/"])
def test_a_nul_in_a_page_url_is_a_400(db, client, user, url):
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 400 and b"NUL" in response.content


def test_a_token_name_with_a_nul_or_control_character_is_refused(db, user_api, user, client):
    from mtc.models import ApiToken

    for name in ["a\x00b", "line\nbreak"]:
        response = user_api.post("/api/v1/tokens", {"name": name}, format="json")
        assert response.status_code == 400 and "name" in error(response)["fields"]
    client.force_login(user)
    page = client.post("/profile/tokens/", {"action": "create", "name": "a\x00b"})
    assert page.status_code == 400
    assert not ApiToken.objects.filter(user=user).exists()
