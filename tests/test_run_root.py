"""A cluster's run root (clusters/runroot.py): where its jobs write, at the same path on
mtc's host and on the nodes. gce needs shared storage for it; local takes any path."""

import copy
from pathlib import Path

import pytest

from clusters.models import Cluster
from clusters.reference_architectures import architecture_get
from clusters.runroot import NoRunRoot, run_root
from clusters.spec import SpecError, validate_cluster_spec
from jobs.models import Job

from .conftest import make_spec


def a3u(**storage) -> dict:
    spec = copy.deepcopy(architecture_get("a3-ultra-pretraining").build_spec("a3u"))
    spec["storage"].update(storage)
    return spec


def errors(spec: dict) -> dict:
    with pytest.raises(SpecError) as info:
        validate_cluster_spec(spec)
    return info.value.fields


def test_a_gce_run_root_must_be_on_storage_every_node_mounts():
    validate_cluster_spec(a3u(run_root="/home/runs"))
    validate_cluster_spec(a3u(run_root="/mnt/lustre/mtc"))
    assert "Lustre" in errors(a3u(run_root="/srv/runs"))["storage.run_root"]
    # A bucket through gcsfuse is mounted on every node, but is no place for checkpoints.
    assert "storage.run_root" in errors(a3u(run_root="/gcs/pretraining-datasets/runs"))
    assert "storage.run_root" in errors(a3u(run_root="relative/runs"))
    assert "storage.run_root" in errors(a3u(run_root="/home/../etc"))
    # Local: any absolute path on this host.
    validate_cluster_spec(make_spec("lr", storage={"run_root": "/srv/mtc-runs"}))


def test_where_a_cluster_runs_its_jobs(settings):
    local = Cluster(cluster_id="l1", provider="local", spec=make_spec("l1"))
    assert run_root(local) == Path(settings.DATA_DIR) / "clusters" / "l1"
    named = Cluster(cluster_id="l2", spec=make_spec("l2", storage={"run_root": "/srv/r"}))
    assert run_root(named) == Path("/srv/r")
    assert run_root(Cluster(cluster_id="a3u", provider="gce", spec=a3u())) == Path("/home/.mtc")
    bare = a3u()
    del bare["storage"]
    with pytest.raises(NoRunRoot) as info:
        run_root(Cluster(cluster_id="a3u", provider="gce", spec=bare))
    assert "storage" in info.value.fields


@pytest.mark.django_db
def test_a_gce_cluster_without_shared_storage_answers_400_naming_storage(user_api):
    spec = validate_cluster_spec(a3u())
    del spec["storage"]
    Cluster.objects.create(cluster_id="a3u", provider="gce", spec=spec, state="RUNNING")
    launch = user_api.post(
        "/api/v1/clusters/a3u/recipes/llama-pretrain/launch",
        {"nodes": 2, "overrides": {"steps": 4}, "dry_run": True},
        format="json",
    )
    assert launch.status_code == 400, launch.content
    assert "storage" in launch.json()["error"]["fields"]
    submit = user_api.post(
        "/api/v1/clusters/a3u/jobs",
        {"name": "t", "script": "#!/bin/bash\ntrue\n", "nodes": 1},
        format="json",
    )
    assert submit.status_code == 400, submit.content
    assert "shared run root" in submit.json()["error"]["fields"].get("storage", ""), submit.json()
    assert not Job.objects.exists()
