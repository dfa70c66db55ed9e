"""Everything before the first step: where the run starts (its own newest complete
checkpoint, else ``init_from``: a checkpoint or a Hugging Face model directory, else
scratch), the model shape, the tokenizer, the sharded model and optimizer with their
state loaded, and the recipe's task."""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from .checkpoint import (
    checkpoint_find,
    checkpoint_json,
    checkpoint_load,
    checkpoint_resolve,
    checkpoint_step,
    rng_restore,
)
from .config import RunConfig
from .corpus import corpus_documents
from .data import STDLIB_CHARS
from .distributed import Dist
from .hf import HFError, hf_config_read, hf_preset, hf_special_ids, hf_weights_load, model_json
from .hfdir import hf_dir_problem, is_hf_dir
from .model import model_build
from .optim import optimizer_build
from .presets import Preset
from .shards import is_shard_set
from .tasks import PairSource
from .tokenizer import TOKENIZER_FILE, Tok, tokenizer_load, tokenizer_train

log = logging.getLogger("mtc.runtime")
PRETRAIN = ("llama-pretrain", "gemma-pretrain", "continued-pretrain")
TOKENIZER_TRAIN_BYTES = 4_000_000


class RunError(Exception):
    """A problem with the run's inputs (exit code 2)."""


@dataclass
class Prepared:
    preset: Preset
    tok: Tok
    model: object
    optimizer: object
    task: object
    precision: str
    start_step: int = 0
    resume: Path | None = None  # the run's own checkpoint it resumed from
    init: Path | None = None  # the init_from checkpoint it started from
    ref_init: str | None = None  # the initial policy's checkpoint, kept across resumes
    skipped: list = field(default_factory=list)  # [(path, why)] checkpoints not usable


def _start_plan(cfg: RunConfig, d: Dist) -> dict:
    """Rank 0 decides where the run starts; every rank gets the same answer."""
    plan: dict = {"resume": None, "init": None, "hf": False, "skipped": [], "error": None}
    if d.is_main:
        resume, skipped = checkpoint_find(cfg.checkpoint_dir)
        plan["skipped"] = [(str(p), why) for p, why in skipped]
        if resume is not None:
            plan["resume"] = str(resume)
        elif cfg.init_from and is_hf_dir(cfg.init_from):
            problem = hf_dir_problem(cfg.init_from)
            plan["error"] = f"init_from {cfg.init_from}: {problem}" if problem else None
            plan["init"], plan["hf"] = str(Path(cfg.init_from).resolve()), True
        elif cfg.init_from:
            init, skipped = checkpoint_resolve(cfg.init_from)
            plan["skipped"] += [(str(p), why) for p, why in skipped]
            if init is None:
                plan["error"] = (
                    f"init_from {cfg.init_from}: no complete checkpoint there, and not a "
                    "Hugging Face model directory (no config.json, no *.safetensors)"
                )
            else:
                plan["init"] = str(init)
    return d.broadcast(plan)


def _preset(cfg: RunConfig, source: Path | None) -> Preset:
    """The configured shape, or the one the starting checkpoint was trained with."""
    preset = cfg.preset()
    saved = checkpoint_json(source, "model.json") if source else None
    if saved:
        saved_preset = Preset.from_dict(saved)
        if saved_preset != preset:
            log.warning(
                "model: using the checkpoint's %s/%s shape, not the configured %s/%s",
                saved_preset.family,
                saved_preset.name,
                preset.family,
                preset.name,
            )
            return saved_preset
    return preset


def _shape(
    cfg: RunConfig, source: Path | None, hf: bool
) -> tuple[Preset, dict | None, dict | None]:
    """(preset, Hugging Face config or None, special token ids or None): read from an
    init_from Hugging Face directory, else kept in the starting checkpoint's model.json
    (a run that began from a Hugging Face directory carries its config along)."""
    if hf and source is not None:
        config = hf_config_read(source)
        preset = hf_preset(config, source.name)
        log.info("model: %s's config.json (%s)", source, config["model_type"])
        return preset, config, hf_special_ids(source, config)
    saved = (checkpoint_json(source, "model.json") if source else None) or {}
    return _preset(cfg, source), saved.get("hf_config"), saved.get("special_ids")


def _weights_from(d: Dist, path: Path, model) -> None:
    """Model weights only (init_from, the rl reference policy)."""
    if is_hf_dir(path):
        hf_weights_load(model, path)
    else:
        checkpoint_load(d=d, path=path, model=model)


def _tokenizer(
    cfg: RunConfig, d: Dist, source: Path | None, preset: Preset, ids: dict | None = None
) -> Tok:
    """run_dir/tokenizer.json: kept from an earlier attempt, copied from the checkpoint
    the run starts from, or trained here on the recipe's own text."""
    path = cfg.path / TOKENIZER_FILE
    shard_set = cfg.recipe in PRETRAIN and is_shard_set(cfg.data_path)
    if d.is_main and not path.exists():
        src = source / TOKENIZER_FILE if source else None
        if shard_set and (src is None or not src.exists()):
            src = _shard_tokenizer(cfg.data_path)
        if src is not None and src.exists():
            shutil.copyfile(src, path.with_suffix(".tmp"))
            os.replace(path.with_suffix(".tmp"), path)
            log.info("tokenizer: from %s", src)
        else:
            vocab = cfg.tokenizer_vocab or min(preset.vocab_size, 16384)
            if cfg.recipe in PRETRAIN:
                cap = min(cfg.corpus_bytes or STDLIB_CHARS, TOKENIZER_TRAIN_BYTES)
                texts = corpus_documents(cfg.data_path, cfg.text_field, cap)
            else:
                texts = PairSource(cfg.data_path, cfg.seed, cfg.max_operand, 0).tokenizer_texts()
            t0 = time.time()
            tok = tokenizer_train(texts, vocab)
            tok.save(path)
            log.info("tokenizer: trained a %d-token BPE in %.1fs", tok.vocab_size, time.time() - t0)
    d.barrier()
    tok = tokenizer_load(path, ids)
    if shard_set:
        theirs = tokenizer_load(_shard_tokenizer(cfg.data_path), ids)
        if theirs.fingerprint() != tok.fingerprint():
            raise RunError(
                f"the shards in {cfg.data_path} were tokenized with another tokenizer than "
                "this run's (its checkpoint's); tokenize the data with that one "
                "(mtc data tokenize --tokenizer)"
            )
    if tok.vocab_size > preset.vocab_size:
        raise RunError(
            f"tokenizer has {tok.vocab_size} tokens, the {preset.name} model only "
            f"{preset.vocab_size}"
        )
    return tok


def _shard_tokenizer(data_path: str) -> Path:
    p = Path(data_path)
    found = (p if p.is_dir() else p.parent) / TOKENIZER_FILE
    if not found.exists():
        raise RunError(
            f"pre-tokenized data {data_path} needs the {TOKENIZER_FILE} it was made with "
            "beside it (mtc data tokenize writes one)"
        )
    return found


def _task(cfg: RunConfig, d: Dist, tok: Tok, ref_model):
    if cfg.recipe in PRETRAIN:
        from .pretrain import PretrainTask, pretrain_tokens

        return PretrainTask(cfg, d, pretrain_tokens(cfg, d, tok))
    if cfg.recipe == "sft":
        from .sft import SFTTask

        return SFTTask(cfg, d, tok)
    from .rl import RLTask

    return RLTask(cfg, d, tok, ref_model)


def run_prepare(cfg: RunConfig, d: Dist) -> Prepared:
    if cfg.global_batch < d.world:
        raise RunError(f"global_batch {cfg.global_batch} is smaller than the {d.world} ranks")
    if d.is_main:
        cfg.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    d.barrier()
    plan = _start_plan(cfg, d)
    if plan["error"]:
        raise RunError(plan["error"])
    resume = Path(plan["resume"]) if plan["resume"] else None
    init = Path(plan["init"]) if plan["init"] else None
    source = resume or init
    if resume is not None:
        ref_init = (checkpoint_json(resume, "trainer_state.json") or {}).get("init_checkpoint")
    else:
        ref_init = plan["init"]

    try:
        preset, hf_cfg, ids = _shape(cfg, source, plan["hf"] and resume is None)
    except HFError as exc:
        raise RunError(str(exc)) from None
    if d.is_main:
        (cfg.path / "model.json").write_text(model_json(preset, hf_cfg, ids))
    tok = _tokenizer(cfg, d, source, preset, ids)

    precision = cfg.precision
    if precision == "auto":
        precision = "bf16" if d.device.type == "cuda" else "fp32"
    build = {
        "d": d,
        "seed": cfg.seed,
        "precision": precision,
        "activation_checkpointing": cfg.activation_checkpointing,
        "compile": cfg.compile,
        "hf": hf_cfg,
    }
    model = model_build(preset, **build)
    optimizer = optimizer_build(model, lr=cfg.lr, weight_decay=cfg.weight_decay)
    start_step = 0
    if resume is not None:
        extra = checkpoint_load(d=d, path=resume, model=model, optimizer=optimizer)
        start_step = checkpoint_step(resume)
        if extra is not None:
            rng_restore(extra["rng"])
        else:
            log.warning("resume: no RNG state for this rank/world size; data order is unaffected")
    elif init is not None:
        try:
            _weights_from(d, init, model)
        except HFError as exc:
            raise RunError(str(exc)) from None

    ref_model = None
    if cfg.recipe == "rl" and cfg.rl.kl_coef > 0:
        # The reference policy is where the run started: init_from's weights, or the
        # seed's initialisation (rebuilt the same way), whatever step it resumes at.
        ref_model = model_build(preset, **{**build, "compile": False})
        if ref_init:
            _weights_from(d, Path(ref_init), ref_model)
        ref_model.requires_grad_(False)
    return Prepared(
        preset=preset,
        tok=tok,
        model=model,
        optimizer=optimizer,
        task=_task(cfg, d, tok, ref_model),
        precision=precision,
        start_step=start_step,
        resume=resume,
        init=init,
        ref_init=ref_init,
        skipped=plan["skipped"],
    )
