"""Small pieces of the training runtime: presets, schedule, data order, checkpoint checks."""

from __future__ import annotations

import json

import pytest
import torch

from node.train.checkpoint import checkpoint_find
from node.train.config import ConfigError, config_from_dict
from node.train.data import sample_ids
from node.train.model import flops_per_token, hf_config
from node.train.optim import lr_at
from node.train.presets import PRESETS, get_preset, param_count
from node.train.rl import group_advantages, grpo_loss_sum, reward
from node.train.tasks import PairSource


@pytest.mark.parametrize("family,name", [(f, n) for f, presets in PRESETS.items() for n in presets])
def test_param_count_matches_the_transformers_model(family, name):
    preset = get_preset(family, name)
    config, cls = hf_config(preset)
    with torch.device("meta"):
        model = cls(config)
    assert param_count(preset) == sum(p.numel() for p in model.parameters())


def test_published_sizes():
    assert 8.0e9 < param_count("llama3-8b") < 8.1e9
    assert 70.5e9 < param_count("llama3-70b") < 70.6e9
    assert 2.5e9 < param_count("gemma-2b", "gemma") < 2.52e9
    assert 8.5e9 < param_count("gemma-7b", "gemma") < 8.6e9


def test_flops_per_token_formula():
    p = get_preset("llama", "llama3-8b")
    n = param_count(p) - p.vocab_size * p.hidden_size  # the input embedding is a lookup
    assert flops_per_token(p, 2048) == 6 * n + 12 * 32 * 4096 * 2048


def test_lr_schedule():
    kw = dict(lr=1.0, steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(5, schedule="cosine", **kw) == pytest.approx(0.5)
    assert lr_at(10, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_at(55, schedule="cosine", **kw) == pytest.approx(0.55)
    assert lr_at(100, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_at(100, schedule="linear", **kw) == pytest.approx(0.1)
    assert lr_at(77, schedule="constant", **kw) == 1.0


def test_data_order_is_a_function_of_seed_and_step():
    a = sample_ids(7, 5, 8, 50, 0, 8)
    assert a == sample_ids(7, 5, 8, 50, 0, 8)
    assert a != sample_ids(8, 5, 8, 50, 0, 8)
    assert sample_ids(7, 5, 8, 50, 0, 4) + sample_ids(7, 5, 8, 50, 4, 4) == a  # rank split
    epoch = [i for s in range(1, 8) for i in sample_ids(7, s, 8, 50, 0, 8)][:50]
    assert sorted(epoch) == list(range(50))  # every sample once per epoch


def test_arithmetic_tasks_are_checkable():
    src = PairSource(None, seed=1, max_operand=9, salt=0)
    pairs = src.for_step(3, 16, 0, 16)
    assert pairs == src.for_step(3, 16, 0, 16)
    for prompt, answer in pairs:
        a, b = prompt.rstrip("=").split("+")
        assert int(a) + int(b) == int(answer)
    assert reward(" 7", "7") == 1.0 and reward("71", "7") == 0.0


def test_grpo_objective():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]))
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-3)
    assert torch.all(adv[1] == 0)  # a group that all scored the same teaches nothing
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = grpo_loss_sum(logp, logp.detach(), torch.tensor([1.0, -1.0]), mask, clip_eps=0.2)
    loss.backward()
    # -A/len on counted tokens: raise the good sample's tokens, lower the bad one's
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, -0.5], [1.0, 0.0]]))


def test_config_validation(tmp_path):
    cfg = config_from_dict({"recipe": "gemma-pretrain", "model": "gemma-2b", "run_dir": "/x"})
    assert cfg.family == "gemma" and cfg.preset().hidden_size == 2048
    with pytest.raises(ConfigError, match="no llama model preset"):
        config_from_dict({"recipe": "llama-pretrain", "model": "gemma-2b", "run_dir": "/x"})
    cfg = config_from_dict({"recipe": "sft", "model": "gemma-7b", "run_dir": "/x"})
    assert cfg.family == "gemma"  # the named shape says which family
    with pytest.raises(ConfigError, match="recipe must be"):
        config_from_dict({"recipe": "nope", "run_dir": "/x"})


def test_checkpoint_find_without_any(tmp_path):
    (tmp_path / "step-000010").mkdir()
    (tmp_path / "step-000010" / "COMPLETE").write_text(json.dumps({"format": "other"}))
    found, skipped = checkpoint_find(tmp_path)
    assert found is None and "not an mtc checkpoint" in skipped[0][1]


@pytest.mark.parametrize("arch", ["llama", "gemma", "gemma2"])
def test_every_architecture_trains_a_step(arch):
    from dataclasses import replace

    from node.train.distributed import Dist
    from node.train.model import lm_loss_sum, model_build

    preset = replace(get_preset("gemma", "tiny"), arch=arch, max_position=128)
    model = model_build(
        preset, d=Dist(), seed=0, precision="fp32", activation_checkpointing=True, compile=False
    )
    x = torch.randint(0, preset.vocab_size, (2, 16))
    loss = lm_loss_sum(model, x, x) / (2 * 15)
    loss.backward()
    assert 6.0 < loss.item() < 8.0  # about ln(1024) at initialisation
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    "device_name, tflops",
    [
        ("NVIDIA H100 80GB HBM3", 989.4),  # SXM
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H100 NVL", 835),
        ("NVIDIA H200", 989),
        ("NVIDIA H200 NVL", 835),
        ("NVIDIA GH200 480GB", 989),
        ("NVIDIA B200", 2250),
        ("NVIDIA GB200", 2500),
        ("NVIDIA B300 SXM6 AC", 2250),
        ("NVIDIA GB300", 2500),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA L4", 121),
        ("NVIDIA L40S", 362),
    ],
)
def test_gpu_peak_by_device_name(device_name, tflops):
    from node.train.metrics import gpu_peak_flops

    assert gpu_peak_flops(device_name) == pytest.approx(tflops * 1e12)


def test_an_unknown_gpu_has_no_peak_in_the_table():
    from node.train.metrics import UNKNOWN_GPU_FLOPS, gpu_peak_flops

    assert gpu_peak_flops("NVIDIA Quadro P1000") is None
    assert UNKNOWN_GPU_FLOPS >= 989e12  # MFU of an unknown GPU is never inflated by A100's


def test_micro_batches_are_even_over_ranks_or_refused():
    from node.train.distributed import Dist

    assert Dist(rank=1, world=2).micro_share(8, 2) == (4, 4, 2)
    assert Dist(rank=0, world=2).micro_share(3, None) == (0, 2, 2)
    with pytest.raises(ValueError, match="multiple of 2"):
        Dist(rank=0, world=2).micro_share(3, 1)
