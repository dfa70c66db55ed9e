"""The recipe catalog: each recipe's typed parameters with defaults and limits.

Django-free on purpose: the CLI, the API and the pages validate with it, and the
runtime on the nodes reads what it produced (run.json)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from mtc.fielderrors import FieldErrors
from node.train.config import AC_HELP, ac_interval
from registry.names import REF_HELP, is_model_ref, model_ref_parse

PATH_RE = re.compile(r"^/[A-Za-z0-9._/+-]{0,1000}$")


class RecipeError(FieldErrors):
    """``fields`` maps each bad parameter (``overrides.<name>``) to a message."""


@dataclass(frozen=True)
class Param:
    name: str
    # int, float, str, bool, choice, path, checkpoint (a path or models/<name>@<ref>),
    # checkpointing (activation checkpointing: node.train.config.ac_interval's forms)
    kind: str
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    required: bool = False

    def check(self, value: Any) -> tuple[Any, str | None]:
        """The clean value, or an error message."""
        if value is None:
            if self.required:
                return None, "This parameter is required."
            # null means "the default" only where the default is itself none.
            return (None, None) if self.default is None else (None, "Must not be null.")
        if self.kind == "checkpointing":
            try:
                ac_interval(value)
            except ValueError:
                return None, f"Must be {AC_HELP}."
            return value, None
        if self.kind == "bool":
            return (value, None) if isinstance(value, bool) else (None, "Must be true or false.")
        if self.kind in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return None, "Must be a number."
            # JSON numbers may be 1e999 (inf) or have 400 digits (float() overflows).
            if isinstance(value, float) and not math.isfinite(value):
                return None, "Must be a finite number."
            if self.kind == "int":
                if isinstance(value, float) and not value.is_integer():
                    return None, "Must be a whole number."
                value = int(value)
            else:
                try:
                    value = float(value)
                except OverflowError:
                    return None, "Must be a finite number."
            if self.minimum is not None and value < self.minimum:
                return None, f"Must be at least {self.minimum:g}."
            if self.maximum is not None and value > self.maximum:
                return None, f"Must be at most {self.maximum:g}."
            return value, None
        if not isinstance(value, str):
            return None, "Must be a string."
        if self.kind == "choice" and value not in self.choices:
            return None, f"Must be one of: {', '.join(self.choices)}."
        if self.kind == "checkpoint" and is_model_ref(value):
            # Only the form is checked here; the launch looks the version up.
            if model_ref_parse(value) is None:
                return None, f"A registered version is named {REF_HELP}"
            return value, None
        if self.kind in ("path", "checkpoint") and (
            not PATH_RE.fullmatch(value) or ".." in value.split("/")
        ):
            return None, "Must be an absolute path of letters, digits and ._/+- without '..'."
        if self.kind == "str" and (len(value) > 200 or not value.isprintable()):
            return None, "At most 200 printable characters."
        return value, None

    def describe(self) -> dict:
        out = {
            "name": self.name,
            "type": self.kind,
            "default": self.default,
            "help": self.help,
            "required": self.required,
        }
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.choices:
            out["choices"] = list(self.choices)
        return out


LLAMA_MODELS = ("tiny", "small", "llama3-8b", "llama3-70b")
GEMMA_MODELS = ("tiny", "small", "gemma-2b", "gemma-7b")


def _common(
    models: tuple[str, ...], *, steps: int, lr: float, seq_len: int, data_help: str
) -> list[Param]:
    return [
        Param("model", "choice", "tiny", "Model size preset.", choices=models),
        Param("steps", "int", steps, "Optimizer steps.", 1, 10_000_000),
        Param("checkpoint_interval", "int", 20, "Save a checkpoint every N steps.", 1, 1_000_000),
        Param("global_batch", "int", 8, "Sequences per optimizer step, over all ranks.", 1, 65536),
        Param(
            "micro_batch",
            "int",
            None,
            "Sequences per forward and backward on each rank (gradient accumulation); "
            "global_batch must be a multiple of ranks × micro_batch. Empty: each rank's "
            "whole share at once.",
            1,
            65536,
        ),
        Param("seq_len", "int", seq_len, "Tokens per sequence.", 8, 131072),
        Param("lr", "float", lr, "Peak learning rate.", 1e-7, 1.0),
        Param(
            "lr_schedule",
            "choice",
            "cosine",
            "Learning-rate schedule after warm-up.",
            choices=("cosine", "linear", "constant"),
        ),
        Param("warmup_steps", "int", 5, "Linear warm-up steps.", 0, 1_000_000),
        Param("min_lr_ratio", "float", 0.1, "Final learning rate as a share of the peak.", 0, 1),
        Param("weight_decay", "float", 0.01, "AdamW weight decay.", 0, 1),
        Param("grad_clip", "float", 1.0, "Gradient norm clip (0: off).", 0, 1000),
        Param(
            "precision",
            "choice",
            "auto",
            "bf16 on GPUs, fp32 on CPUs when auto.",
            choices=("auto", "fp32", "bf16"),
        ),
        Param("seed", "int", 1234, "Random seed (data order and initialisation).", 0, 2**31 - 1),
        Param("data_path", "path", None, data_help),
        Param(
            "activation_checkpointing",
            "checkpointing",
            "none",
            'Recompute decoder layers\' activations in backward: "none", "full", or "every_N" '
            "(every N-th layer; also true/false or an integer N).",
        ),
        Param("compile", "bool", False, "torch.compile the model."),
    ]


@dataclass(frozen=True)
class Recipe:
    recipe_id: str
    title: str
    description: str
    family: str
    params: tuple[Param, ...] = field(default_factory=tuple)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def validate(self, overrides: Any) -> dict[str, Any]:
        """Defaults with the overrides applied; raises RecipeError naming each bad one."""
        if overrides is None:
            overrides = {}
        if not isinstance(overrides, dict):
            raise RecipeError({"overrides": "Must be an object of parameter: value."})
        errors: dict[str, str] = {}
        clean = self.defaults()
        for key, value in overrides.items():
            param = self.param(str(key))
            if param is None:
                errors[f"overrides.{key}"] = f"Unknown parameter for {self.recipe_id}."
                continue
            value, error = param.check(value)
            if error:
                errors[f"overrides.{key}"] = error
            else:
                clean[key] = value
        for param in self.params:
            if (
                param.required
                and clean.get(param.name) is None
                and (f"overrides.{param.name}" not in errors)
            ):
                errors[f"overrides.{param.name}"] = "This parameter is required."
        if not errors and clean.get("checkpoint_interval", 1) > clean.get("steps", 1):
            clean["checkpoint_interval"] = clean["steps"]
        if errors:
            raise RecipeError(errors)
        return clean

    def describe(self) -> dict:
        return {
            "id": self.recipe_id,
            "title": self.title,
            "description": self.description,
            "family": self.family,
            "parameters": [p.describe() for p in self.params],
        }


INIT_FROM = Param(
    "init_from",
    "checkpoint",
    None,
    "Where to start: a registered version (models/<name>@<alias or version>), the "
    "checkpoint directory of an earlier run (its latest complete checkpoint is loaded), or "
    "a local Hugging Face model directory (config.json of a llama, gemma or gemma2 model, "
    "*.safetensors, tokenizer.json): the run's model is that config, its tokenizer that "
    "tokenizer, and the model preset is ignored.",
)
MAX_OPERAND = Param(
    "max_operand", "int", 9, "Largest operand of the generated arithmetic tasks.", 1, 999
)
FAMILY = Param("family", "choice", "llama", "Model architecture.", choices=("llama", "gemma"))
_PRETRAIN_DATA = (
    "Text file or directory; JSONL, Parquet or Arrow (the text_field column); or "
    "pre-tokenized shards (.bin/.npy, from `mtc data tokenize`). Read whole. Default: "
    "the first 2 M characters of the Python standard library's sources."
)
# Pretraining only: the run reports what it read (dataset_documents, dataset_tokens).
PRETRAIN_DATA_PARAMS = (
    Param("text_field", "str", "text", "The JSONL/Parquet/Arrow field holding each document."),
    Param(
        "corpus_bytes",
        "int",
        None,
        "Read at most this many characters of data_path (empty: all of it).",
        1,
        10**15,
    ),
)
_SFT_DATA = "JSONL with 'prompt' and 'response'; default: generated arithmetic Q&A."

RECIPES: dict[str, Recipe] = {
    r.recipe_id: r
    for r in (
        Recipe(
            "llama-pretrain",
            "Llama pretraining",
            "Pretrain a Llama-architecture model from scratch (FSDP2, checkpoints, resume).",
            "llama",
            (
                *_common(LLAMA_MODELS, steps=60, lr=3e-3, seq_len=64, data_help=_PRETRAIN_DATA),
                *PRETRAIN_DATA_PARAMS,
            ),
        ),
        Recipe(
            "gemma-pretrain",
            "Gemma pretraining",
            "Pretrain a Gemma-architecture model from scratch.",
            "gemma",
            (
                *_common(GEMMA_MODELS, steps=60, lr=3e-3, seq_len=64, data_help=_PRETRAIN_DATA),
                *PRETRAIN_DATA_PARAMS,
            ),
        ),
        Recipe(
            "continued-pretrain",
            "Continued pretraining",
            "Continue pretraining from an existing checkpoint on new text.",
            "llama",
            (
                FAMILY,
                *_common(
                    LLAMA_MODELS + GEMMA_MODELS[2:],
                    steps=40,
                    lr=1e-3,
                    seq_len=64,
                    data_help=_PRETRAIN_DATA,
                ),
                *PRETRAIN_DATA_PARAMS,
                Param("init_from", "checkpoint", None, INIT_FROM.help, required=True),
            ),
        ),
        Recipe(
            "sft",
            "Supervised fine-tuning",
            "Fine-tune on prompt/response pairs; the loss counts response tokens only.",
            "llama",
            (
                FAMILY,
                *_common(
                    LLAMA_MODELS + GEMMA_MODELS[2:],
                    steps=60,
                    lr=3e-3,
                    seq_len=32,
                    data_help=_SFT_DATA,
                ),
                INIT_FROM,
                MAX_OPERAND,
            ),
        ),
        Recipe(
            "rl",
            "Reinforcement learning (GRPO)",
            "Group-relative policy optimisation with a verifiable reward (arithmetic); start "
            "it from an sft checkpoint (init_from): a model from scratch earns no reward.",
            "llama",
            (
                FAMILY,
                *_common(
                    LLAMA_MODELS + GEMMA_MODELS[2:],
                    steps=40,
                    lr=1e-3,
                    seq_len=32,
                    data_help=_SFT_DATA,
                ),
                INIT_FROM,
                Param("group_size", "int", 4, "Samples per prompt.", 2, 64),
                Param("max_new_tokens", "int", 8, "Tokens generated per sample.", 1, 4096),
                Param("kl_coef", "float", 0.0, "KL penalty to the initial policy.", 0, 10),
                Param(
                    "ppo_epochs",
                    "int",
                    1,
                    "Optimizer steps per batch of samples (PPO clips the 2nd and later).",
                    1,
                    64,
                ),
                MAX_OPERAND,
            ),
        ),
    )
}


def micro_batch_problem(params: dict[str, Any], ranks: int) -> str | None:
    """Why ``micro_batch`` cannot be used with ``ranks`` ranks, or None. Every rank must
    run as many micro-batches as the others, or the extra backward waits forever."""
    micro, total = params.get("micro_batch"), params.get("global_batch") or 0
    if not micro or (total % ranks == 0 and (total // ranks) % micro == 0):
        return None
    return (
        f"global_batch {total} over {ranks} rank(s) does not split into micro-batches of "
        f"{micro}: make global_batch a multiple of {ranks * micro}."
    )


def recipe_get(recipe_id: str) -> Recipe | None:
    return RECIPES.get(recipe_id)
