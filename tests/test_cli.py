"""`manage.py mtc ...` as a terminal user types it."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from clusters.models import Cluster

from .conftest import make_spec, sinfo_json


def run(*args) -> str:
    out = StringIO()
    call_command("mtc", *args, stdout=out)
    return out.getvalue()


@pytest.mark.slurm
def test_create_list_get_resize_delete(local_clusters, tmp_path, admin_user):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(make_spec("cli", nodes=2)))
    out = run("cluster", "create", "-f", str(spec_file), "--wait")
    assert "SUCCEEDED 100%" in out
    assert sinfo_json("cli") == {"cli-gpu-0": "idle", "cli-gpu-1": "idle"}
    listing = run("cluster", "list")
    assert "cli" in listing and "RUNNING" in listing and "2/2" in listing
    assert json.loads(run("cluster", "get", "cli"))["gpu_count"] == 16
    run("cluster", "resize", "cli", "--pool", "gpu", "--nodes", "3", "--wait")
    assert len(sinfo_json("cli")) == 3
    assert "SUCCEEDED" in run("cluster", "delete", "cli", "--wait")
    assert not Cluster.objects.exists()


@pytest.mark.django_db
def test_invalid_spec_lists_paths(tmp_path):
    spec = make_spec("cli")
    spec["node_pools"][1]["scaling_spec"]["min_node_count"] = -1
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    with pytest.raises(CommandError) as info:
        run("cluster", "create", "-f", str(spec_file))
    assert "node_pools[1].scaling_spec.min_node_count: Must be at least 0." in str(info.value)
    assert not Cluster.objects.exists()


@pytest.mark.django_db
def test_unknown_cluster_and_bad_json(tmp_path):
    with pytest.raises(CommandError, match="No cluster 'ghost'"):
        run("cluster", "get", "ghost")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(CommandError, match="Cannot read the spec"):
        run("cluster", "create", "-f", str(bad))


@pytest.mark.django_db
def test_bootstrap_uses_the_given_password(monkeypatch, django_user_model):
    monkeypatch.setenv("MTC_ADMIN_PASSWORD", "s3cret-pass")
    assert "password from MTC_ADMIN_PASSWORD" in run("bootstrap")
    assert django_user_model.objects.get(username="admin").check_password("s3cret-pass")
    assert "exists" in run("bootstrap")


@pytest.mark.django_db
def test_bootstrap_generates_and_prints_once(monkeypatch, django_user_model):
    monkeypatch.delenv("MTC_ADMIN_PASSWORD", raising=False)
    out = run("bootstrap")
    password = out.split("password ")[1].split()[0]
    assert django_user_model.objects.get(username="admin").check_password(password)
    assert password not in run("bootstrap")


def test_data_tokenize_writes_a_shard_set(tmp_path):
    """`mtc data tokenize`: the shards a pretraining run's data_path reads whole."""
    data = tmp_path / "docs.jsonl"
    data.write_text(
        "".join(json.dumps({"body": f"document {i} of the set"}) + "\n" for i in range(50))
    )
    out = run(
        "data", "tokenize", str(data), str(tmp_path / "shards"), "--field", "body", "--vocab", "300"
    )
    assert "50 documents" in out
    manifest = json.loads((tmp_path / "shards" / "shards.json").read_text())
    assert manifest["documents"] == 50 and (tmp_path / "shards" / "tokenizer.json").exists()
    with pytest.raises(CommandError, match="no column"):
        pq = pytest.importorskip("pyarrow.parquet")
        import pyarrow as pa

        pq.write_table(pa.table({"other": ["x"]}), tmp_path / "t.parquet")
        run("data", "tokenize", str(tmp_path / "t.parquet"), str(tmp_path / "o"))


def test_plan_on_a_data_dir_never_migrated_says_what_to_run_first(tmp_path):
    import os
    import subprocess
    import sys

    from django.conf import settings

    from clusters.reference_architectures import architecture_get

    spec_file = tmp_path / "a3u.json"
    spec_file.write_text(json.dumps(architecture_get("a3-ultra-pretraining").build_spec()))
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["MTC_DATA_DIR"] = str(tmp_path / "fresh")
    done = subprocess.run(
        [sys.executable, "manage.py", "mtc", "cluster", "plan", "-f", str(spec_file)],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"CommandError: mtc's database ({tmp_path / 'fresh' / 'mtc.sqlite3'}) is not set up "
        "yet: run `python manage.py migrate` (or `make run`) first."
    ], done.stderr
