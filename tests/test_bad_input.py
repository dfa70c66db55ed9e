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


# Each input a user found answering 500 (or passing when it should not): a 400 naming the
# field, and nothing made.
@pytest.fixture
def bi_cluster(db):
    from clusters.spec import validate_cluster_spec

    spec = validate_cluster_spec(make_spec("bi", nodes=2))
    return Cluster.objects.create(cluster_id="bi", spec=spec, state="RUNNING")


@pytest.mark.parametrize("array", ["0-10:0", "0-10:-1", "²", "0-²", "1-0", "0-99999999999"])
def test_a_bad_job_array_is_a_400(bi_cluster, user_api, array):
    response = user_api.post(
        "/api/v1/clusters/bi/jobs",
        {"name": "a", "script": "#!/bin/bash\n", "array": array},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "array" in error(response)["fields"]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "raw, field",
    [
        ('{"overrides": {"steps": 1%s}}' % ("0" * 400), "overrides.steps"),
        ('{"overrides": {"lr": 1e999}}', "overrides.lr"),
        ('{"overrides": {"steps": "²"}}', "overrides.steps"),
        ('{"nodes": "²"}', "nodes"),
        ('{"nodes": 1%s}' % ("0" * 400), "nodes"),
    ],
)
def test_huge_or_odd_recipe_numbers_are_a_400(bi_cluster, user_api, raw, field):
    response = user_api.generic(
        "POST",
        "/api/v1/clusters/bi/recipes/llama-pretrain/launch",
        raw,
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    assert field in error(response)["fields"], error(response)
    assert not Job.objects.exists()


def test_nan_is_not_json(bi_cluster, user_api):
    response = user_api.generic(
        "POST",
        "/api/v1/clusters/bi/recipes/llama-pretrain/launch",
        '{"overrides": {"lr": NaN}}',
        content_type="application/json",
    )
    assert response.status_code == 400 and error(response)["code"] == "PARSE_ERROR"


def test_unicode_digits_in_query_numbers_are_a_400(bi_cluster, user, user_api):
    job = Job.objects.create(cluster=bi_cluster, job_number=7, name="j", owner=user)
    response = user_api.get(f"/api/v1/clusters/bi/jobs/{job.job_number}/output?offset=²")
    assert response.status_code == 400 and "offset" in error(response)["fields"]
    response = user_api.get("/api/v1/clusters?page=²")
    assert response.status_code in (200, 400, 404), response.content
    assert response["Content-Type"].startswith("application/json")


def test_unicode_digits_in_an_endpoint_are_a_400(bi_cluster, user_api):
    from registry.models import Model
    from serving.deploy import _int, version_resolve

    body = {"model": "m", "cluster": "bi", "min_replicas": "²"}
    response = user_api.post("/api/v1/endpoints", body, format="json")
    assert response.status_code == 400 and "min_replicas" in error(response)["fields"]
    errors: dict = {}
    assert _int({"n": "²"}, "n", errors, default=1, low=0, high=9) == 1 and "n" in errors
    Model.objects.create(name="m")
    errors = {}
    assert version_resolve("m", "²", errors) == (None, "") and "version" in errors


def test_endpoint_metrics_window_in_unicode_digits_is_a_400(db, user_api):
    response = user_api.get("/api/v1/endpoints/1/metrics?window=²")
    assert response.status_code == 400 and "window" in error(response)["fields"]


def test_json_nested_100k_deep_is_a_400(db, operator_api):
    raw = "[" * 100_000 + "]" * 100_000
    for path in ("/api/v1/clusters", "/api/v1/clusters/bi/jobs", "/api/v1/endpoints"):
        response = operator_api.generic("POST", path, raw, content_type="application/json")
        assert response.status_code in (400, 404), (path, response.status_code)
        assert error(response)["code"]
    assert not Cluster.objects.exists()


def test_nul_in_a_reservation_key_is_a_400(db, operator_api):
    from clusters.reference_architectures import architecture_list

    arch = next(a for a in architecture_list() if "reservation" in json_text(a.build_spec("rk")))
    spec = arch.build_spec("rk")
    text = json_text(spec).replace("a3u-reservation", "a3u\\u0000reservation")
    response = operator_api.generic(
        "POST", "/api/v1/clusters", text, content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert any("reservation" in f for f in error(response)["fields"]), error(response)
    assert not Cluster.objects.exists()


def test_a_model_reference_in_unicode_digits_is_not_a_version_number():
    from registry.names import model_ref_parse

    assert model_ref_parse("models/foo@3") == ("foo", 3)
    parsed = model_ref_parse("models/foo@²")
    assert parsed is None or parsed[1] == "²"


def json_text(value) -> str:
    import json

    return json.dumps(value)


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


@pytest.mark.parametrize("path", ["/api/v1/clusters", "/api/v1/endpoints", "/api/v1/tokens"])
def test_a_body_over_the_limit_is_a_413_in_the_error_shape(db, operator_api, settings, path):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
    body = b'{"name": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    response = operator_api.generic("POST", path, body, content_type="application/json")
    assert response.status_code == 413, response.content
    error = response.json()["error"]
    assert error["code"] == "PAYLOAD_TOO_LARGE" and "1048576 bytes" in error["message"]
