"""init_from a Hugging Face model directory, at launch: checked as the user's account
(listed, config.json read, each file test -r as it); what is wrong is a 400 naming
overrides.init_from and nothing is submitted. The runs are in test_runtime_hf.py and
test_recipes_hf_e2e.py."""

import json
import shutil
from pathlib import Path

import pytest

from jobs.models import Job

from .test_api_recipes import cluster, submits  # noqa: F401 - fixtures

CONFIG = {"model_type": "llama", "vocab_size": 320, "hidden_size": 32}


@pytest.fixture
def hf_dir(settings, cluster, local_identity):  # noqa: F811 - fixtures
    """A world-readable directory laid out as save_pretrained writes one (the launch
    reads no weights, so the files' contents are stand-ins)."""
    base = Path(settings.DATA_DIR) / "hf-checks"
    shutil.rmtree(base, ignore_errors=True)
    model = base / "tiny-llama"
    model.mkdir(parents=True)
    base.chmod(0o755)
    model.chmod(0o755)
    (model / "config.json").write_text(json.dumps(CONFIG))
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    (model / "tokenizer.json").write_text("{}")
    for f in model.iterdir():
        f.chmod(0o644)
    yield model
    shutil.rmtree(base, ignore_errors=True)


def dry_run(api, recipe: str, init_from: str):
    return api.post(
        f"/api/v1/clusters/rc/recipes/{recipe}/launch",
        {"overrides": {"init_from": init_from, "steps": 4}, "dry_run": True},
        format="json",
    )


def refused(api, recipe: str, init_from: str, submits) -> str:  # noqa: F811
    for dry in (True, False):
        response = api.post(
            f"/api/v1/clusters/rc/recipes/{recipe}/launch",
            {"overrides": {"init_from": init_from, "steps": 4}, "dry_run": dry},
            format="json",
        )
        assert response.status_code == 400, response.content
        fields = response.json()["error"]["fields"]
        assert set(fields) == {"overrides.init_from"}
    assert not Job.objects.exists() and not submits
    return fields["overrides.init_from"]


def test_a_hugging_face_directory_is_taken_as_init_from(hf_dir, user_api, submits):  # noqa: F811
    for recipe in ("continued-pretrain", "sft", "rl"):
        response = dry_run(user_api, recipe, str(hf_dir))
        assert response.status_code == 200, response.content
        assert response.json()["run_config"]["init_from"] == str(hf_dir)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("config.json", "no config.json"),
        ("model_type", "model_type 'bert'"),
        ("model.safetensors", "no safetensors weights"),
        ("tokenizer.json", "no tokenizer.json"),
        ("garbled", "config.json is not readable JSON"),
    ],
)
def test_not_a_supported_model_is_a_400_naming_init_from(
    hf_dir,
    user_api,
    submits,  # noqa: F811
    damage,
    message,
):
    if damage == "model_type":
        (hf_dir / "config.json").write_text(json.dumps({**CONFIG, "model_type": "bert"}))
    elif damage == "garbled":
        (hf_dir / "config.json").write_text("{not json")
    else:
        (hf_dir / damage).unlink()
    assert message in refused(user_api, "sft", str(hf_dir), submits)


def test_weights_the_account_may_not_read_are_refused(hf_dir, user_api, submits):  # noqa: F811
    (hf_dir / "model.safetensors").chmod(0o600)  # root's alone
    problem = refused(user_api, "continued-pretrain", str(hf_dir), submits)
    assert "model.safetensors" in problem and "may not read it" in problem


def test_a_checkpoint_directory_is_not_taken_for_one(hf_dir, user_api, submits):  # noqa: F811
    run = hf_dir.parent / "run"
    (run / "checkpoints" / "step-000004").mkdir(parents=True)
    for p in (run, run / "checkpoints", run / "checkpoints" / "step-000004"):
        p.chmod(0o755)
    (run / "checkpoints" / "step-000004" / "tokenizer.json").write_text("{}")
    assert dry_run(user_api, "sft", str(run)).status_code == 200
