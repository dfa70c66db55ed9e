"""run.json → RunConfig. The app writes run.json (recipes/launch.py); keys this
runtime does not know are ignored with a warning, so an older runtime still starts."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from .presets import PRESETS, Preset, get_preset

log = logging.getLogger("mtc.runtime")

RECIPES = ("llama-pretrain", "gemma-pretrain", "continued-pretrain", "sft", "rl")
SCHEDULES = ("cosine", "linear", "constant")

# In the run dir when SIGTERM comes: each rank exits at once, without the stop's
# checkpoint (node/train/train.py). mtc writes it before requeueing a job away from a
# straggler (recipes/straggler.py): the slow node would take longer to save it than
# the steps since the last checkpoint take to train again.
STOP_NOW_FILE = "stop-now"
# metrics.jsonl's event before a synchronous checkpoint save (recipes/hang.py reads it).
SAVING_EVENT = "checkpoint_saving"


class ConfigError(ValueError):
    pass


# Tokens per chunk of the loss (node.train.loss); here, torch-free, for the app's memory
# estimate too. fp32 logits of one chunk: 1 GB at a 128k vocabulary.
LOSS_CHUNK_TOKENS = 2048
AC_HELP = (
    'false or "none" (off), true or "full" (every decoder layer), an integer N or "every_N" '
    "(every N-th layer; 1 is full, 0 is none)"
)
_EVERY = re.compile(r"every_([0-9]{1,4})")


def ac_interval(value) -> int:
    """activation_checkpointing as the interval of checkpointed decoder layers: 0 none,
    1 every layer, N every N-th. ValueError (saying what is accepted) for anything else."""
    if value is None or value is False or value == "none":
        return 0
    if value is True or value == "full":
        return 1
    if isinstance(value, int) and 0 <= value <= 9999:
        return value
    m = _EVERY.fullmatch(value) if isinstance(value, str) else None
    if m and int(m.group(1)) >= 1:
        return int(m.group(1))
    raise ValueError(f"activation_checkpointing must be {AC_HELP}, not {value!r}")


@dataclass
class RLConfig:
    group_size: int = 4  # samples per prompt; advantages are relative within a group
    max_new_tokens: int = 8
    kl_coef: float = 0.0  # KL(policy || initial policy), k3 estimator; 0 skips the reference
    clip_eps: float = 0.2  # PPO-style ratio clip
    temperature: float = 1.0
    ppo_epochs: int = 1  # optimizer steps per batch of samples; >1 reuses it (ρ is clipped)


@dataclass
class RunConfig:
    recipe: str
    run_dir: str
    model: str = "tiny"
    family: str = "llama"
    steps: int = 60
    checkpoint_interval: int = 20
    global_batch: int = 8
    micro_batch: int | None = None  # per rank; None: the rank's whole share at once
    seq_len: int = 64
    lr: float = 3e-3
    lr_schedule: str = "cosine"
    warmup_steps: int = 5
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    precision: str = "fp32"  # fp32 | bf16 | auto (bf16 on CUDA)
    seed: int = 1234
    data_path: str | None = None
    init_from: str | None = None
    activation_checkpointing: bool | int | str = False  # see ac_interval
    compile: bool = False
    rl: RLConfig = field(default_factory=RLConfig)
    # Additions (all optional):
    log_interval: int = 1  # progress line every N steps (metrics.jsonl gets every step)
    keep_checkpoints: int | None = None  # keep the newest N complete ones; None keeps all
    # A cap on the characters of data_path read (None: all of it; the default corpus,
    # a demo, is capped at data.STDLIB_CHARS). The run reports what it read.
    corpus_bytes: int | None = None
    text_field: str = "text"  # the JSONL/Parquet/Arrow field holding each document
    tokenizer_vocab: int | None = None  # None: min(model vocab, 16384)
    max_operand: int = 9  # arithmetic tasks: operands in [0, max_operand]
    require_cuda: bool = False  # launched on real GPUs: no CUDA here is an error, not CPU

    @property
    def path(self) -> Path:
        return Path(self.run_dir)

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    def preset(self) -> Preset:
        return get_preset(self.family, self.model)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _family(recipe: str, raw: dict) -> str:
    """Implied by the pretraining recipes; else ``family`` (default llama), unless the
    model is a named shape of the other family only (``"model": "gemma-2b"``)."""
    if recipe == "llama-pretrain":
        return "llama"
    if recipe == "gemma-pretrain":
        return "gemma"
    family = raw.get("family") or "llama"
    model = raw.get("model") or "tiny"
    owners = [f for f, presets in PRESETS.items() if model in presets]
    if model not in PRESETS.get(family, {}) and len(owners) == 1:
        log.info("model %s is a %s shape: family %s", model, owners[0], owners[0])
        return owners[0]
    return family


def config_from_dict(raw: dict) -> RunConfig:
    if not isinstance(raw, dict):
        raise ConfigError("run.json must hold a JSON object")
    recipe = raw.get("recipe")
    if recipe not in RECIPES:
        raise ConfigError(f"recipe must be one of {', '.join(RECIPES)}, not {recipe!r}")
    if not raw.get("run_dir"):
        raise ConfigError("run_dir is required")
    known = {f.name for f in dataclasses.fields(RunConfig)}
    for key in sorted(set(raw) - known):
        log.warning("run.json: ignoring unknown key %r", key)
    values = {k: v for k, v in raw.items() if k in known and v is not None and k != "rl"}
    rl_raw = raw.get("rl") or {}
    rl_known = {f.name for f in dataclasses.fields(RLConfig)}
    rl = RLConfig(**{k: v for k, v in rl_raw.items() if k in rl_known and v is not None})
    values["family"] = _family(recipe, raw)
    cfg = RunConfig(**values, rl=rl)
    cfg.run_dir = str(Path(cfg.run_dir).resolve())
    _check(cfg)
    return cfg


def _check(cfg: RunConfig) -> None:
    problems = []
    try:
        cfg.preset()
    except ValueError as exc:
        problems.append(str(exc))
    for name in ("steps", "global_batch", "seq_len", "log_interval"):
        if int(getattr(cfg, name)) < 1:
            problems.append(f"{name} must be at least 1")
    if cfg.checkpoint_interval < 0:
        problems.append("checkpoint_interval must be >= 0 (0: only at the end)")
    if cfg.lr_schedule not in SCHEDULES:
        problems.append(f"lr_schedule must be one of {', '.join(SCHEDULES)}")
    if cfg.precision not in ("fp32", "bf16", "auto"):
        problems.append("precision must be fp32, bf16 or auto")
    if cfg.family not in ("llama", "gemma"):
        problems.append("family must be llama or gemma")
    if cfg.recipe == "continued-pretrain" and not cfg.init_from:
        problems.append(
            "continued-pretrain needs init_from (a checkpoint or Hugging Face model directory)"
        )
    if cfg.recipe == "rl" and cfg.rl.group_size < 2:
        problems.append("rl.group_size must be at least 2 (advantages are group-relative)")
    epochs = cfg.rl.ppo_epochs
    if cfg.recipe == "rl" and (isinstance(epochs, bool) or not isinstance(epochs, int)):
        problems.append("rl.ppo_epochs must be an integer")
    elif cfg.recipe == "rl" and epochs < 1:
        problems.append("rl.ppo_epochs must be at least 1")
    if cfg.corpus_bytes is not None and cfg.corpus_bytes < 1:
        problems.append("corpus_bytes must be at least 1 (or null: the whole corpus)")
    if not cfg.text_field:
        problems.append("text_field must name a field")
    try:
        ac_interval(cfg.activation_checkpointing)
    except ValueError as exc:
        problems.append(str(exc))
    if cfg.max_operand < 1:
        problems.append("max_operand must be at least 1")
    if problems:
        raise ConfigError("; ".join(problems))


def load_config(path: str | Path) -> RunConfig:
    with open(path, encoding="utf-8") as fh:
        try:
            raw = json.load(fh)
        except ValueError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    return config_from_dict(raw)
