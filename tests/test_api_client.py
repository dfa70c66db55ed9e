"""A client generated from /api/schema/ (openapi-python-client, into a tmp dir during the
test, so it cannot go stale) drives a live server: create a cluster (real local Slurm),
submit a job, read its output, delete the cluster. Its models parse every answer, so a
schema that lies about a body fails here."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from clusters.models import Cluster
from mtc.tokens import token_create

from .conftest import make_spec
from .waiting import job_wait_state

pytestmark = pytest.mark.slurm
PACKAGE = "mtc_api_client"  # openapi-python-client's name for the "mtc API" title


@pytest.fixture
def generated(live_server, tmp_path):
    with urllib.request.urlopen(f"{live_server.url}/api/schema/?format=json") as answer:
        schema = json.load(answer)
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    tool = Path(sys.executable).parent / "openapi-python-client"
    command = ["generate", "--path", "schema.json", "--meta", "none", "--output-path", PACKAGE]
    done = subprocess.run(
        [str(tool), *command],
        cwd=tmp_path,
        env={**os.environ, "PATH": f"{tool.parent}:{os.environ['PATH']}"},  # its ruff hooks
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout, done.stdout  # every schema it could model
    sys.path.insert(0, str(tmp_path))
    try:
        yield lambda name: importlib.import_module(f"{PACKAGE}.{name}")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def test_generated_client_creates_submits_reads_output_and_deletes(
    generated, live_server, local_clusters, operator
):
    client = generated("client").AuthenticatedClient(
        base_url=live_server.url, token=token_create(user=operator)[1], prefix="Token"
    )
    models = generated("models")
    create = generated("api.clusters.clusters_create")
    operation = create.sync(
        client=client, body=models.ClusterSpecRequest.from_dict(make_spec("gc", nodes=1))
    )
    assert isinstance(operation, models.Operation), operation
    retrieve_op = generated("api.operations.operations_retrieve")
    operation = retrieve_op.sync(id=operation.id, client=client)
    assert operation.state == "SUCCEEDED" and operation.done, operation

    cluster = generated("api.clusters.clusters_retrieve").sync(cluster_id="gc", client=client)
    assert cluster.state == "RUNNING" and cluster.node_count == 1

    submit = generated("api.jobs.jobs_submit")
    job = submit.sync(
        cluster_id="gc",
        client=client,
        body=models.JobSubmitRequest(name="hello", script="#!/bin/bash\necho hello-client\n"),
    )
    assert isinstance(job, models.Job), job
    assert job.end_time is None  # nullable, as the schema says
    job_wait_state(Cluster.objects.get(cluster_id="gc"), job.job_id, {"COMPLETED"})

    detail = generated("api.jobs.jobs_retrieve").sync(
        cluster_id="gc", job_id=job.job_id, client=client
    )
    assert detail.state == "COMPLETED" and detail.end_time is not None
    output = generated("api.jobs.jobs_output").sync(
        cluster_id="gc", job_id=job.job_id, client=client
    )
    assert isinstance(output, models.JobOutput), output
    assert output.data == "hello-client\n" and output.eof

    # An error answer parses as the one Error shape.
    missing = generated("api.jobs.jobs_retrieve").sync(
        cluster_id="gc", job_id="999999", client=client
    )
    assert isinstance(missing, models.Error) and missing.error.code == "NOT_FOUND"

    pages = generated("api.clusters.clusters_list").sync(client=client)
    assert [c.cluster_id for c in pages.results] == ["gc"] and pages.count == 1

    deleted = generated("api.clusters.clusters_delete").sync(cluster_id="gc", client=client)
    assert retrieve_op.sync(id=deleted.id, client=client).state == "SUCCEEDED"
    assert not Cluster.objects.filter(cluster_id="gc").exists()
