"""Launching a recipe: validate its parameters, lay out the run directory, write
run.json, render the batch script, and submit it through the Slurm Job API."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.utils import timezone

from clusters.models import Cluster
from clusters.providers import get_provider
from clusters.runroot import NoRunRoot
from identity.runas import can_read
from jobs import services
from jobs.models import Job
from mtc import userfs
from mtc.fielderrors import FieldErrors
from registry.checkpoints import checkpoint_is_complete
from registry.names import is_model_ref
from registry.selectors import VersionRefError, register_as_problem, version_resolve
from slurm.config import KILL_WAIT_S
from slurm.submit import SubmissionError

from .catalog import Recipe, RecipeError, micro_batch_problem, recipe_get
from .gpu_launch import env_block, partition_pool
from .hf_init import hf_init_problem
from .memory import memory_problem, signal_lead

BODY_FIELDS = (
    "nodes",
    "partition",
    "gpus_per_node",
    "name",
    "overrides",
    "time_limit",
    "register_as",
    "account",
    "qos",
)
# Prints a TCP port free on this host (the kernel's pick).
FREE_PORT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
REQUEUE_FILE = "requeue.json"  # the runtime's (node/train/train.py) after a SIGUSR1 stop

SCRIPT = r"""#!/bin/bash
# mtc recipe {recipe_id}: {title}
# model {model}, {steps} steps, a checkpoint every {checkpoint_interval} steps in
#   {checkpoint_dir}
# Requeued or resubmitted, it resumes from the latest complete checkpoint there.
set -euo pipefail
export OMP_NUM_THREADS={threads}
export PYTHONPATH={repo}
{gpu_env}
export MTC_PYTHON={python} MTC_NPROC={nproc} MTC_RUN_CONFIG={config}
export RDZV_HOST={rdzv_host}
# The batch script runs on the first node, which hosts the rendezvous: a port free there
# now. (A port derived from the job id collides with another cluster's job of that id on
# a shared host, and with this job's own previous run after a requeue.)
export RDZV_PORT=$("$MTC_PYTHON" -IS -c {free_port})
echo "mtc: job $SLURM_JOB_ID on $SLURM_JOB_NUM_NODES node(s) $SLURM_JOB_NODELIST," \
     "restart ${{SLURM_RESTART_COUNT:-0}}, rendezvous $RDZV_HOST:$RDZV_PORT"
# SIGUSR1 ({lead} s before the time limit, or from scancel --signal=USR1) goes to the
# steps: torchrun passes it to its ranks, which save a checkpoint after the current step
# (torchrun waits {lead} s for them), leave requeue.json, and this script requeues the job.
trap 'echo "mtc: SIGUSR1: the ranks stop at a checkpoint"' USR1
# One torchrun per node; each learns its node rank from Slurm.
status=0
srun --ntasks-per-node=1 {srun_cpus}--kill-on-bad-exit=1 bash -c 'exec "$MTC_PYTHON" \
  -m torch.distributed.run --nnodes="$SLURM_JOB_NUM_NODES" --node-rank="$SLURM_NODEID" \
  --nproc-per-node="$MTC_NPROC" --master-addr="$RDZV_HOST" --master-port="$RDZV_PORT" \
  --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 --shutdown-timeout={lead} \
  -m node.train.train --config "$MTC_RUN_CONFIG"' || status=$?
if [ -f {requeue_file} ]; then
  rm -f {requeue_file}
  echo "mtc: stopped at a checkpoint on SIGUSR1; requeueing job $SLURM_JOB_ID"
  # slurmctld refuses a requeue while the job is in a transition (its steps still
  # completing, say): try for about a minute, saying why each try failed.
  for try in 1 2 3 4 5 6 7 8 9 10; do
    if why=$(scontrol requeue "$SLURM_JOB_ID" 2>&1); then
      # Slurm ends this script as part of the requeue; exiting first would end the job
      # (FAILED, with the ranks' status) before the requeue is through.
      sleep {kill_wait} || true
      exit "$status"
    fi
    echo "mtc: requeue try $try failed: $why"
    sleep "$(( try < 8 ? try : 8 ))"
  done
  echo "mtc: the job could not be requeued; it ends here (resubmit it to resume)"
fi
exit "$status"
"""


class LaunchError(FieldErrors):
    """Bad launch request: ``fields`` by JSON path (HTTP 400)."""


@dataclass
class LaunchPlan:
    recipe_id: str
    parameters: dict[str, Any]
    submission: services.Submission
    run_dir: Path
    run_config: dict[str, Any]
    script: str
    register_as: str = ""
    options: list[str] | None = None  # sbatch's arguments, as submitted (dry_run shows them)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"


RL_PARAMS = ("group_size", "max_new_tokens", "kl_coef", "ppo_epochs")  # run.json's "rl"


def _run_config(recipe_id: str, params: dict[str, Any], run_dir: Path, real_gpus: bool) -> dict:
    config = {k: v for k, v in params.items() if k not in RL_PARAMS}
    config["recipe"] = recipe_id
    if config.get("precision") == "auto":
        config["precision"] = "bf16" if real_gpus else "fp32"
    if recipe_id == "rl":
        config["rl"] = {k: params[k] for k in RL_PARAMS if k in params}
    config["run_dir"] = str(run_dir)
    return config


def new_run_dir(cluster: Cluster, recipe_id: str, owner=None) -> Path:
    """``runs/<recipe>-<stamp>`` in the owner's folder of the cluster (job_root)."""
    stamp = f"{timezone.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    try:
        root = services.job_root(cluster, services.job_account(owner), make=False) / "runs"
    except NoRunRoot as exc:  # a gce cluster with no shared storage for runs
        raise LaunchError(exc.fields) from exc
    return root / f"{recipe_id}-{stamp}"


def _init_from_version(params: dict[str, Any], errors: dict[str, str]) -> str | None:
    """``init_from: models/<name>@<ref>``: the version's checkpoint path for run.json;
    the version ("name@3") is recorded in the parameters, so the run's own registered
    version gets it as its parent."""
    value = params.get("init_from")
    if not isinstance(value, str) or not is_model_ref(value):
        return None
    try:
        version = version_resolve(value)
    except VersionRefError as exc:
        errors["overrides.init_from"] = str(exc)
        return None
    if not version.checkpoint_path or not checkpoint_is_complete(Path(version.checkpoint_path)):
        errors["overrides.init_from"] = (
            f"{version}'s checkpoint {version.checkpoint_path or '(none)'} is no longer there."
        )
        return None
    params["init_from_version"] = str(version)
    return version.checkpoint_path


def _unreadable_paths(recipe: Recipe, params: dict[str, Any], owner, errors: dict) -> None:
    """Every path a user names is refused unless their own account may read it: the job
    would run as them anyway, and mtc must not be the one that reads it for them. In
    single-user mode (and for mtc's own launches) it is asked as mtc."""
    account = services.job_account(owner)
    who = account.name if account is not None and account.isolated else "mtc"
    for param in recipe.params:
        value = params.get(param.name)
        if param.kind not in ("path", "checkpoint") or not isinstance(value, str):
            continue
        if is_model_ref(value) or f"overrides.{param.name}" in errors:
            continue  # a registered version: resolved (and checked) by _init_from_version
        if not can_read(account, value):
            errors[f"overrides.{param.name}"] = (
                f"Not found, or your account ({who}) may not read it."
            )
        elif param.kind == "checkpoint":  # a Hugging Face model directory is checked whole
            problem = hf_init_problem(account, value)
            if problem:
                errors[f"overrides.{param.name}"] = problem


def _register_as(body: dict, owner, errors: dict[str, str]) -> str:
    value = body.get("register_as")
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        errors["register_as"] = "Must be a model name (a string)."
        return ""
    problem = register_as_problem(value, owner)
    if problem:
        errors["register_as"] = problem
    return value


def recipe_plan(
    *,
    cluster: Cluster,
    recipe_id: str,
    body: Any,
    run_dir: Path | None = None,
    owner=None,
) -> LaunchPlan:
    """Everything a launch would do, without doing it (the page's preview). Give the
    previewed ``run_dir`` back to recipe_launch to launch exactly what was shown;
    ``owner`` is who would launch (whether they may register as ``register_as``)."""
    recipe = recipe_get(recipe_id)
    if recipe is None:
        raise LaunchError({"recipe": f"No recipe '{recipe_id}'."})
    if not isinstance(body, dict):
        raise LaunchError({"non_field_errors": "The body must be a JSON object."})
    errors: dict[str, str] = {}
    for key in body:
        if key not in BODY_FIELDS:
            errors[str(key)] = "Unknown field."
    try:
        params = recipe.validate(body.get("overrides"))
    except RecipeError as exc:
        errors.update(exc.fields)
        params = {}
    init_checkpoint = _init_from_version(params, errors)
    _unreadable_paths(recipe, params, owner, errors)
    register_as = _register_as(body, owner, errors)
    provider = get_provider(cluster.provider)
    real_gpus = not provider.gpus_emulated
    name = body.get("name") or f"{recipe_id}-{params.get('model', '')}".rstrip("-")
    run_dir = run_dir or new_run_dir(cluster, recipe_id, owner)
    gpus = body.get("gpus_per_node")
    pool = partition_pool(cluster.spec, body.get("partition") or "")
    if gpus is None and pool is not None and pool.gpus:
        gpus = pool.gpus  # a GPU pool: every GPU of the node, one rank each (when real)
    job_body = {
        "name": name,
        "script": "#!/bin/bash\n",
        "nodes": body.get("nodes", 1),
        "requeue": True,
    }
    for key in ("partition", "time_limit", "account", "qos"):
        if body.get(key):
            job_body[key] = body[key]
    if gpus is not None:
        job_body["gpus_per_node"] = gpus
    try:
        submission = services.job_validate(cluster=cluster, data=job_body)
    except SubmissionError as exc:
        errors.update(exc.fields)
        submission = None
    nproc = 1
    if submission is not None:
        nproc = submission.gpus_per_node if real_gpus and submission.gpus_per_node else 1
        problem = params and micro_batch_problem(params, submission.nodes * nproc)
        if problem:
            errors["overrides.micro_batch"] = problem
        if params and pool is not None and "overrides.micro_batch" not in errors:
            too_big = memory_problem(
                family=params.get("family") or recipe.family,
                params=params,
                nodes=submission.nodes,
                gpus=submission.gpus_per_node,
                accelerator=pool.accelerator,
            )
            if too_big:
                errors["nodes"] = too_big
    if errors:
        raise LaunchError(errors)
    srun_cpus = _ask_for_the_node(submission, pool, cluster.provider)
    lead = signal_lead(
        family=params.get("family") or recipe.family,
        model=params["model"],
        nodes=submission.nodes,
    )
    submission.signal = f"USR1@{lead}"
    config = _run_config(recipe_id, params, run_dir, real_gpus)
    if real_gpus and submission.gpus_per_node:
        config["require_cuda"] = True  # no CUDA there: fail fast, never train on CPU
    if init_checkpoint:  # the runtime reads a path; the parameters keep what was asked
        config["init_from"] = init_checkpoint
        config.pop("init_from_version", None)
    script = SCRIPT.format(
        recipe_id=recipe_id,
        title=recipe.title,
        model=params["model"],
        steps=params["steps"],
        checkpoint_interval=params["checkpoint_interval"],
        checkpoint_dir=run_dir / "checkpoints",
        threads=1 if not real_gpus else 8,
        repo=shlex.quote(provider.node_root()),
        rdzv_host="127.0.0.1"
        if cluster.provider == "local"
        else '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        # The nodes' python: this host's for local clusters, the image's on gce.
        python=shlex.quote(provider.node_python()),
        free_port=shlex.quote(FREE_PORT),
        nproc=nproc,
        config=shlex.quote(str(run_dir / "run.json")),
        gpu_env=env_block(pool.machine_type if pool else "", gpus=bool(submission.gpus_per_node)),
        srun_cpus=srun_cpus,
        lead=lead,
        kill_wait=KILL_WAIT_S,
        requeue_file=shlex.quote(str(run_dir / REQUEUE_FILE)),
    )
    submission.script = script
    return LaunchPlan(
        recipe_id=recipe_id,
        parameters=params,
        submission=submission,
        run_dir=run_dir,
        run_config=config,
        script=script,
        register_as=register_as,
        options=services.job_sbatch_args(
            cluster=cluster, owner=owner, submission=submission, make=False
        ),
    )


def _ask_for_the_node(submission, pool, provider: str) -> str:
    """On a GPU pool the job takes the whole node: its cores (--cpus-per-task where mtc
    knows them, else --exclusive, and srun hands the step all of them) and its memory
    (--mem=0). Returns the srun option the script needs for that."""
    if not submission.gpus_per_node:
        return ""
    submission.mem = "0"
    if pool is not None and pool.cpus and provider == "local":
        submission.cpus_per_task = pool.cpus
        return ""
    submission.exclusive = True
    return '--cpus-per-task="$SLURM_CPUS_ON_NODE" '


def recipe_launch(
    *, cluster: Cluster, recipe_id: str, body: Any, owner, run_dir: Path | None = None
) -> Job:
    """Validate, write run.json, submit. Raises LaunchError, JobConflict or SlurmError;
    a refused submission leaves no run directory behind."""
    plan = recipe_plan(
        cluster=cluster, recipe_id=recipe_id, body=body, run_dir=run_dir, owner=owner
    )
    account = services.job_account(owner)
    mine = account if account is not None and account.isolated else None
    if mine is not None:
        services.job_root(cluster, mine)  # users/<name>/, the account's
    run_config = (json.dumps(plan.run_config, indent=2) + "\n").encode()
    with services.owner_folders():
        if mine is not None:
            userfs.dir_own(plan.run_dir.parent, mine)  # runs/
        else:  # mtc's own launches, single-user mode: the cluster's folder
            userfs.dir_pass(plan.run_dir.parent, mode=0o755)
        try:
            # Made and filled through the new folder's descriptor, the account's from the
            # start: whatever the account renames or links meanwhile, nothing else is
            # written or handed over (the run name may be the user's choice).
            with userfs.dir_new(plan.run_dir, mine, mode=0o700 if mine else 0o755) as run_fd:
                os.close(userfs.mkdir_at(run_fd, "checkpoints", mine, mode=0o755))
                userfs.write_at(run_fd, "run.json", run_config, account=mine, mode=0o644)
        except FileExistsError as exc:
            raise LaunchError({"run_dir": "This run directory is taken; preview again."}) from exc
    try:
        job = services.job_submit(
            cluster=cluster,
            owner=owner,
            submission=plan.submission,
            recipe=plan.recipe_id,
            parameters={**plan.parameters, "nodes": plan.submission.nodes},
            checkpoint_dir=str(plan.checkpoint_dir),
        )
    except Exception:
        with contextlib.suppress(OSError):
            userfs.remove(plan.run_dir)
        raise
    if plan.register_as:  # read by registry.tasks.registrations_poll once it completes
        Job.objects.filter(pk=job.pk).update(register_as=plan.register_as)
        job.register_as = plan.register_as
    return job
