"""What makes a directory a Hugging Face-format model that ``init_from`` can start from:
``config.json`` naming a supported ``model_type``, safetensors weights and a fast
tokenizer (``tokenizer.json``). Nothing heavy is imported here: the app checks a launch's
``init_from`` with these same rules (as the user's account), the runtime again on start."""

from __future__ import annotations

import json
from pathlib import Path

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
# model_type -> the recipe family it trains as; each has a transformers *ForCausalLM.
HF_MODEL_TYPES = {"llama": "llama", "gemma": "gemma", "gemma2": "gemma"}


def looks_like_hf(names: set[str]) -> bool:
    """A directory listing that is meant as a Hugging Face model (not an mtc checkpoint,
    which has neither a config.json nor safetensors files)."""
    return CONFIG in names or any(n.endswith(".safetensors") for n in names)


def weight_files(names: set[str]) -> list[str]:
    return sorted(n for n in names if n.endswith(".safetensors"))


def hf_problem(names: set[str], config: dict | None) -> str | None:
    """Why a directory with these file ``names`` and parsed ``config`` (None: unreadable
    or not JSON) is not a supported Hugging Face model, or None when it is."""
    if CONFIG not in names:
        return f"not a Hugging Face model directory: no {CONFIG}"
    if not isinstance(config, dict):
        return f"{CONFIG} is not readable JSON"
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        supported = ", ".join(HF_MODEL_TYPES)
        return f"{CONFIG} has model_type {model_type!r}; supported: {supported}"
    if not weight_files(names):
        return "no safetensors weights (*.safetensors) beside config.json"
    if TOKENIZER not in names:
        return f"no {TOKENIZER} (a fast tokenizer, as save_pretrained writes it)"
    return None


def read_json(path: Path) -> dict | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None


def hf_dir_problem(path: str | Path) -> str | None:
    """``hf_problem`` of a local directory (the runtime's check)."""
    p = Path(path)
    if not p.is_dir():
        return "not a directory"
    names = {f.name for f in p.iterdir() if f.is_file()}
    return hf_problem(names, read_json(p / CONFIG) if CONFIG in names else None)


def is_hf_dir(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and looks_like_hf({f.name for f in p.iterdir() if f.is_file()})
