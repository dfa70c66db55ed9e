"""A registered version's portable form: the run's final DCP checkpoint loaded into one
whole transformers model (one process, no process group) and written with
``save_pretrained`` (safetensors), beside a ``PreTrainedTokenizerFast`` around the run's
tokenizer, so ``AutoModelForCausalLM``/``AutoTokenizer.from_pretrained(dir)`` load it.

Run by ``python -m node.export`` only, as the checkpoint's owner: it loads torch and
transformers, and DCP unpickles the checkpoint's metadata. The whole model is held in
this process's memory once (fp32, or bf16 for a bf16 run)."""

from __future__ import annotations

import json
from pathlib import Path

from . import EXPORT_INFO

# sft and rl learn "<bos> prompt response <eos>": a chat is the user's words as the
# prompt, the model's answer right after them (system messages have no place in it).
CHAT_RECIPES = ("sft", "rl")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% endif %}{% endfor %}"
)


class ExportError(Exception):
    """The checkpoint cannot be exported (a permanent failure: retrying will not help)."""


def _tokenizer(path: Path, max_length: int, ids: dict | None = None):
    """The run's tokenizer with its bos token put before every text: the sft and rl
    recipes train on ``<bos> prompt response <eos>``, so a plain ``tokenizer(prompt)``
    prompts it the way it learned. ``ids``: the bos/eos/pad ids of a Hugging Face model's
    tokenizer (model.json's ``special_ids``); else mtc's own special tokens."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    from node.train.tokenizer import BOS, EOS, PAD

    backend = Tokenizer.from_file(str(path))
    if ids:
        bos, eos, pad = (backend.id_to_token(ids[k]) for k in ("bos", "eos", "pad"))
    else:
        bos, eos, pad = BOS, EOS, PAD
    bos_id = backend.token_to_id(bos) if bos else None
    if bos_id is None or backend.token_to_id(eos) is None or backend.token_to_id(pad) is None:
        raise ExportError(f"{path.name} lacks the {pad}/{bos}/{eos} special tokens")
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        model_max_length=max_length,
    )


def _json_of(checkpoint: Path, name: str) -> dict | None:
    from node.train.checkpoint import checkpoint_json as read

    found = read(checkpoint, name)
    return found if isinstance(found, dict) else None


def _model(checkpoint: Path, tok):
    import torch
    from transformers import GenerationConfig

    from node.train.checkpoint import checkpoint_load
    from node.train.distributed import Dist
    from node.train.model import hf_config
    from node.train.presets import Preset

    saved = _json_of(checkpoint, "model.json")
    if not saved:
        raise ExportError("the checkpoint has no readable model.json (its model shape)")
    preset = Preset.from_dict(saved)
    if isinstance(saved.get("hf_config"), dict):  # a run from a Hugging Face directory
        from node.train.hf import hf_model_class

        config, cls = hf_model_class(saved["hf_config"])
        config.pad_token_id, config.bos_token_id = tok.pad_token_id, tok.bos_token_id
        config.eos_token_id = tok.eos_token_id
    else:
        config, cls = hf_config(
            preset, pad_id=tok.pad_token_id, bos_id=tok.bos_token_id, eos_id=tok.eos_token_id
        )
    config.use_cache = True  # training turned it off; generation wants it
    model = cls(config)
    checkpoint_load(d=Dist(), path=checkpoint, model=model)  # DCP reshards to one process
    state = _json_of(checkpoint, "trainer_state.json") or {}
    if (state.get("config") or {}).get("precision") == "bf16":
        model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model.eval()
    return model, preset, state


def checkpoint_export(*, checkpoint: Path, out_dir: Path, info: dict) -> dict:
    """Write ``out_dir`` (made here: it must not exist) from the DCP ``checkpoint``.
    Returns what it wrote (``info`` is saved beside, as provenance). mtc looks at the
    directory only after a clean exit, so a partial one is never taken."""
    from node.train.checkpoint import checkpoint_problem
    from node.train.tokenizer import TOKENIZER_FILE

    problem = checkpoint_problem(checkpoint)
    if problem:
        raise ExportError(f"{checkpoint}: {problem}")
    if not (checkpoint / TOKENIZER_FILE).is_file():
        raise ExportError(f"{checkpoint}: no {TOKENIZER_FILE}")
    saved = _json_of(checkpoint, "model.json") or {}
    max_length = int(saved.get("max_position", 8192))
    tok = _tokenizer(checkpoint / TOKENIZER_FILE, max_length, saved.get("special_ids"))
    model, preset, state = _model(checkpoint, tok)
    if state.get("recipe") in CHAT_RECIPES or info.get("recipe") in CHAT_RECIPES:
        tok.chat_template = CHAT_TEMPLATE

    out_dir.mkdir(mode=0o700)
    # transformers 5 always writes safetensors (model.safetensors + config.json).
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    summary = {
        **info,
        "checkpoint": str(checkpoint),
        "step": state.get("step"),
        "architecture": type(model).__name__,
        "preset": preset.to_dict(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "chat_template": bool(tok.chat_template),
    }
    (out_dir / EXPORT_INFO).write_text(json.dumps(summary, indent=1) + "\n")
    return summary
