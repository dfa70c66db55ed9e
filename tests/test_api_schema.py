"""The OpenAPI schema tells the truth: conventions every operation keeps (a tag, an
operation id like jobs_submit, JSON bodies only, its error statuses with the Error
shape), and schemathesis against a live server finds no server error and no response
that breaks the schema (README, "API schema", has the long run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from drf_spectacular.generators import SchemaGenerator

from clusters.services import cluster_create
from mtc.tokens import token_create

from .conftest import make_spec

OPERATION_ID = re.compile(r"^[a-z]+_[a-z_]+$")
METHODS = {"get", "post", "put", "patch", "delete"}
ERROR_REF = "#/components/schemas/Error"


def operations(schema: dict):
    for path, item in schema["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield path, method, op


@pytest.fixture(scope="module")
def schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def test_every_operation_has_a_tag_and_a_readable_unique_id(schema):
    ids = []
    for path, method, op in operations(schema):
        assert len(op.get("tags", [])) == 1, (method, path)
        assert OPERATION_ID.fullmatch(op["operationId"]), (method, path, op["operationId"])
        ids.append(op["operationId"])
    assert len(ids) == len(set(ids)) > 40
    declared = {tag["name"] for tag in schema["tags"]}
    assert {op["tags"][0] for _, _, op in operations(schema)} <= declared
    names = set(ids)
    for expected in ("clusters_list", "clusters_create", "jobs_submit", "jobs_cancel"):
        assert expected in names


def test_every_error_status_is_documented_with_the_error_shape(schema):
    for path, method, op in operations(schema):
        responses = op["responses"]
        codes = {int(code) for code in responses}
        if op.get("security") != [{}]:  # the agent's report documents its own 401
            assert 401 in codes, (method, path)
        if "{" in path:
            assert 404 in codes, (method, path)
        if "requestBody" in op:
            assert {400, 415} <= codes, (method, path)
        for code, response in responses.items():
            if int(code) >= 400:
                body = response["content"]["application/json"]["schema"]
                assert body == {"$ref": ERROR_REF}, (method, path, code)
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]


def test_request_bodies_are_json_only_and_typed(schema):
    for path, method, op in operations(schema):
        if "requestBody" not in op:
            continue
        content = op["requestBody"]["content"]
        assert list(content) == ["application/json"], (method, path)
        if op["operationId"] != "health_report":  # the agent's report: node/report.py
            assert "$ref" in content["application/json"]["schema"], (method, path)


def test_the_cluster_list_is_a_page_and_nullable_fields_say_so(schema):
    components = schema["components"]["schemas"]
    ok = schema["paths"]["/api/v1/clusters"]["get"]["responses"]["200"]
    page = ok["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(components[page]["properties"]) == {"count", "next", "previous", "results"}
    job = components["Job"]["properties"]
    for field in ("end_time", "start_time", "array_task_id", "owner"):
        assert job[field].get("nullable") is True, field
    assert components["Operation"]["properties"]["end_time"].get("nullable") is True


def schemathesis_run(url: str, token: str, *, examples: int, extra: list[str]) -> str:
    """schemathesis's CLI against the live server: all phases but the stateful one,
    positive and negative data. Returns its output; fails on any failed check."""
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "run",
        f"{url}/api/schema/",
        "--header",
        f"Authorization: Token {token}",
        "--phases",
        "examples,coverage,fuzzing",
        "--mode",
        "all",
        "--max-examples",
        str(examples),
        "--seed",
        "1",
        "--workers",
        "1",
        "--request-timeout",
        "30",
        # positive_data_acceptance: the spec's cross-field rules (a partition names an
        # existing pool) and Slurm's (a partition exists) are beyond JSON Schema.
        "--exclude-checks",
        "positive_data_acceptance",
        "--suppress-health-check",
        "all",
        *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    if os.environ.get("MTC_SCHEMATHESIS_LOG"):  # the whole report, for a long run
        with open(os.environ["MTC_SCHEMATHESIS_LOG"], "a") as log:
            log.write(output)
    assert done.returncode == 0, output[-12000:]
    return output


@pytest.mark.slurm  # cluster-scoped operations meet a real (local) cluster
def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    live_server, local_clusters, operator
):
    # A real one-node cluster, so job operations reach Slurm (the run's own DELETEs may
    # remove it; local_clusters stops whatever is left).
    cluster_create(spec=make_spec("demo", nodes=1))
    examples = int(os.environ.get("MTC_SCHEMATHESIS_EXAMPLES", "3"))
    token = token_create(user=operator)[1]
    # Revoking tokens goes last: fuzzing learns the run's own token id from GET /tokens,
    # and with it revoked midway the rest of the run would only see 401s.
    last = ["--include-operation-id", "tokens_delete"]
    output = schemathesis_run(
        live_server.url, token, examples=examples, extra=["--exclude-operation-id", "tokens_delete"]
    )
    assert "Authentication failed" not in output, output[-6000:]
    output += schemathesis_run(live_server.url, token, examples=examples, extra=last)
    print(output[-6000:])
