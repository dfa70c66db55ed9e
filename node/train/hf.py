"""Starting a run from a Hugging Face-format model directory (``init_from``).

The run's model is the directory's ``config.json`` (architecture, sizes, rope, tied
embeddings...), not a preset: it is kept whole in run_dir/model.json (``hf_config``,
beside the preset-shaped summary the metrics use), so a resume, a later run from this
run's checkpoint and a registry export rebuild the same model. The tokenizer is the
directory's ``tokenizer.json`` with its bos/eos/pad ids (``special_ids`` in model.json).

Weights are loaded sharded: the model is built on meta and sharded as usual, then each
rank reads, with safetensors' ``get_slice``, only the rows of each tensor its FSDP2
shard holds; no process ever holds the whole state dict.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from .hfdir import CONFIG, HF_MODEL_TYPES, INDEX, TOKENIZER, hf_dir_problem, read_json
from .presets import Preset


class HFError(ValueError):
    """The directory is not a usable Hugging Face model (exit code 2)."""


def hf_model_class(config: dict):
    """(config object, *ForCausalLM class) for a config.json's contents."""
    model_type = config.get("model_type")
    if model_type == "llama":
        from transformers import LlamaConfig as C
        from transformers import LlamaForCausalLM as M
    elif model_type == "gemma":
        from transformers import GemmaConfig as C
        from transformers import GemmaForCausalLM as M
    elif model_type == "gemma2":
        from transformers import Gemma2Config as C
        from transformers import Gemma2ForCausalLM as M
    else:
        raise HFError(f"model_type {model_type!r} is not supported ({', '.join(HF_MODEL_TYPES)})")
    return C.from_dict(config), M


def hf_config_read(path: Path) -> dict:
    problem = hf_dir_problem(path)
    if problem:
        raise HFError(f"init_from {path}: {problem}")
    return read_json(path / CONFIG) or {}


def hf_preset(config: dict, name: str) -> Preset:
    """The shape summary of a config (parameter count, FLOPs, what the run reports)."""
    c, _ = hf_model_class(config)
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    rope = getattr(c, "rope_parameters", None) or {}
    return Preset(
        family=HF_MODEL_TYPES[config["model_type"]],
        name=name,
        arch=config["model_type"],
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate_size=c.intermediate_size,
        max_position=c.max_position_embeddings,
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        rms_norm_eps=c.rms_norm_eps,
        tie_embeddings=bool(c.tie_word_embeddings),
        description=f"Hugging Face model from {name}",
    )


def _token_id(tok, value) -> int | None:
    if isinstance(value, dict):  # {"content": "<s>", ...} as tokenizer_config.json has it
        value = value.get("content")
    return tok.token_to_id(value) if isinstance(value, str) else None


def _first_id(value) -> int | None:
    if isinstance(value, list):  # generation_config.json may list several eos ids
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def hf_special_ids(path: Path, config: dict) -> dict[str, int]:
    """bos/eos/pad ids: the tokenizer's own tokens (tokenizer_config.json), else the ids
    of generation_config.json or config.json; no pad falls back to eos, no bos to eos."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / TOKENIZER))
    tok_cfg = read_json(path / "tokenizer_config.json") or {}
    sources = [read_json(path / "generation_config.json") or {}, config]
    ids: dict[str, int | None] = {}
    for role in ("bos", "eos", "pad"):
        found = _token_id(tok, tok_cfg.get(f"{role}_token"))
        for src in sources:
            if found is None:
                found = _first_id(src.get(f"{role}_token_id"))
        ids[role] = found
    if ids["eos"] is None:
        raise HFError(f"init_from {path}: the tokenizer names no eos token (nor does the config)")
    ids["pad"] = ids["eos"] if ids["pad"] is None else ids["pad"]
    ids["bos"] = ids["eos"] if ids["bos"] is None else ids["bos"]
    return {k: int(v) for k, v in ids.items()}


def _weight_map(path: Path) -> dict[str, str]:
    """tensor name -> the safetensors file holding it."""
    from safetensors import safe_open

    index = read_json(path / INDEX)
    if index and isinstance(index.get("weight_map"), dict):
        return dict(index["weight_map"])
    found = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            found.update({k: f.name for k in fh.keys()})
    return found


def _local_box(param) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """(this rank's tensor to write, the slice of the full tensor it holds)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return param.data, tuple(slice(0, n) for n in param.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(
        param.shape, param.device_mesh, param.placements
    )
    return param.to_local(), tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))


@torch.no_grad()
def hf_weights_load(model, path: Path) -> None:
    """Copy the directory's weights into the (possibly sharded) model, each rank reading
    only its own rows of each tensor. A tied output projection is the embedding."""
    from safetensors import safe_open

    where = _weight_map(path)
    with contextlib.ExitStack() as stack:
        files: dict[str, object] = {}
        for name, param in model.named_parameters():  # tied weights appear once
            if name not in where:
                raise HFError(f"init_from {path}: the weights have no tensor {name}")
            fname = where[name]
            if fname not in files:
                files[fname] = stack.enter_context(
                    safe_open(str(path / fname), framework="pt", device="cpu")
                )
            src = files[fname].get_slice(name)
            if list(src.get_shape()) != list(param.shape):
                raise HFError(
                    f"init_from {path}: {name} has shape {src.get_shape()}, "
                    f"config.json makes it {list(param.shape)}"
                )
            local, box = _local_box(param)
            if local.numel():
                local.copy_(src[box].to(local.device))


def model_json(preset: Preset, hf_config: dict | None, special_ids: dict | None) -> str:
    data = preset.to_dict()
    if hf_config is not None:
        data["hf_config"] = hf_config
        data["special_ids"] = special_ids
    return json.dumps(data, indent=1)
