"""Job submissions: every option checked, then turned into an `sbatch` argument
list. The script goes to sbatch on stdin; nothing reaches a shell."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mtc.fielderrors import FieldErrors

# Control characters, and NEL and the line/paragraph separators, which some readers
# of a name (logs, terminals, JSON consumers) take as a line break.
NAME_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]|#sbatch|\.\./", re.IGNORECASE)
PARTITION_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
ENV_RESERVED = re.compile(r"^(SLURM_|SBATCH_|SALLOC_|SRUN_|LD_|MTC_)|^(PATH|HOME|SHELL|IFS)$")
ENV_VALUE_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]|\$\(|`|\.\./")
# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED.
TIME_RE = re.compile(
    r"^([0-9]{1,6}|[0-9]{1,4}:[0-9]{2}|[0-9]{1,4}:[0-9]{2}:[0-9]{2}|[0-9]{1,3}-[0-9]{1,2}"
    r"(:[0-9]{2}(:[0-9]{2})?)?|UNLIMITED|INFINITE)$"
)
DEP_ITEM = (
    r"(singleton|(after|afterany|afterok|afternotok|aftercorr)(:[0-9]+(_[0-9]+)?(\+[0-9]+)?)+)"
)
DEPENDENCY_RE = re.compile(rf"^{DEP_ITEM}([,?]{DEP_ITEM})*$")
ARRAY_RE = re.compile(
    r"^[0-9]{1,6}(-[0-9]{1,6}(:[0-9]{1,6})?)?(,[0-9]{1,6}(-[0-9]{1,6}(:[0-9]{1,6})?)?)*(%[0-9]{1,5})?$"
)
# Slurm account and QoS names as mtc makes them (sacctmgr lower-cases names).
ACCOUNT_RE = re.compile(r"[a-z][a-z0-9_-]{0,39}")
MAX_SCRIPT_BYTES = 1024 * 1024
MAX_ARRAY_TASKS = 10_000
# The submit body's fields, in the order the submit form shows them.
FIELDS = (
    "name",
    "script",
    "partition",
    "nodes",
    "ntasks_per_node",
    "gpus_per_node",
    "cpus_per_task",
    "time_limit",
    "env",
    "requeue",
    "dependency",
    "array",
    "account",
    "qos",
)


class SubmissionError(FieldErrors):
    """``fields`` maps each bad field to a message (HTTP 400)."""


@dataclass
class Submission:
    name: str
    script: str
    partition: str = ""
    nodes: int = 1
    ntasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    time_limit: str = ""
    env: dict[str, str] = field(default_factory=dict)
    requeue: bool = True
    dependency: str = ""
    array: str = ""
    account: str = ""  # Slurm account (a team); mtc checks the owner is in it
    qos: str = ""
    # Set by mtc's own launches (recipes), not by the submit body: the whole node.
    mem: str = ""  # --mem ("0": all of the node's memory)
    exclusive: bool = False
    signal: str = ""  # --signal, e.g. "USR1@120": a warning ahead of the time limit

    def as_options(self) -> dict[str, Any]:
        """What is stored with the job (the script is stored on its own)."""
        return {k: v for k, v in self.__dict__.items() if k != "script"}


def _int(data: dict, key: str, errors: dict, *, default: int, low: int, high: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        errors[key] = "Must be an integer."
        return default
    if not low <= value <= high:
        errors[key] = f"Must be between {low} and {high}."
    return value


def _array_problem(spec: str) -> str:
    """Why Slurm would refuse an --array spec of ARRAY_RE's form, or "" (a step of at least
    1, ranges low to high, and no more than MAX_ARRAY_TASKS tasks)."""
    total = 0
    for part in spec.split("%")[0].split(","):
        bounds, _, step = part.partition(":")
        low, _, high = bounds.partition("-")
        low_n, high_n, step_n = int(low), int(high or low), int(step or 1)
        if step_n < 1:
            return "A step (after ':') must be 1 or more."
        if high_n < low_n:
            return f"The range {bounds} runs backwards."
        total += (high_n - low_n) // step_n + 1
    if total > MAX_ARRAY_TASKS:
        return f"At most {MAX_ARRAY_TASKS} tasks."
    return ""


def validate_submission(
    data: Any, *, partitions: list[str], max_nodes: int, max_gpus_per_node: int
) -> Submission:
    if not isinstance(data, dict):
        raise SubmissionError({"non_field_errors": "The body must be a JSON object."})
    errors: dict[str, str] = {}
    for key in data:
        if key not in FIELDS:
            errors[str(key)] = "Unknown field."

    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        errors["name"] = "This field is required (a string)."
    elif len(name) > 128:
        errors["name"] = "At most 128 characters."
    elif NAME_FORBIDDEN.search(name):
        errors["name"] = "May not contain control characters, newlines, '#SBATCH' or '../'."

    script = data.get("script")
    if not isinstance(script, str) or not script:
        errors["script"] = "This field is required (a string)."
    elif not script.startswith("#!"):
        errors["script"] = "Must start with an interpreter line such as #!/bin/bash."
    elif "\x00" in script or len(script.encode()) > MAX_SCRIPT_BYTES:
        errors["script"] = f"Must be text under {MAX_SCRIPT_BYTES} bytes without NUL."

    # Optional strings: absent, null or "" mean "not given"; anything else must be a
    # string (an {} or a 0 is refused, not read as "not given").
    partition = data.get("partition")
    partition = "" if partition is None else partition
    if partition != "":
        if not isinstance(partition, str) or not PARTITION_RE.fullmatch(partition):
            errors["partition"] = "Partition names are letters, digits, _ and -."
        elif partition not in partitions:
            errors["partition"] = f"No partition '{partition}'; this cluster has: " + ", ".join(
                partitions
            )

    nodes = _int(data, "nodes", errors, default=1, low=1, high=max(1, max_nodes))
    ntasks = _int(data, "ntasks_per_node", errors, default=1, low=1, high=1024)
    gpus = _int(data, "gpus_per_node", errors, default=0, low=0, high=max_gpus_per_node)
    cpus = _int(data, "cpus_per_task", errors, default=1, low=1, high=1024)

    time_limit = data.get("time_limit", "")
    if time_limit != "":
        if isinstance(time_limit, int) and not isinstance(time_limit, bool) and time_limit > 0:
            time_limit = str(time_limit)
        if not isinstance(time_limit, str) or not TIME_RE.fullmatch(time_limit):
            errors["time_limit"] = "Use minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]."

    env = data.get("env")
    env = {} if env is None else env
    if not isinstance(env, dict):
        errors["env"] = "Must be an object of NAME: value."
        env = {}
    for key, value in env.items():
        if not ENV_NAME_RE.fullmatch(str(key)):
            errors[f"env.{key}"] = "Names are letters, digits and _, not starting with a digit."
        elif ENV_RESERVED.match(key):
            errors[f"env.{key}"] = "This variable is set by Slurm or mtc."
        elif not isinstance(value, str) or len(value) > 4096:
            errors[f"env.{key}"] = "Values are strings up to 4096 characters."
        elif ENV_VALUE_FORBIDDEN.search(value):
            errors[f"env.{key}"] = "May not contain newlines, control characters, $(, ` or ../."

    requeue = data.get("requeue", True)
    if not isinstance(requeue, bool):
        errors["requeue"] = "Must be true or false."

    dependency = data.get("dependency")
    dependency = "" if dependency is None else dependency
    if dependency != "" and (
        not isinstance(dependency, str) or not DEPENDENCY_RE.fullmatch(dependency)
    ):
        errors["dependency"] = "Use Slurm's form, e.g. afterok:123 or afterany:12_3,singleton."

    array = data.get("array")
    array = "" if array is None else array
    if array != "":
        if not isinstance(array, str) or not ARRAY_RE.fullmatch(array):
            errors["array"] = "Use Slurm's form, e.g. 0-99, 1,3,5 or 0-15%4."
        elif problem := _array_problem(array):
            errors["array"] = problem

    for key in ("account", "qos"):
        value = data.get(key)
        value = "" if value is None else value
        if value != "" and (not isinstance(value, str) or not ACCOUNT_RE.fullmatch(value)):
            errors[key] = "Names are lower-case letters, digits, _ and -, at most 40."
    if errors:
        raise SubmissionError(errors)
    return Submission(
        name=name,
        script=script,
        partition=partition,
        nodes=nodes,
        ntasks_per_node=ntasks,
        gpus_per_node=gpus,
        cpus_per_task=cpus,
        time_limit=time_limit,
        env=dict(env),
        requeue=requeue,
        dependency=dependency,
        array=array,
        account=data.get("account") or "",
        qos=data.get("qos") or "",
    )


def sbatch_args(sub: Submission, *, output_dir: str, work_dir: str, comment: str) -> list[str]:
    """The argument list for `sbatch` (the script itself goes on stdin)."""
    stem = "slurm-%A_%a" if sub.array else "slurm-%j"
    args = [
        "sbatch",
        "--parsable",
        f"--job-name={sub.name}",
        f"--nodes={sub.nodes}",
        f"--ntasks-per-node={sub.ntasks_per_node}",
        f"--cpus-per-task={sub.cpus_per_task}",
        f"--output={output_dir}/{stem}.out",
        f"--error={output_dir}/{stem}.err",
        f"--chdir={work_dir}",
        f"--comment={comment}",
        "--requeue" if sub.requeue else "--no-requeue",
        "--open-mode=append",  # a requeued job adds to its output instead of erasing it
    ]
    if sub.partition:
        args.append(f"--partition={sub.partition}")
    if sub.gpus_per_node:
        args.append(f"--gpus-per-node={sub.gpus_per_node}")
    if sub.mem:
        args.append(f"--mem={sub.mem}")
    if sub.exclusive:
        args.append("--exclusive")
    if sub.signal:
        args.append(f"--signal={sub.signal}")
    if sub.time_limit:
        args.append(f"--time={sub.time_limit}")
    if sub.dependency:
        args.append(f"--dependency={sub.dependency}")
    if sub.array:
        args.append(f"--array={sub.array}")
    if sub.account:
        args.append(f"--account={sub.account}")
    if sub.qos:
        args.append(f"--qos={sub.qos}")
    return args
