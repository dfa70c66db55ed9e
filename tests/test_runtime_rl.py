"""rl rollouts and the PPO update, in this process on CPU with tiny random models:
KV-cache generation against the uncached reference, the unsharded rollout copy of an
FSDP2 model (a one-rank gloo group), the clipped objective's gradient, and ρ ≠ 1 on the
second update of a batch (ppo_epochs=2)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mtc.devstack import free_port
from node.train.config import ConfigError, config_from_dict
from node.train.distributed import Dist
from node.train.model import hf_config
from node.train.presets import get_preset
from node.train.rl import grpo_loss_sum, token_logprobs
from node.train.rollout import generate, rollout_model, unsharded_copy

PROMPTS = [[1, 5, 9, 13], [1, 7], [1, 22, 8, 40, 3, 11], [1, 2, 3]]


def tiny_model(family: str = "llama", tie: bool = False):
    """gemma2: the tiny Gemma shape as Gemma 2 (sliding-window layers, eager attention)."""
    preset = get_preset("llama" if family == "llama" else "gemma", "tiny")
    if family == "gemma2":
        preset = dataclasses.replace(preset, arch="gemma2")
    if tie:  # as Llama 3.2 1B and 3B
        preset = dataclasses.replace(preset, tie_embeddings=True)
    config, cls = hf_config(preset)
    config._attn_implementation = "eager" if family == "gemma2" else "sdpa"
    torch.manual_seed(0)
    return cls(config).eval()


def sample(model, *, use_cache: bool, eos_id: int, temperature: float, seed: int = 7, **kw):
    gen = torch.Generator().manual_seed(seed)
    return generate(
        model,
        PROMPTS,
        max_new_tokens=6,
        temperature=temperature,
        pad_id=0,
        eos_id=eos_id,
        gen=gen,
        device=torch.device("cpu"),
        use_cache=use_cache,
        **kw,
    )


@pytest.mark.parametrize("family", ["llama", "gemma", "gemma2"])
@pytest.mark.parametrize("temperature", [1e-6, 1.0])  # greedy, and seeded sampling
def test_kv_cache_generation_equals_uncached(family, temperature):
    model = tiny_model(family)
    ref = sample(model, use_cache=False, eos_id=2, temperature=temperature)
    # Make the eos one that row 0 samples first, so rows finish at different lengths.
    eos = int(ref[0][0, len(PROMPTS[2]) + 1])
    ref = sample(model, use_cache=False, eos_id=eos, temperature=temperature)
    assert 0 < int(ref[2].sum()) < len(PROMPTS) * 6  # some rows stopped early
    for fixed in (True, False):
        got = sample(model, use_cache=True, eos_id=eos, temperature=temperature, fixed_length=fixed)
        for a, b in zip(ref, got, strict=True):
            assert torch.equal(a, b)


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield Dist()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("tie", [False, True])
def test_unsharded_copy_of_an_fsdp2_model(one_rank_group, monkeypatch, tie):
    from torch.distributed.fsdp import fully_shard

    from node.train import rollout

    d = one_rank_group
    model = tiny_model("llama", tie)
    plain_ref = tiny_model("llama", tie)  # the same weights, never sharded
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.train()
    assert hasattr(next(model.parameters()), "full_tensor")
    copy = unsharded_copy(model, torch.float32, d.device)
    assert not any(hasattr(p, "full_tensor") for p in copy.parameters())
    tied = copy.lm_head.weight is copy.model.embed_tokens.weight
    assert tied == tie
    ids = torch.tensor([[1, 5, 9, 13, 4]])
    with torch.no_grad():
        assert torch.allclose(copy(input_ids=ids).logits, plain_ref(input_ids=ids).logits)

    kw = {"dtype": torch.float32, "rows": 4, "length": 12}
    with rollout_model(model, d, **kw) as (policy, unsharded):
        assert unsharded and policy is not model
        fast = sample(policy, use_cache=True, eos_id=2, temperature=1.0, fixed_length=False)
    monkeypatch.setattr(rollout, "_free_bytes", lambda device: 0)  # the copy would not fit
    with rollout_model(model, d, **kw) as (policy, unsharded):
        assert not unsharded and policy is model
        slow = sample(policy, use_cache=True, eos_id=2, temperature=1.0, fixed_length=True)
    assert model.training  # restored after the rollout
    for a, b in zip(fast, slow, strict=True):
        assert torch.equal(a, b)


def test_clipped_objective_gradient():
    eps = 0.2
    # ratio:          above  below  inside above  below  inside
    ratio = torch.tensor([[1.5, 0.5, 1.1], [1.5, 0.5, 0.9]])
    adv = torch.tensor([1.0, -1.0])
    old = torch.log(torch.full_like(ratio, 0.25))
    logp = (old + torch.log(ratio)).requires_grad_(True)
    tmask = torch.ones_like(ratio)
    loss, _ = grpo_loss_sum(logp, old, adv, tmask, clip_eps=eps)
    loss.backward()
    g = logp.grad
    # Outside [1-ε, 1+ε] in the advantage's direction: clipped, no gradient.
    assert g[0, 0] == 0 and g[1, 1] == 0
    # Inside, or outside against the advantage's direction: -A·ρ/len.
    assert torch.allclose(g[0, 1:], torch.tensor([-0.5, -1.1]) / 3)
    assert torch.allclose(g[1, [0, 2]], torch.tensor([1.5, 0.9]) / 3)


def test_ppo_epochs_validation():
    base = {"recipe": "rl", "run_dir": "/x"}
    assert config_from_dict(base).rl.ppo_epochs == 1
    assert config_from_dict({**base, "rl": {"ppo_epochs": 3}}).rl.ppo_epochs == 3
    for bad, message in ((0, "at least 1"), (1.5, "integer"), (True, "integer")):
        with pytest.raises(ConfigError, match=f"ppo_epochs must be .*{message}"):
            config_from_dict({**base, "rl": {"ppo_epochs": bad}})


def test_second_update_of_a_batch_has_ratio_away_from_one(tmp_path):
    from node.train import train
    from node.train.start import run_prepare

    cfg = config_from_dict(
        {
            "recipe": "rl",
            "run_dir": str(tmp_path),
            "steps": 3,
            "global_batch": 2,
            "seq_len": 16,
            "lr": 0.01,
            "warmup_steps": 0,
            "lr_schedule": "constant",
            "max_operand": 3,
            "tokenizer_vocab": 64,
            "rl": {"group_size": 2, "max_new_tokens": 3, "ppo_epochs": 2},
        }
    )
    d = Dist()
    p = run_prepare(cfg, d)
    mbs, _ = p.task.prepare(p.model, 1)
    for mb in mbs:  # a random policy earns no reward: give the update a direction
        mb["adv"] = torch.tensor([1.0, -1.0] * (mb["ids"].size(0) // 2))

    def ratios(mb):
        with torch.no_grad():
            logp = token_logprobs(p.model, mb["ids"], mb["mask"])
        return torch.exp(logp - mb["old_logp"])[mb["tmask"] > 0]

    assert torch.allclose(ratios(mbs[0]), torch.tensor(1.0))  # the policy that sampled
    train._train_step(cfg, d, p, 1)
    again, _ = p.task.prepare(p.model, 2)
    assert again is mbs  # step 2 updates on the same samples ...
    assert (ratios(mbs[0]) - 1).abs().max() > 1e-3  # ... with the policy one update on
    train._train_step(cfg, d, p, 2)
    fresh, _ = p.task.prepare(p.model, 3)
    assert fresh is not mbs  # step 3 samples a new batch
    assert torch.allclose(ratios(fresh[0]), torch.tensor(1.0))
