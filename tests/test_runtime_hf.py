"""init_from a Hugging Face-format directory, in the runtime (no Slurm, no database):
the run's model is the directory's config, its weights loaded (sharded under torchrun),
its tokenizer the run's; what the run saves carries both, and an export of it loads with
from_pretrained. Models are written by the test (tests/hf_models.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node.train import train

from .hf_models import corpus, first_batches, hf_model_write, own_and_fresh_loss
from .test_runtime_train import REPO, env_for_subprocess, read_metrics, run_inprocess, write_config

SMALL = {"steps": 1, "checkpoint_interval": 0, "global_batch": 4, "seq_len": 32, "lr": 1e-3}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    (root / "corpus.txt").write_text(corpus())
    return {
        "llama": hf_model_write(root / "tiny-llama", "llama"),
        "gemma": hf_model_write(root / "tiny-gemma", "gemma"),
        "corpus": root / "corpus.txt",
    }


def first_loss_matches(run_dir: Path, model_dir: Path, world: int, scratch: Path) -> None:
    steps, _ = read_metrics(run_dir)
    own, fresh = own_and_fresh_loss(model_dir, first_batches(run_dir, world, scratch), 1234)
    assert steps[1]["loss"] == pytest.approx(own, rel=1e-3)
    assert abs(steps[1]["loss"] - fresh) > 0.05 * fresh


def test_continued_pretrain_from_hf_llama_starts_at_its_loss(models, tmp_path):
    run_dir = tmp_path / "run"
    init = str(models["llama"])
    data = str(models["corpus"])
    assert (
        run_inprocess(run_dir, recipe="continued-pretrain", init_from=init, data_path=data, **SMALL)
        == 0
    )
    first_loss_matches(run_dir, models["llama"], 1, tmp_path / "scratch")
    saved = json.loads((run_dir / "model.json").read_text())
    assert saved["hf_config"]["model_type"] == "llama" and saved["family"] == "llama"
    assert saved["hidden_size"] == 32 and saved["vocab_size"] == saved["hf_config"]["vocab_size"]
    # No pad token in this tokenizer: eos stands in.
    assert saved["special_ids"]["pad"] == saved["special_ids"]["eos"]
    tok = (run_dir / "tokenizer.json").read_text()
    assert tok == (models["llama"] / "tokenizer.json").read_text()


def test_sft_from_hf_gemma_on_two_ranks_loads_sharded(models, tmp_path):
    run_dir = tmp_path / "run"
    config = write_config(run_dir, recipe="sft", init_from=str(models["gemma"]), **SMALL)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        + ["-m", "node.train.train", "--config", str(config)],
        cwd=REPO,
        env=env_for_subprocess(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sft gemma/tiny-gemma" in proc.stdout and "world 2 (FSDP2/gloo)" in proc.stdout
    first_loss_matches(run_dir, models["gemma"], 2, tmp_path / "scratch")


def test_a_run_from_hf_carries_it_on_and_exports_loadable(models, tmp_path):
    """Its checkpoint starts the next run with the same model and tokenizer, and the
    registry's export of it loads with from_pretrained, tokenizer and all."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from node.export.hf import checkpoint_export

    first = tmp_path / "first"
    common = {**SMALL, "steps": 2, "data_path": str(models["corpus"])}
    init = str(models["gemma"])
    assert run_inprocess(first, recipe="continued-pretrain", init_from=init, **common) == 0
    second = tmp_path / "second"
    assert run_inprocess(second, recipe="sft", init_from=str(first), **SMALL) == 0
    assert json.loads((second / "model.json").read_text())["hf_config"]["model_type"] == "gemma"
    assert (second / "tokenizer.json").read_text() == (
        models["gemma"] / "tokenizer.json"
    ).read_text()

    out = tmp_path / "export"
    checkpoint_export(checkpoint=second / "checkpoints" / "step-000001", out_dir=out, info={})
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    original = AutoTokenizer.from_pretrained(models["gemma"])
    assert type(model).__name__ == "GemmaForCausalLM" and model.config.hidden_size == 32
    assert tok.eos_token == original.eos_token == "<eos>" and tok.pad_token == "<pad>"
    text = "What is 3+4?"
    assert tok(text)["input_ids"][1:] == original(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tok(text)["input_ids"]])).logits
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "damage, message",
    [
        ("config", "no config.json"),
        ("model_type", "model_type 'bert'"),
        ("weights", "no safetensors weights"),
        ("tokenizer", "no tokenizer.json"),
    ],
)
def test_not_a_supported_hf_directory_exits_2(models, tmp_path, caplog, damage, message):
    bad = tmp_path / "bad"
    shutil.copytree(models["llama"], bad)
    if damage == "config":
        (bad / "config.json").unlink()
    elif damage == "model_type":
        config = json.loads((bad / "config.json").read_text())
        (bad / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    elif damage == "weights":
        (bad / "model.safetensors").unlink()
    else:
        (bad / "tokenizer.json").unlink()
    run_dir = tmp_path / "run"
    code = train.main(
        ["--config", str(write_config(run_dir, recipe="sft", init_from=str(bad), **SMALL))]
    )
    assert code == 2
    assert message in caplog.text and str(bad) in caplog.text


def test_rl_reference_policy_is_the_hf_model(models, tmp_path):
    """kl to the initial policy, loaded from the directory too: zero at the first step."""
    run_dir = tmp_path / "run"
    rl = {"group_size": 2, "max_new_tokens": 4, "kl_coef": 0.1}
    init = str(models["llama"])
    assert run_inprocess(run_dir, recipe="rl", init_from=init, rl=rl, **SMALL) == 0
    steps, _ = read_metrics(run_dir)
    assert steps[1]["kl"] == pytest.approx(0.0, abs=1e-6)


def test_special_ids_fall_back_to_the_configs(models, tmp_path):
    """No tokenizer_config.json: generation_config.json's ids, then config.json's."""
    from node.train.hf import hf_special_ids

    bare = tmp_path / "bare"
    shutil.copytree(models["gemma"], bare)
    (bare / "tokenizer_config.json").unlink()
    config = json.loads((bare / "config.json").read_text())
    (bare / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 6]}))
    ids = hf_special_ids(bare, {**config, "bos_token_id": 3, "pad_token_id": None})
    assert ids == {"bos": 3, "eos": 5, "pad": 5}
