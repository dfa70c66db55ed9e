"""Tiny Hugging Face-format models written by the tests themselves (save_pretrained, no
downloads), and the loss such a model has on the first batch a run of it sees."""

from __future__ import annotations

import json
from pathlib import Path

import torch

# Llama: <s>/</s> and no pad token (the runtime falls back to eos); Gemma: all three.
SPECIALS = {"llama": ("<s>", "</s>", None), "gemma": ("<bos>", "<eos>", "<pad>")}
TEXT = (
    "The quick brown fox jumps over the lazy dog. What is 3+4? 7. "
    "def add(a, b):\n    return a + b\n"
    "Training a small model on a little text is quick; 12+30=42 and 9-2=7.\n"
)


def corpus(n: int = 60) -> str:
    return "".join(f"{i}: {TEXT}" for i in range(n))


def _tokenizer(family: str, text: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bos, eos, pad = SPECIALS[family]
    specials = [t for t in (pad, bos, eos) if t]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320 if family == "llama" else 321,  # gemma: rows split unevenly over 2
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad
    )


def hf_model_write(out: Path, family: str, *, seed: int = 7, train_steps: int = 40) -> Path:
    """A tiny ``family`` model with its tokenizer in ``out`` (save_pretrained), trained a
    few steps on ``corpus()`` so its loss is well below a fresh initialisation's."""
    from transformers import GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM

    text = corpus()
    tok = _tokenizer(family, text)
    common = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    if family == "llama":
        config = LlamaConfig(**common, num_key_value_heads=2, tie_word_embeddings=False)
        cls = LlamaForCausalLM
    else:
        config = GemmaConfig(**common, num_key_value_heads=1, head_dim=8)
        cls = GemmaForCausalLM
    torch.manual_seed(seed)
    model = cls(config)
    ids = torch.tensor(tok(text)["input_ids"][: 16 * 32]).view(16, 32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(train_steps):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def first_batches(run_dir: Path, world: int, scratch: Path) -> list[dict]:
    """Every rank's micro-batches of step 1, rebuilt with the runtime's own code from the
    run's run.json and tokenizer (a pretraining corpus is tokenized again in ``scratch``)."""
    from node.train.config import config_from_dict
    from node.train.distributed import Dist
    from node.train.tokenizer import tokenizer_load

    raw = json.loads((run_dir / "run.json").read_text())
    cfg = config_from_dict({**raw, "run_dir": str(scratch)})
    ids = json.loads((run_dir / "model.json").read_text()).get("special_ids")
    tok = tokenizer_load(run_dir / "tokenizer.json", ids)
    batches = []
    for rank in range(world):
        d = Dist(rank=rank, world=world)
        if cfg.recipe == "sft":
            from node.train.sft import SFTTask

            task = SFTTask(cfg, d, tok)
        else:
            from node.train.pretrain import PretrainTask, pretrain_tokens

            task = PretrainTask(cfg, d, pretrain_tokens(cfg, Dist(), tok))
        mbs, _ = task.prepare(None, 1)
        batches += mbs
    return batches


@torch.no_grad()
def batch_loss(model, batches: list[dict]) -> float:
    """The runtime's loss: summed token cross-entropy over all ranks / counted tokens."""
    from node.train.model import lm_loss_sum

    model.eval()
    total = sum(
        float(lm_loss_sum(model, mb["input_ids"], mb.get("labels", mb["input_ids"])))
        for mb in batches
    )
    return total / sum(mb["weight"] for mb in batches)


def own_and_fresh_loss(model_dir: Path, batches: list[dict], seed: int) -> tuple[float, float]:
    """The saved model's loss on ``batches``, and a fresh one's (same config, ``seed``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    own = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return batch_loss(own, batches), batch_loss(fresh, batches)
