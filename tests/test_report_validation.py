"""Agents' reports checked at the door: a bad report is a 400 naming the field by its JSON
path and stores nothing, while a real agent's report (run here on an emulated node) is
taken; tokens, body size and the poller's health.json path hold the same line."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time

import pytest
from rest_framework.test import APIClient

from clusters.models import Cluster, Node, NodePool
from clusters.services import node_token_issue
from clusters.spec import validate_cluster_spec
from health import report_schema
from health.models import HealthReport, NodeFailure, Repair
from health.poll import _agent_files
from node.agent import mtc_agent

from .conftest import make_spec

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def agent_report(tmp_path_factory) -> dict:
    """One round of every check of the real agent on an emulated 2-GPU node."""
    from node.shim import install

    root = tmp_path_factory.mktemp("agent")
    install.install(root / "n", 2, "NVIDIA_H200_141GB")
    config = json.loads((root / "n" / "agent.json").read_text())
    config.update({"speed_seconds": 0.05, "speed_size": 32})
    (root / "n" / "agent.json").write_text(json.dumps(config))
    pybin = root / "pybin"
    pybin.mkdir()
    (pybin / "python3").symlink_to(os.path.realpath(sys.executable))
    proc = subprocess.run(
        [sys.executable, "-S", mtc_agent.__file__, "--node", "NODE"]
        + ["--config", str(root / "n" / "agent.json"), "--once"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{pybin}{os.pathsep}{os.environ.get('PATH', '')}"),
        timeout=120,
    )
    report = json.loads(proc.stdout.splitlines()[-1])
    assert [c["name"] for c in report["checks"]] == list(mtc_agent.CHECK_NAMES)
    return report


def fresh(template: dict, node: str) -> dict:
    report = copy.deepcopy(template)
    report.update(node=node, time=time.time())
    return report


@pytest.fixture
def nodes():
    spec = validate_cluster_spec(make_spec("rv", nodes=2))
    cluster = Cluster.objects.create(cluster_id="rv", display_name="rv", spec=spec, state="RUNNING")
    pool = NodePool.objects.create(cluster=cluster, pool_id="gpu", machine_type="local-2")
    made = []
    for i in range(2):
        node = Node.objects.create(
            cluster=cluster, pool=pool, index=i, name=f"rv-gpu-{i}", gpus=2, lifecycle="ACTIVE"
        )
        made.append((node, node_token_issue(node)))
    return made


def post(token: str, node: str, body, **extra):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    url = f"/api/v1/clusters/rv/nodes/{node}/health/report"
    if isinstance(body, bytes):
        return api.generic("POST", url, body, content_type="application/json", **extra)
    return api.post(url, body, format="json", **extra)


def assert_nothing_stored(node: Node) -> None:
    node.refresh_from_db()
    assert not HealthReport.objects.filter(node=node).exists()
    assert not NodeFailure.objects.filter(node=node).exists()
    assert not Repair.objects.filter(node=node).exists()
    assert node.last_report_time is None and node.health == "UNKNOWN"


def _set(path):
    """A mutation that sets report[path...] (a tuple of keys/indexes) to a value."""

    def apply(report, value):
        target = report
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return apply


GPU, HOST = 1, 7  # the agent's check order (CHECK_NAMES)
ECC_FINDING = {"code": "GPU_ECC_UNCORRECTABLE", "severity": "critical", "message": "m", "gpu": 0}


def _with_finding(report, **finding):
    report["checks"][0]["findings"] = [{**ECC_FINDING, **finding}]


CASES = {
    # wrong types
    "status not a string": (lambda r: _set(("checks", 0, "status"))(r, 5), "checks[0].status"),
    "time a string": (lambda r: r.update(time="now"), "time"),
    "time a bool": (lambda r: r.update(time=True), "time"),
    "checks an object": (lambda r: r.update(checks={"disk": {}}), "checks"),
    "check not an object": (lambda r: r["checks"].__setitem__(2, "ecc"), "checks[2]"),
    "details a list": (lambda r: _set(("checks", 3, "details"))(r, [1]), "checks[3].details"),
    "temperature a string": (
        lambda r: _set(("checks", GPU, "details", "telemetry", 0, "temperature_c"))(r, "hot"),
        "checks[1].details.telemetry[0].temperature_c",
    ),
    "finding gpu a string": (lambda r: _with_finding(r, gpu="0"), "checks[0].findings[0].gpu"),
    "agent_version a float": (lambda r: r.update(agent_version=1.5), "agent_version"),
    # out of range
    "temperature too hot": (
        lambda r: _set(("checks", GPU, "details", "telemetry", 1, "temperature_c"))(r, 1000),
        "checks[1].details.telemetry[1].temperature_c",
    ),
    "utilization below 0": (
        lambda r: _set(("checks", GPU, "details", "telemetry", 0, "utilization_pct"))(r, -5),
        "checks[1].details.telemetry[0].utilization_pct",
    ),
    "cpu over 100%": (
        lambda r: _set(("checks", HOST, "details", "cpu_util_pct"))(r, 250.0),
        "checks[7].details.cpu_util_pct",
    ),
    "huge integer": (
        lambda r: _set(("checks", 3, "details", "x"))(r, 10**30),
        "checks[3].details.x",
    ),
    "negative duration": (
        lambda r: _set(("checks", 4, "duration_s"))(r, -1),
        "checks[4].duration_s",
    ),
    "gpu index too big": (lambda r: _with_finding(r, gpu=5000), "checks[0].findings[0].gpu"),
    "unknown severity": (
        lambda r: _with_finding(r, severity="meh"),
        "checks[0].findings[0].severity",
    ),
    "unknown status": (lambda r: _set(("checks", 5, "status"))(r, "great"), "checks[5].status"),
    # names
    "unknown check name": (lambda r: _set(("checks", 2, "name"))(r, "bogus"), "checks[2].name"),
    "duplicate check": (lambda r: _set(("checks", 2, "name"))(r, "disk"), "checks[2].name"),
    "finding code lowercase": (
        lambda r: _with_finding(r, code="xid_13"),
        "checks[0].findings[0].code",
    ),
    "finding code too long": (
        lambda r: _with_finding(r, code="X" * 41),
        "checks[0].findings[0].code",
    ),
    "another node's name": (lambda r: r.update(node="rv-gpu-1"), "node"),
    # too many items
    "too many checks": (lambda r: r.update(checks=r["checks"] * 3), "checks"),
    "too many findings": (
        lambda r: _set(("checks", 0, "findings"))(r, [ECC_FINDING] * 65),
        "checks[0].findings",
    ),
    "too long a list in details": (
        lambda r: _set(("checks", 3, "details", "new"))(r, ["l"] * 600),
        "checks[3].details.new",
    ),
    "too deep": (
        lambda r: _set(("checks", 3, "details", "x"))(r, [[[[[[[[[["deep"]]]]]]]]]]),
        "checks[3].details.x[0][0][0][0][0][0][0]",
    ),
    # too long strings
    "finding message too long": (
        lambda r: _with_finding(r, message="m" * 5000),
        "checks[0].findings[0].message",
    ),
    "details string too long": (
        lambda r: _set(("checks", 6, "details", "algorithm"))(r, "a" * 5000),
        "checks[6].details.algorithm",
    ),
    # NUL characters (PostgreSQL stores none in text or JSON)
    "NUL in a details string": (
        lambda r: _set(("checks", 6, "details", "algorithm"))(r, "a\x00b"),
        "checks[6].details.algorithm",
    ),
    "NUL in a details key": (
        lambda r: _set(("checks", 3, "details", "k\x00"))(r, 1),
        "checks[3].details.k\x00",
    ),
    "NUL in a finding message": (
        lambda r: _with_finding(r, message="m\x00"),
        "checks[0].findings[0].message",
    ),
    # time too far from now
    "an hour old": (lambda r: r.update(time=r["time"] - 3600), "time"),
    "an hour ahead": (lambda r: r.update(time=r["time"] + 3600), "time"),
    # missing required fields
    "no node": (lambda r: r.pop("node"), "node"),
    "no time": (lambda r: r.pop("time"), "time"),
    "no checks": (lambda r: r.pop("checks"), "checks"),
    "check without name": (lambda r: r["checks"][3].pop("name"), "checks[3].name"),
    "check without status": (lambda r: r["checks"][3].pop("status"), "checks[3].status"),
    "finding without code": (
        lambda r: _set(("checks", 0, "findings"))(r, [{"message": "m"}]),
        "checks[0].findings[0].code",
    ),
    # unknown fields (the agent's report has a fixed shape; its details are free)
    "unknown top-level field": (lambda r: r.update(extra=1), "extra"),
    "unknown check field": (lambda r: _set(("checks", 1, "verdict"))(r, "ok"), "checks[1].verdict"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_bad_report_is_refused_naming_the_field_and_stores_nothing(case, nodes, agent_report):
    (bad_node, bad_token), (good_node, good_token) = nodes
    mutate, path = CASES[case]
    report = fresh(agent_report, bad_node.name)
    mutate(report)
    response = post(bad_token, bad_node.name, report)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "INVALID_ARGUMENT"
    assert path in error["fields"], error["fields"]
    assert path in error["message"]
    assert_nothing_stored(bad_node)
    # Meanwhile another node's good report (the real agent's) is taken.
    good = post(good_token, good_node.name, fresh(agent_report, good_node.name))
    assert good.status_code == 202 and good.json()["accepted"] is True


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[1, 2]", b'"a report"', b"null", b"", b'{"time": NaN}', b"\xff\xfe"],
    ids=["invalid", "list", "string", "null", "empty", "nan", "not-utf8"],
)
def test_a_body_that_is_not_a_json_object_is_refused(body, nodes):
    (node, token), _ = nodes
    response = post(token, node.name, body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "INVALID_ARGUMENT"
    assert "body" in response.json()["error"]["fields"]
    assert_nothing_stored(node)


def test_the_real_agents_report_is_valid_as_it_is(nodes, agent_report):
    (node, token), _ = nodes
    report = fresh(agent_report, node.name)
    assert report_schema.report_validate(report, node=node.name) is report
    assert tuple(report_schema.CHECK_NAMES) == tuple(mtc_agent.CHECK_NAMES)
    # A deep round (DCGM level 2-3 takes minutes to an hour) is dated when it began.
    report["time"] -= 40 * 60
    report["checks"][4]["duration_s"] = 35 * 60
    response = post(token, node.name, report)
    assert response.status_code == 202, response.content


def test_an_oversized_body_is_refused_before_it_is_read(nodes, agent_report):
    (node, token), _ = nodes
    report = fresh(agent_report, node.name)
    report["checks"][3]["details"]["pad"] = ["x" * 4000] * 80  # ~320 KiB
    response = post(token, node.name, report)
    assert response.status_code == 413
    assert response.json()["error"]["fields"] == {"body": "Larger than 262144 bytes."}
    assert_nothing_stored(node)
    # Without a Content-Length the size is checked once read, before parsing.
    with pytest.raises(report_schema.ReportInvalid) as exc:
        report_schema.body_parse(b" " * (report_schema.MAX_BODY_BYTES + 1))
    assert "body" in exc.value.fields


def test_a_wrong_or_another_nodes_token_is_refused(nodes, agent_report):
    (node, token), (other, other_token) = nodes
    report = fresh(agent_report, node.name)
    assert post("wrong", node.name, report).status_code == 401
    assert post(other_token, node.name, report).status_code == 401
    assert (
        APIClient()
        .post(f"/api/v1/clusters/rv/nodes/{node.name}/health/report", report, format="json")
        .status_code
        == 401
    )
    assert_nothing_stored(node)
    # A report for another node, even with a valid body for it, is refused too.
    assert post(token, other.name, fresh(agent_report, other.name)).status_code == 401
    assert_nothing_stored(other)


class FilesProvider:
    def __init__(self, root):
        self.root = root

    def node_dir(self, cluster, name):
        return self.root / name


def test_health_json_is_read_only_when_signed_with_the_nodes_token(nodes, agent_report, tmp_path):
    (node, token), (other, other_token) = nodes
    provider = FilesProvider(tmp_path)
    (tmp_path / node.name).mkdir()
    path = tmp_path / node.name / "health.json"
    report = fresh(agent_report, node.name)

    def files():
        node.refresh_from_db()
        return _agent_files(node.cluster, provider, [node])

    path.write_text(json.dumps(report))  # unsigned
    assert files() == 0
    path.write_text(json.dumps(mtc_agent.sign_report(report, other_token)))  # another's token
    assert files() == 0
    tampered = mtc_agent.sign_report(report, token)
    tampered["checks"][0]["findings"] = [ECC_FINDING]
    path.write_text(json.dumps(tampered))
    assert files() == 0
    bad = mtc_agent.sign_report({**report, "checks": [{"name": "bogus", "status": "pass"}]}, token)
    path.write_text(json.dumps(bad))  # signed, but not what the API would take
    assert files() == 0
    assert_nothing_stored(node)
    path.write_text(json.dumps(mtc_agent.sign_report(report, token), indent=2))
    assert files() == 1
    assert HealthReport.objects.filter(node=node).count() == 1
