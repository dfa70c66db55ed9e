"""FSDP2 units as torchtitan makes them, the chunked loss and selective activation
checkpointing: the loss equals the full-logits one (in process), and on two gloo ranks
(torch.multiprocessing, no torchrun, no Slurm) the units are the embedding, each decoder
layer and norm+lm_head, and a few training steps give the plain path's losses."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from mtc.devstack import free_port
from node.train.presets import get_preset

from .test_runtime_train import exit_rank, write_config

STEPS = 3


def _tiny(arch: str):
    from node.train.distributed import Dist
    from node.train.model import model_build

    preset = replace(get_preset("gemma", "tiny"), arch=arch, max_position=128)
    if arch == "llama":
        preset = replace(get_preset("llama", "tiny"), max_position=128)
    return model_build(
        preset, d=Dist(), seed=0, precision="fp32", activation_checkpointing=False, compile=False
    ), preset


@pytest.mark.parametrize("arch", ["llama", "gemma", "gemma2"])
def test_chunked_loss_equals_the_full_logits_loss(arch, monkeypatch):
    from node.train import loss as chunked
    from node.train.model import lm_loss_sum, lm_loss_sum_full

    model, preset = _tiny(arch)
    torch.manual_seed(1)
    x = torch.randint(0, preset.vocab_size, (3, 40))
    labels = x.clone()
    labels[0, :17] = -100  # sft: the prompt does not count
    labels[2, 30:] = -100  # nor the padding
    full = lm_loss_sum_full(model, x, labels)
    full.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    counted = int((F.pad(labels[:, 1:], (0, 1), value=-100) != -100).sum())
    for chunk in (7, 40, 4096):  # uneven chunks, one per sequence, all in one
        monkeypatch.setattr(chunked, "CHUNK_TOKENS", chunk)
        got = lm_loss_sum(model, x, labels)
        assert got.dtype == torch.float32
        assert float(got.detach() / counted) == pytest.approx(
            float(full.detach() / counted), rel=1e-6
        )
        got.backward()
        for name, param in model.named_parameters():
            torch.testing.assert_close(param.grad, want[name], rtol=1e-4, atol=1e-5)
        model.zero_grad()


def test_chunked_loss_keeps_one_chunk_of_logits(monkeypatch):
    """Backward keeps no whole-sequence logits (the plain loss does): no saved tensor is
    as large as tokens x vocab."""
    from node.train import loss as chunked
    from node.train.model import lm_loss_sum, lm_loss_sum_full

    model, preset = _tiny("llama")
    monkeypatch.setattr(chunked, "CHUNK_TOKENS", 16)
    x = torch.randint(0, preset.vocab_size, (2, 64))
    whole = x.numel() * preset.vocab_size

    def largest(loss_fn) -> int:
        sizes: list[int] = []

        def pack(t):
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss_fn(model, x, x)
        return max(sizes)

    assert largest(lm_loss_sum_full) >= whole > largest(lm_loss_sum)


def test_activation_checkpointing_forms_and_selected_layers():
    from node.train.config import ConfigError, ac_interval, config_from_dict
    from node.train.distributed import Dist
    from node.train.model import model_build
    from recipes.catalog import RecipeError, recipe_get

    assert [ac_interval(v) for v in (False, "none", 0, True, "full", 1, 3, "every_2")] == [
        0, 0, 0, 1, 1, 1, 3, 2,
    ]  # fmt: skip
    for bad in ("every_0", "some", 1.5, -1, "every_x"):
        with pytest.raises(ValueError, match="activation_checkpointing"):
            ac_interval(bad)
    with pytest.raises(ConfigError, match="activation_checkpointing"):
        config_from_dict({"recipe": "sft", "run_dir": "/tmp/x", "activation_checkpointing": "half"})
    recipe = recipe_get("llama-pretrain")
    assert (
        recipe.validate({"activation_checkpointing": "every_2"})["activation_checkpointing"]
        == "every_2"
    )
    with pytest.raises(RecipeError) as err:
        recipe.validate({"activation_checkpointing": "every_other"})
    assert "overrides.activation_checkpointing" in err.value.fields

    preset = replace(get_preset("llama", "tiny"), num_layers=4)
    model = model_build(
        preset, d=Dist(), seed=0, precision="fp32", activation_checkpointing="every_2",
        compile=False,
    )  # fmt: skip
    flags = [layer.gradient_checkpointing for layer in model.model.layers]
    assert flags == [False, True, False, True]  # torchtitan's count: layers N-1, 2N-1


def test_memory_estimate_follows_the_interval_and_the_chunked_logits():
    from recipes.memory import estimate

    p = get_preset("llama", "llama3-8b")
    base = {"global_batch": 8, "seq_len": 8192, "micro_batch": 1}
    acts = [
        estimate(p, {**base, "activation_checkpointing": ac}, 8, reference=False).activations
        for ac in ("none", "every_4", "every_2", "full")
    ]
    assert acts == sorted(acts, reverse=True) and len(set(acts)) == 4
    # One 2,048-token chunk of logits (bf16, fp32 copy, fp32 grad), not 8,192 tokens'.
    none = estimate(p, {**base, "activation_checkpointing": "none"}, 8, reference=False)
    layers = 2 * 8192 * p.num_layers * (6 * 4096 + 2 * 8 * 128 + 4 * p.intermediate_size)
    assert none.activations - layers == 2048 * p.vocab_size * 10


# --- two gloo ranks -------------------------------------------------------------------


def _units(model) -> dict:
    """The FSDP2 units: lists of the modules sharing one FSDP state (one all-gather)."""
    from torch.distributed.fsdp import FSDPModule

    units: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule):
            units.setdefault(id(module._get_fsdp_state()), []).append(name or "<root>")
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    return {"units": list(units.values()), "tied": tied}


def _worker(rank: int, world: int, port: int, root: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    from node.train import loss as chunked
    from node.train.distributed import dist_close, dist_init

    chunked.CHUNK_TOKENS = 24  # several chunks per sequence
    d = dist_init()
    try:
        result = _runs(d, root)
    finally:
        dist_close(d)
    exit_rank(root, rank, result)


def _runs(d, root: str) -> dict:
    """Every run's units and losses. In a function of its own so that the models, their
    FSDP state and gloo work handles are gone before the process group is destroyed."""
    from node.train import train
    from node.train.config import load_config
    from node.train.model import lm_loss_sum_full
    from node.train.start import run_prepare

    result: dict = {}
    for name in sorted(os.listdir(root)):
        if not name.startswith("run-"):
            continue
        cfg = load_config(str(Path(root) / name / "run.json"))
        p = run_prepare(cfg, d)
        if name.endswith("plain"):  # the whole sequence's fp32 logits

            def full(model, mb):
                return lm_loss_sum_full(model, mb["input_ids"], mb.get("labels", mb["input_ids"]))

            p.task.loss = full
        result[name] = {
            **_units(p.model),
            "losses": [train._train_step(cfg, d, p, s)[0]["loss"] for s in range(1, STEPS + 1)],
        }
    return result


def test_units_and_training_parity_on_two_ranks(tmp_path):
    common = dict(steps=STEPS, checkpoint_interval=0, global_batch=4, seq_len=48)
    runs = {
        "llama-pretrain": dict(recipe="llama-pretrain", corpus_bytes=200_000),
        "gemma-sft": dict(recipe="sft", family="gemma", model="tiny"),  # tied, masked labels
    }
    for name, extra in runs.items():
        write_config(tmp_path / f"run-{name}-plain", **common, **extra)
        write_config(
            tmp_path / f"run-{name}-new", activation_checkpointing="every_2", **common, **extra
        )
    torch.set_num_threads(1)
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    result = json.loads((tmp_path / "rank0.json").read_text())
    layers = get_preset("llama", "tiny").num_layers
    llama = result["run-llama-pretrain-new"]
    assert llama["units"] == [
        ["<root>"],
        ["model.embed_tokens"],
        *[[f"model.layers.{i}"] for i in range(layers)],
        ["model.norm", "lm_head"],  # one unit of two modules
    ], llama["units"]
    gemma = result["run-gemma-sft-new"]
    assert gemma["tied"] and gemma["units"] == [  # the tied weight lives in the root
        ["<root>"],
        *[[f"model.layers.{i}"] for i in range(get_preset("gemma", "tiny").num_layers)],
    ], gemma["units"]
    for name in runs:
        new, plain = result[f"run-{name}-new"]["losses"], result[f"run-{name}-plain"]["losses"]
        assert new == pytest.approx(plain, rel=1e-5), name
