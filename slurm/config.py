"""Renders a cluster's slurm.conf and gres.conf from its rows (pure functions)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from mtc.accounting import PRIVATE_DATA

# slurmd runs the cluster's health check (mtc's agent, quick checks, --slurm-drain) from
# this wrapper, which the provider writes (clusters.providers.local_nodes).
HEALTH_CHECK_PROGRAM = "etc/mtc-healthcheck.sh"
# Seconds between two runs on a node. Slurm starts a run on every node at once unless
# CYCLE spreads them over the interval, which keeps a one-host cluster's load flat.
HEALTH_CHECK_INTERVAL = 60
# Seconds between SIGTERM and SIGKILL when Slurm ends a job (scancel, scontrol requeue,
# a preemption, a node's jobs requeued). A recipe job saves a checkpoint on SIGTERM after
# its current step; Slurm's default (30 s, and the 5 s local clusters had) kills it
# mid-save. 120 s covers the step and a save of ~100 GB per node at 1 GB/s; larger runs
# get their lead from --signal=USR1 (recipes/memory.py). It also bounds how long any
# cancelled job may linger, so it stays minutes, not hours.
KILL_WAIT_S = 120
HEALTH_CHECK_NODE_STATE = "ANY,CYCLE"


def health_check_program(root: Path) -> Path:
    return root / HEALTH_CHECK_PROGRAM


@dataclass(frozen=True)
class NodeConf:
    name: str
    port: int
    cpus: int
    pool_id: str
    gpus: int = 0
    gpu_type: str = ""
    gpu_files: str = ""  # e.g. /path/dev/nvidia[0-7]
    memory_mb: int = 0  # RealMemory (0: Slurm's default, 1 MB)


@dataclass(frozen=True)
class PartitionConf:
    name: str
    nodes: tuple[str, ...]
    default: bool = False


@dataclass(frozen=True)
class AccountingConf:
    """Where the installation's slurmdbd listens, and the munged it trusts (its socket
    goes in AccountingStoragePass: Slurm authenticates to slurmdbd through that one)."""

    host: str
    port: int
    munge_socket: str


# Seconds between a job step's usage samples: short jobs still get a MaxRSS (Slurm
# 22.05 keeps no final sample with proctrack/linuxproc), at the cost of one /proc read
# a step every few seconds.
ACCT_GATHER_FREQUENCY = "task=2"


@dataclass
class ClusterConf:
    cluster_id: str
    root: Path
    controller_port: int
    nodes: list[NodeConf]
    partitions: list[PartitionConf]
    munge_socket: str
    overrides: dict[str, str] = field(default_factory=dict)
    prolog: str = ""
    epilog: str = ""
    # None: the wrapper at health_check_program(root); "": no HealthCheckProgram.
    health_check: str | None = None
    # The HS256 key slurmctld checks mtc's JWTs with (slurmrestd submits as the owner).
    jwt_key: str = ""
    # None: no accounting (no slurmdbd configured; sacct has nothing to ask).
    accounting: AccountingConf | None = None
    # Jobs contained by cgroup v1 (proctrack/cgroup, task/cgroup, cgroup.conf).
    cgroups: bool = False


def cluster_name(cluster_id: str) -> str:
    """The ClusterName slurm.conf and slurmdbd know a cluster by."""
    return cluster_id.replace("-", "_")[:40]


def gres_type(accelerator_type: str) -> str:
    """NVIDIA_H200_141GB -> h200: the GRES type users ask for (--gpus=h200:8)."""
    words = [w for w in accelerator_type.lower().split("_") if w and w != "nvidia"]
    name = re.sub(r"[^a-z0-9]", "", words[0]) if words else "gpu"
    return name or "gpu"


def render_slurm_conf(conf: ClusterConf) -> str:
    root = conf.root
    settings: dict[str, str] = {
        "ClusterName": cluster_name(conf.cluster_id),
        "SlurmctldHost": "localhost(127.0.0.1)",
        "SlurmctldPort": str(conf.controller_port),
        "AuthType": "auth/munge",
        "AuthInfo": f"socket={conf.munge_socket}",
        "CredType": "cred/munge",
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "StateSaveLocation": str(root / "state"),
        "SlurmdSpoolDir": str(root / "nodes" / "%n" / "spool"),
        "SlurmctldPidFile": str(root / "run" / "slurmctld.pid"),
        "SlurmdPidFile": str(root / "run" / "slurmd-%n.pid"),
        "SlurmctldLogFile": str(root / "log" / "slurmctld.log"),
        "SlurmdLogFile": str(root / "log" / "slurmd-%n.log"),
        # Contained by cgroups where the host allows (render_cgroup_conf); else the
        # processes are tracked by their parent and nothing is limited.
        "ProctrackType": "proctrack/cgroup" if conf.cgroups else "proctrack/linuxproc",
        "TaskPlugin": "task/cgroup" if conf.cgroups else "task/none",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core",
        "JobAcctGatherType": "jobacct_gather/none",
        "AccountingStorageType": "accounting_storage/none",
        "JobCompType": "jobcomp/none",
        "MpiDefault": "none",
        "SchedulerType": "sched/backfill",
        # Start a submitted batch job at once instead of batching starts every 3 s.
        "SchedulerParameters": "batch_sched_delay=0",
        "GresTypes": "gpu",
        # Lets a node advertise more CPUs/GPUs than this host has.
        "SlurmdParameters": "config_overrides",
        # A node that comes back registers as usable again.
        "ReturnToService": "2",
        # Low so a dead node is noticed in seconds rather than minutes.
        "SlurmdTimeout": "10",
        "SlurmctldTimeout": "10",
        "MessageTimeout": "10",
        "KillWait": str(KILL_WAIT_S),
        "InactiveLimit": "0",
        "MinJobAge": "300",
        # slurmctld keeps every job it knows, ended ones for MinJobAge, and refuses new
        # ones past MaxJobCount (default 10,000): 35 submits/s fill that in under 5
        # minutes, and every submit then waits in sbatch's retries until it times out.
        "MaxJobCount": "100000",
        "JobRequeue": "1",
        # Users (and their jobs) see only their own jobs, usage, associations and
        # accounts through squeue, scontrol, sacct and sshare; root (mtc) sees all.
        "PrivateData": PRIVATE_DATA,
    }
    memories = [n.memory_mb // max(n.cpus, 1) for n in conf.nodes if n.memory_mb]
    if memories:
        # Memory is scheduled (nodes declare RealMemory); a job that asks none gets its
        # cores' share, so jobs still share a node, and --mem=0 gets all of it.
        settings["SelectTypeParameters"] = "CR_Core_Memory"
        settings["DefMemPerCPU"] = str(min(memories))
    if conf.accounting:
        settings.update(
            {
                "AccountingStorageType": "accounting_storage/slurmdbd",
                "AccountingStorageHost": conf.accounting.host,
                "AccountingStoragePort": str(conf.accounting.port),
                "AccountingStoragePass": conf.accounting.munge_socket,
                "AccountingStorageTRES": "gres/gpu",
                "JobAcctGatherType": "jobacct_gather/linux",
                "JobAcctGatherFrequency": ACCT_GATHER_FREQUENCY,
                # Accounts' limits (GrpTRES, MaxTRESPerUser, GrpTRESMins) hold only when
                # enforced; a user then needs an association to submit at all, which
                # mtc makes (clusters/accounts.py).
                "AccountingStorageEnforce": "associations,limits,qos",
                "PriorityType": "priority/multifactor",
                "PriorityWeightFairshare": "10000",
                "PriorityWeightAge": "1000",
            }
        )
    if conf.jwt_key:
        settings["AuthAltTypes"] = "auth/jwt"
        settings["AuthAltParameters"] = f"jwt_key={conf.jwt_key}"
    health_check = (
        str(health_check_program(root)) if conf.health_check is None else conf.health_check
    )
    if health_check:
        settings["HealthCheckProgram"] = health_check
        settings["HealthCheckInterval"] = str(HEALTH_CHECK_INTERVAL)
        settings["HealthCheckNodeState"] = HEALTH_CHECK_NODE_STATE
    if conf.prolog:
        settings["Prolog"] = conf.prolog
    if conf.epilog:
        settings["Epilog"] = conf.epilog
    lower = {k.lower(): k for k in settings}
    for key, value in conf.overrides.items():
        settings[lower.get(key.lower(), key)] = str(value)

    lines = [
        "# Written by mtc from the cluster spec; edits are overwritten.",
        *(f"{key}={value}" for key, value in settings.items()),
        "",
    ]
    for node in conf.nodes:
        gres = f" Gres=gpu:{node.gpu_type}:{node.gpus}" if node.gpus else ""
        memory = f" RealMemory={node.memory_mb}" if node.memory_mb else ""
        lines.append(
            f"NodeName={node.name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={node.port}"
            f" CPUs={node.cpus}{memory} Features={node.pool_id}{gres} State=UNKNOWN"
        )
    lines.append("")
    for part in conf.partitions:
        nodes = f" Nodes={','.join(part.nodes)}" if part.nodes else ""
        default = "YES" if part.default else "NO"
        lines.append(
            f"PartitionName={part.name}{nodes} Default={default} MaxTime=INFINITE State=UP"
        )
    return "\n".join(lines) + "\n"


def render_cgroup_conf(conf: ClusterConf) -> str:
    """cgroup v1 (this host mounts both versions; v1 has cpuset, memory, devices and
    freezer): a job's processes, cores, memory and GPU devices are its own, and every
    process of it ends with it."""
    if not conf.cgroups:
        return "# Written by mtc: this host gives local clusters no cgroups.\n"
    return "\n".join(
        [
            "# Written by mtc.",
            "CgroupPlugin=cgroup/v1",
            "CgroupMountpoint=/sys/fs/cgroup",
            "ConstrainCores=yes",
            "ConstrainRAMSpace=yes",
            "ConstrainSwapSpace=yes",
            "ConstrainDevices=yes",
            "",
        ]
    )


def render_gres_conf(conf: ClusterConf) -> str:
    lines = ["# Written by mtc.", "AutoDetect=off"]
    for node in conf.nodes:
        if node.gpus:
            lines.append(
                f"NodeName={node.name} Name=gpu Type={node.gpu_type} File={node.gpu_files}"
            )
    return "\n".join(lines) + "\n"
