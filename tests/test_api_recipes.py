"""The recipe catalog and launch API (rendering and validation; runs are in
test_recipes_e2e.py)."""

import json
import os
from pathlib import Path

import pytest

from clusters.models import Cluster
from clusters.spec import validate_cluster_spec
from jobs.models import Job
from recipes.catalog import RECIPES

from .conftest import make_spec
from .unix import give


@pytest.fixture
def cluster(db):
    spec = validate_cluster_spec(make_spec("rc", nodes=2))
    return Cluster.objects.create(cluster_id="rc", spec=spec, state="RUNNING")


def test_catalog_lists_every_recipe_with_typed_parameters(user_api):
    body = user_api.get("/api/v1/recipes").json()
    ids = [r["id"] for r in body["results"]]
    assert ids == ["llama-pretrain", "gemma-pretrain", "continued-pretrain", "sft", "rl"]
    llama = body["results"][0]
    steps = next(p for p in llama["parameters"] if p["name"] == "steps")
    assert steps == {
        "name": "steps",
        "type": "int",
        "default": 60,
        "minimum": 1,
        "maximum": 10_000_000,
        "help": "Optimizer steps.",
        "required": False,
    }
    init = next(p for p in body["results"][2]["parameters"] if p["name"] == "init_from")
    assert init["required"] is True


def test_dry_run_shows_the_script_and_submits_nothing(cluster, user_api):
    response = user_api.post(
        "/api/v1/clusters/rc/recipes/llama-pretrain/launch",
        {"nodes": 2, "overrides": {"steps": 30, "checkpoint_interval": 10}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["parameters"]["steps"] == 30 and body["parameters"]["model"] == "tiny"
    script = body["script"]
    assert script.startswith("#!/bin/bash\n# mtc recipe llama-pretrain")
    assert "torch.distributed.run" in script and "node.train.train" in script
    assert "srun --ntasks-per-node=1" in script
    assert body["run_config"]["precision"] == "fp32"  # emulated GPUs: CPU training
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"steps": 0}, "overrides.steps"),
        ({"steps": "many"}, "overrides.steps"),
        ({"model": "gpt-5"}, "overrides.model"),
        ({"lr": 5}, "overrides.lr"),
        ({"data_path": "../../etc/passwd"}, "overrides.data_path"),
        ({"data_path": "/data/$(id)"}, "overrides.data_path"),
        ({"colour": "blue"}, "overrides.colour"),
    ],
)
def test_bad_overrides_name_the_parameter(cluster, user_api, overrides, field):
    response = user_api.post(
        "/api/v1/clusters/rc/recipes/llama-pretrain/launch", {"overrides": overrides}, format="json"
    )
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert not Job.objects.exists()


def test_micro_batch_must_split_every_ranks_share_evenly(cluster, user_api):
    body = {"nodes": 2, "overrides": {"global_batch": 3, "micro_batch": 1}}
    response = user_api.post("/api/v1/clusters/rc/recipes/sft/launch", body, format="json")
    assert response.status_code == 400
    message = response.json()["error"]["fields"]["overrides.micro_batch"]
    assert "multiple of 2" in message
    assert not Job.objects.exists()


def test_continued_pretrain_needs_a_checkpoint(cluster, user_api):
    response = user_api.post(
        "/api/v1/clusters/rc/recipes/continued-pretrain/launch", {}, format="json"
    )
    assert response.json()["error"]["fields"] == {
        "overrides.init_from": "This parameter is required."
    }


def test_bad_job_options_and_unknown_recipe(cluster, user_api):
    response = user_api.post(
        "/api/v1/clusters/rc/recipes/sft/launch", {"nodes": 99, "partition": "nope"}, format="json"
    )
    assert set(response.json()["error"]["fields"]) == {"nodes", "partition"}
    missing = user_api.post("/api/v1/clusters/rc/recipes/nope/launch", {}, format="json")
    assert missing.status_code == 404


def test_every_recipe_validates_its_defaults():
    for recipe in RECIPES.values():
        if recipe.param("init_from") and recipe.param("init_from").required:
            continue
        clean = recipe.validate({})
        assert clean["model"] == "tiny"


def test_launch_writes_run_config_and_records_the_recipe(cluster, user_api, monkeypatch):
    from slurm import client

    seen = {}

    def fake_submit(self, args, script, env, **kwargs):  # the Slurm boundary
        seen.update(args=args, script=script)
        return "41"

    monkeypatch.setattr(client.SlurmClient, "submit", fake_submit)
    response = user_api.post(
        "/api/v1/clusters/rc/recipes/rl/launch",
        {"nodes": 1, "overrides": {"steps": 12, "group_size": 8, "ppo_epochs": 2}},
        format="json",
    )
    assert response.status_code == 201, response.content
    job = Job.objects.get(job_id="41")
    assert job.recipe == "rl" and job.parameters["group_size"] == 8
    run_dir = Path(job.checkpoint_dir).parent
    config = json.loads((run_dir / "run.json").read_text())
    assert config["recipe"] == "rl" and config["rl"]["group_size"] == 8
    assert config["rl"]["ppo_epochs"] == 2 and "ppo_epochs" not in config
    assert config["run_dir"] == str(run_dir) and "group_size" not in config
    assert "--requeue" in seen["args"] and str(run_dir / "run.json") in seen["script"]


@pytest.mark.parametrize(
    "value, message", [(0, "Must be at least 1."), (1.5, "Must be a whole number.")]
)
def test_ppo_epochs_is_a_whole_number_from_1(cluster, user_api, value, message):
    response = user_api.post(
        "/api/v1/clusters/rc/recipes/rl/launch",
        {"overrides": {"ppo_epochs": value}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"overrides.ppo_epochs": message}


def test_null_overrides_only_where_the_default_is_none(cluster, user_api):
    response = user_api.post(
        "/api/v1/clusters/rc/recipes/llama-pretrain/launch",
        {"overrides": {"steps": None, "data_path": None}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"overrides.steps": "Must not be null."}


def test_a_refused_submission_leaves_no_run_directory(cluster, user_api, monkeypatch, settings):
    from slurm import SlurmError, client

    def refuse(self, args, script, env, **kwargs):
        raise SlurmError("Invalid partition name specified", permanent=True)

    monkeypatch.setattr(client.SlurmClient, "submit", refuse)
    runs = settings.DATA_DIR / "clusters" / "rc" / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    response = user_api.post("/api/v1/clusters/rc/recipes/llama-pretrain/launch", {}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "SLURM_REJECTED"
    assert (set(runs.iterdir()) if runs.exists() else set()) == before


# --- paths a user names are checked as that user ---------------------------------------
ACL_USER, ACL_USER_OBJ, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER = 0x02, 0x01, 0x04, 0x10, 0x20


def grant_by_acl(path: Path, uid: int) -> None:
    """A POSIX ACL entry u:<uid>:r-x on a 0700 path (setfacl's xattr, written directly:
    Debian's acl package is not installed here)."""
    import struct

    def entry(tag: int, perm: int, ident: int = 0xFFFFFFFF) -> bytes:
        return struct.pack("<HHI", tag, perm, ident)

    acl = struct.pack("<I", 2) + b"".join(
        (
            entry(ACL_USER_OBJ, 7),
            entry(ACL_USER, 5, uid),
            entry(ACL_GROUP_OBJ, 0),
            entry(ACL_MASK, 5),
            entry(ACL_OTHER, 0),
        )
    )
    os.setxattr(path, "system.posix_acl_access", acl)


@pytest.fixture
def submits(monkeypatch) -> list:
    from slurm import client

    seen: list = []

    def fake_submit(self, args, script, env, **kwargs):  # the Slurm boundary
        seen.append(args)
        return str(60 + len(seen))

    monkeypatch.setattr(client.SlurmClient, "submit", fake_submit)
    return seen


@pytest.fixture
def places(settings, cluster, local_identity, django_user_model):
    """A root-only folder (0700), a world-readable file, and another user's run dir."""
    from identity.services import account_ensure
    from jobs.services import job_root

    base = Path(settings.DATA_DIR) / "path-checks"
    base.mkdir(mode=0o755, exist_ok=True)
    secret = base / "secret"
    secret.mkdir(mode=0o700)
    (secret / "corpus.txt").write_text("mtc's own\n")
    shared = base / "shared.txt"
    shared.write_text("for everyone\n")
    shared.chmod(0o644)
    bob = django_user_model.objects.create_user("bob", password="pw-bob-123")
    bobs = job_root(cluster, account_ensure(user=bob)) / "runs" / "sft-1"
    (bobs / "checkpoints").mkdir(parents=True)
    give(bobs.parent, account_ensure(user=bob))
    yield {"secret": secret, "shared": shared, "bobs": bobs / "checkpoints"}
    import shutil

    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(Path(settings.DATA_DIR) / "clusters" / "rc" / "users", ignore_errors=True)


def user_runs(settings) -> set[Path]:
    """Every run dir of cluster rc, whoever's (earlier tests may have left theirs)."""
    root = Path(settings.DATA_DIR) / "clusters" / "rc"
    return set(root.glob("runs/*")) | set(root.glob("users/*/runs/*"))


@pytest.mark.parametrize(
    "recipe, field, place",
    [
        ("llama-pretrain", "data_path", "secret"),
        ("sft", "data_path", "secret/corpus.txt"),
        ("continued-pretrain", "init_from", "bobs"),
        ("sft", "init_from", "bobs"),
    ],
)
def test_a_path_the_user_cannot_read_is_refused_and_nothing_is_submitted(
    places, user_api, user, submits, settings, recipe, field, place
):
    head, _, rest = place.partition("/")
    path = places[head] / rest if rest else places[head]
    assert path.exists()  # it is there: only the user may not read it
    runs_before = user_runs(settings)
    for dry_run in (True, False):
        response = user_api.post(
            f"/api/v1/clusters/rc/recipes/{recipe}/launch",
            {"overrides": {field: str(path), "steps": 4}, "dry_run": dry_run},
            format="json",
        )
        assert response.status_code == 400, response.content
        fields = response.json()["error"]["fields"]
        assert set(fields) == {f"overrides.{field}"}
        assert "may not read it" in fields[f"overrides.{field}"]
    assert not Job.objects.exists() and not submits
    assert user_runs(settings) == runs_before


def test_a_path_the_user_may_read_passes_acls_included(places, user_api, user, submits):
    from identity.models import PosixAccount

    launched = user_api.post(
        "/api/v1/clusters/rc/recipes/sft/launch",
        {"overrides": {"data_path": str(places["shared"]), "steps": 4}},
        format="json",
    )
    assert launched.status_code == 201, launched.content
    assert Job.objects.get().parameters["data_path"] == str(places["shared"])
    # The 0700 folder becomes readable to this user alone by an ACL entry.
    grant_by_acl(places["secret"], PosixAccount.objects.get(user=user).uid)
    response = user_api.post(
        "/api/v1/clusters/rc/recipes/llama-pretrain/launch",
        {"overrides": {"data_path": str(places["secret"])}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert len(submits) == 1


def test_single_user_mode_checks_as_mtc(cluster, user_api, settings, submits):
    settings.MTC_IDENTITY = "single-user"
    missing = Path(settings.DATA_DIR) / "no-such-corpus.txt"
    response = user_api.post(
        "/api/v1/clusters/rc/recipes/sft/launch",
        {"overrides": {"data_path": str(missing)}},
        format="json",
    )
    assert response.status_code == 400
    assert "account (mtc)" in response.json()["error"]["fields"]["overrides.data_path"]
    present = Path(settings.DATA_DIR) / "corpus.txt"
    present.write_text("text\n")
    response = user_api.post(
        "/api/v1/clusters/rc/recipes/sft/launch",
        {"overrides": {"data_path": str(present)}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert not Job.objects.exists() and not submits


def _gpu_cluster(cluster_id: str, machine_type: str) -> Cluster:
    spec = make_spec(cluster_id, nodes=2)
    spec["node_pools"][1]["machine_spec"]["machine_type"] = machine_type
    spec = validate_cluster_spec(spec)
    return Cluster.objects.create(cluster_id=cluster_id, spec=spec, state="RUNNING")


def _dry_run(api, cluster_id: str, **body) -> dict:
    response = api.post(
        f"/api/v1/clusters/{cluster_id}/recipes/llama-pretrain/launch",
        {"nodes": 2, "overrides": {"steps": 4}, "dry_run": True, **body},
        format="json",
    )
    assert response.status_code == 200, response.content
    return response.json()


def test_dry_run_shows_the_sbatch_options_for_the_whole_gpu_node(cluster, user_api):
    """The local pool: 8 emulated GPUs on local-2 nodes. What is shown is what sbatch gets."""
    body = _dry_run(user_api, "rc")
    options = body["options"]
    assert options[0] == "sbatch" and "--nodes=2" in options
    assert "--gpus-per-node=8" in options and "--mem=0" in options
    assert "--cpus-per-task=2" in options  # the node's cores, not 1
    # A tiny model's save fits in the floor: SIGUSR1 a minute ahead, torchrun forwards it
    # and waits that long for the ranks' checkpoint; the script requeues after it.
    assert "--signal=USR1@60" in options
    assert "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in body["script"]
    assert "--shutdown-timeout=60" in body["script"]
    assert 'scontrol requeue "$SLURM_JOB_ID"' in body["script"]
    assert "PYTORCH_ALLOC_CONF=expandable_segments:True" in body["script"]
    assert "NCCL_NET" not in body["script"]  # local machines: no cloud NCCL plugin
    # Emulated GPUs: one CPU rank per node, and the runtime must not demand CUDA.
    assert "MTC_NPROC=1" in body["script"] and "require_cuda" not in body["run_config"]
    # An explicit CPU-only request stays one: no GPUs, no whole-node asks.
    cpu = _dry_run(user_api, "rc", gpus_per_node=0)["options"]
    assert not any(o.startswith(("--gpus-per-node", "--mem")) for o in cpu)


@pytest.mark.parametrize(
    "machine_type, transport, marker",
    [
        ("a3-ultragpu-8g", "gIB", 'NCCL_NET="gIB"'),
        ("a4-highgpu-8g", "gIB", "tuner_config_a4.txtpb"),
        ("a3-megagpu-8g", "TCPXO", "NCCL_FASTRAK_CTRL_DEV"),
    ],
)
def test_gpu_machine_types_carry_their_nccl_environment(
    db, user_api, monkeypatch, machine_type, transport, marker
):
    from clusters.providers import get_provider

    real_gpus = get_provider("local")  # as on a node with NVIDIA GPUs
    real_gpus.gpus_emulated = False
    monkeypatch.setattr("recipes.launch.get_provider", lambda name: real_gpus)
    _gpu_cluster("g1", machine_type)
    body = _dry_run(user_api, "g1")
    script, options = body["script"], body["options"]
    assert f"NCCL over {transport} on {machine_type}" in script and marker in script
    assert "https://cloud.google.com/" in script  # the page the values follow
    assert "--gpus-per-node=8" in options and "--mem=0" in options
    assert "--exclusive" in options  # cores mtc does not know: the whole node
    assert '--cpus-per-task="$SLURM_CPUS_ON_NODE"' in script  # and the step gets them all
    assert "MTC_NPROC=8" in script  # one rank per real GPU
    assert body["run_config"]["require_cuda"] is True


def test_a_launch_that_cannot_fit_in_gpu_memory_names_the_node_count_that_does(cluster, user_api):
    """The local pool states its (emulated) GPUs: 8 x NVIDIA_H200_141GB per node."""
    response = user_api.post(
        "/api/v1/clusters/rc/recipes/llama-pretrain/launch",
        {"nodes": 1, "overrides": {"model": "llama3-70b", "seq_len": 2048}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 400, response.content
    message = response.json()["error"]["fields"]["nodes"]
    assert "llama3-70b needs about 212.6 GB per GPU on 1 node(s) x 8 NVIDIA_H200_141GB" in message
    assert "optimizer state 70.6" in message and "3 nodes fit" in message
    assert not Job.objects.exists()
    fits = user_api.post(
        "/api/v1/clusters/rc/recipes/llama-pretrain/launch",
        {"nodes": 1, "overrides": {"model": "llama3-8b", "seq_len": 2048}, "dry_run": True},
        format="json",
    )
    assert fits.status_code == 200, fits.content
    # 8B: 96 GB of weights and AdamW state on one node, at 0.4 GB/s after the 60 s floor.
    assert "--signal=USR1@300" in fits.json()["options"]


def test_gpu_memory_table_and_estimate():
    from node.train.presets import PRESETS
    from recipes.memory import GB, estimate, gpu_memory

    assert gpu_memory("NVIDIA_H200_141GB") == 141 * GB and gpu_memory("NVIDIA_B200") == 180 * GB
    assert gpu_memory("NVIDIA_FUTURE_96GB") == 96 * GB and gpu_memory("SOMETHING") is None
    p = PRESETS["llama"]["llama3-8b"]
    base = {"global_batch": 64, "seq_len": 4096}
    full = estimate(p, base, 8, reference=False)
    assert full.params + full.grads + full.optimizer == pytest.approx(16 * 8.03e9 / 8, rel=0.01)
    micro = estimate(p, {**base, "micro_batch": 1}, 8, reference=False)
    ckpt = estimate(p, {**base, "micro_batch": 1, "activation_checkpointing": True}, 8,
                    reference=False)  # fmt: skip
    # Layer activations scale with the micro-batch; the loss keeps one chunk's logits
    # (2,048 tokens: bf16, the fp32 copy and its gradient) whatever its size.
    chunk = 2048 * p.vocab_size * (2 + 4 + 4)
    assert full.activations - chunk == 8 * (micro.activations - chunk)
    assert micro.activations > ckpt.activations
