"""``init_from`` naming a Hugging Face-format model directory, checked at launch.

Like every path a user names, it is looked at as their account (the job runs as it, and
mtc must not read for them what they may not): the directory is listed and its
config.json read by ``ls``/``head`` run as the account, each file the run will open is
``test -r`` as it. The rules are the runtime's own (node/train/hfdir.py), which checks
them again when the run starts. A directory that is neither a Hugging Face model nor
looks like one (no config.json, no *.safetensors) is left to the checkpoint rules."""

from __future__ import annotations

import json
import subprocess

from identity.runas import can_read, run_as
from node.train.hfdir import CONFIG, TOKENIZER, hf_problem, looks_like_hf, weight_files

CONFIG_MAX_BYTES = 1_000_000  # a config.json is a few kB; more is not one
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C"}  # nothing of mtc's environment


def _output_as(account, argv: list[str]) -> str | None:
    """stdout of ``argv`` run as the account (None: as mtc), or None when it failed."""
    kw: dict = dict(
        env=_ENV,
        cwd="/",
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    try:
        done = run_as(account, argv, **kw) if account is not None else subprocess.run(argv, **kw)
    except (OSError, subprocess.TimeoutExpired, UnicodeDecodeError):
        return None
    return done.stdout if done.returncode == 0 else None


def hf_init_problem(account, path: str) -> str | None:
    """Why the readable directory ``path`` is not a Hugging Face model the runtime can
    start from, or None (also when it is not meant as one: a checkpoint directory)."""
    listing = _output_as(account, ["ls", "-A", "-1", "--", path])
    if listing is None:
        return None
    names = set(listing.splitlines())
    if not looks_like_hf(names):
        return None
    config = None
    if CONFIG in names:
        text = _output_as(account, ["head", "-c", str(CONFIG_MAX_BYTES), "--", f"{path}/{CONFIG}"])
        try:
            config = json.loads(text) if text else None
        except ValueError:
            config = None
    problem = hf_problem(names, config)
    if problem:
        return f"Not a Hugging Face model the recipes can start from: {problem}."
    for name in (TOKENIZER, *weight_files(names)):
        if not can_read(account, f"{path.rstrip('/')}/{name}"):
            return f"{name} in this Hugging Face model directory: your account may not read it."
    return None
