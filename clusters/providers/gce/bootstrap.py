"""What a Compute Engine node boots with: its startup script and the Slurm config the
controller serves to every node (configless Slurm with dynamic nodes, so a resize
changes no config). Pure functions of the spec."""

from __future__ import annotations

import shlex
from pathlib import Path

from mtc.accounting import PRIVATE_DATA
from slurm.config import (
    HEALTH_CHECK_INTERVAL,
    HEALTH_CHECK_NODE_STATE,
    KILL_WAIT_S,
    cluster_name,
    gres_type,
)

from . import access, image
from .names import controller_name

SCRIPTS = Path(__file__).parent / "scripts"
# Where the image (deploy/image/provision.sh) puts mtc's node runtime (image.py).
NODE_HOME, NODE_PYTHON = image.NODE_ROOT, image.NODE_PYTHON
# The startup script writes it; slurm.conf names it (HealthCheckProgram).
HEALTH_CHECK_PROGRAM = "/usr/local/sbin/mtc-healthcheck"
# The agent's quick checks at slurmd start and every HealthCheckInterval; the GPU ones
# only where there are GPUs.
GPU_CHECKS, CPU_CHECKS = "disk,gpu,ecc,xid,dcgm", "disk"
CGROUP_CONF = "ConstrainCores=yes\nConstrainDevices=yes\nConstrainRAMSpace=yes\n"


def gres_conf(spec: dict) -> str:
    """gres.conf with each GPU pool's device files, not ``AutoDetect=nvml``: Debian's
    Slurm packages are built without NVML (no gpu_nvml plugin), so autodetection finds
    nothing and the GPUs stay unbound. A machine type's GPUs are a fixed set of
    /dev/nvidia<N> files, known from the spec, and this works with any Slurm build."""
    lines = [
        "# Written by mtc: explicit device files (Debian's Slurm has no NVML).",
        "AutoDetect=off",
    ]
    login = spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
    for pool in spec["node_pools"]:
        machine = pool["machine_spec"]
        count = machine.get("accelerator_count") or 0
        if pool["id"] == login or not count:
            continue
        # Dynamic nodes are named <cluster>-<pool>-<i> (plan.node_names).
        last = max(pool["scaling_spec"]["max_node_count"], 1) - 1
        files = "/dev/nvidia0" if count == 1 else f"/dev/nvidia[0-{count - 1}]"
        lines.append(
            f"NodeName={spec['cluster_id']}-{pool['id']}-[0-{last}] Name=gpu"
            f" Type={gres_type(machine['accelerator_type'])} File={files}"
        )
    return "\n".join(lines) + "\n"


def _mounts(storage: dict) -> str:
    lines: list[str] = []
    home = storage.get("home")
    if home:
        lines.append(
            "mount_once "
            + " ".join(
                shlex.quote(s)
                for s in (
                    f"{home.get('ip', '')}:/{home['share']}",
                    "/home",
                    "nfs",
                    "defaults,_netdev",
                )
            )
        )
    for lustre in storage.get("lustre", []):
        source = f"{lustre.get('ip', '')}@tcp:/{lustre['filesystem']}"
        lines.append(
            "mount_once "
            + " ".join(
                shlex.quote(s)
                for s in (source, lustre["mount_point"], "lustre", "defaults,_netdev")
            )
        )
    for bucket in storage.get("gcs_fuse", []):
        mount_point = shlex.quote(bucket["mount_point"])
        lines.append(
            f"mkdir -p {mount_point}; mountpoint -q {mount_point} || "
            f"gcsfuse --implicit-dirs -o allow_other {shlex.quote(bucket['bucket'])} {mount_point}"
        )
    return "\n".join(lines) or "# (no shared storage in the spec)"


def _render(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(f"@@{key}@@", value)
    return text


def accounting_script(spec: dict) -> str:
    """The controller's accounting: slurmdbd over MariaDB on the controller, or over the
    Cloud SQL instance the spec names (its password read from Secret Manager at boot).
    The cluster is registered before slurmctld starts."""
    sql = (spec["orchestrator_spec"]["slurm_spec"].get("accounting") or {}).get("cloud_sql")
    if sql:
        storage = [
            "# Accounting storage: Cloud SQL (the spec's orchestrator_spec.slurm_spec.accounting)",
            f"STORAGE_HOST={shlex.quote(sql['host'])}",
            f"STORAGE_PORT={int(sql.get('port') or 3306)}",
            f"STORAGE_USER={shlex.quote(sql['user'])}",
            "DB_PASS=$(gcloud secrets versions access latest "
            f"--secret={shlex.quote(sql['password_secret'])})",
        ]
    else:
        storage = [
            "# Accounting storage: MariaDB on this controller",
            "systemctl enable --now mariadb",
            "if [ ! -s /etc/slurm/slurmdbd.pass ]; then",
            "  (umask 077; head -c 32 /dev/urandom | base64 | tr -dc A-Za-z0-9"
            " >/etc/slurm/slurmdbd.pass)",
            "fi",
            "STORAGE_HOST=localhost STORAGE_PORT=3306 STORAGE_USER=slurm",
            "DB_PASS=$(cat /etc/slurm/slurmdbd.pass)",
            "mysql -u root -e \"CREATE USER IF NOT EXISTS 'slurm'@'localhost';"
            " ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';"
            " GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';\"",
        ]
    return "\n".join(
        [
            *storage,
            "install -m 600 -o slurm -g slurm /dev/null /etc/slurm/slurmdbd.conf",
            "cat >/etc/slurm/slurmdbd.conf <<EOF",
            "AuthType=auth/munge",
            "DbdHost=$(hostname -s)",
            "SlurmUser=slurm",
            "LogFile=/var/log/slurm/slurmdbd.log",
            "PidFile=/run/slurmdbd.pid",
            "StorageType=accounting_storage/mysql",
            "StorageHost=$STORAGE_HOST",
            "StoragePort=$STORAGE_PORT",
            "StorageUser=$STORAGE_USER",
            "StoragePass=$DB_PASS",
            "StorageLoc=slurm_acct_db",
            f"PrivateData={PRIVATE_DATA}",
            "EOF",
            "systemctl enable --now slurmdbd",
            "systemctl restart slurmdbd",
            "for _ in $(seq 60); do",
            "  sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 2",
            "done",
            f"sacctmgr -i add cluster {cluster_name(spec['cluster_id'])} || true",
        ]
    )


def startup_script(spec: dict, *, role: str, pool: dict | None = None) -> str:
    """The startup-script metadata value for the controller or one compute pool."""
    common = (SCRIPTS / "common.sh").read_text()
    values = {
        # First: the block holds placeholders of its own, rendered by the ones below.
        "BLOCK": (SCRIPTS / "block.sh").read_text().rstrip("\n"),
        "METADATA_ADDRESS": access.METADATA_ADDRESS,
        "METADATA_HOST": access.METADATA_HOST,
        "ACCOUNTS_KEY": access.ACCOUNTS_KEY,
        "ACCOUNTS_PARSE": shlex.quote((SCRIPTS / "accounts_parse.py").read_text()),
        "ROLE": role,
        # The attribute that says this node's daemon is up: reset at every boot, so a
        # reset node does not look ready from the boot before.
        "READY_KEY": "slurmctld" if role == "controller" else "slurmd",
        "CLUSTER": spec["cluster_id"],
        "IMAGE_CHECK": image.slurm_check_script(),
        "MOUNTS": _mounts(spec.get("storage") or {}),
        "CONTROLLER": controller_name(spec["cluster_id"]),
    }
    if role == "controller":
        values["ACCOUNTING"] = accounting_script(spec)
        return _render(common + (SCRIPTS / "controller.sh").read_text(), values)
    machine = pool["machine_spec"]
    count = machine.get("accelerator_count") or 0
    values["POOL"] = pool["id"]
    values["GPUS"] = str(int(count))
    values["CHECKS"] = GPU_CHECKS if count else CPU_CHECKS
    values["NODE_HOME"] = NODE_HOME
    values["NODE_PYTHON"] = NODE_PYTHON
    values["HEALTH_CHECK"] = HEALTH_CHECK_PROGRAM
    values["GRES"] = f" Gres=gpu:{gres_type(machine['accelerator_type'])}:{count}" if count else ""
    return _render(common + (SCRIPTS / "worker.sh").read_text(), values)


def hook_script(scripts: list[str], kind: str) -> str:
    """The spec's prolog or epilog scripts as one file, run in order; any failure fails it."""
    parts = ["#!/bin/bash", f"# mtc {kind}: the spec's {kind}_bash_scripts, in order.", "set -e"]
    for i, body in enumerate(scripts):
        parts.append(f"# --- {kind} {i}\n(\n{body}\n)")
    return "\n".join(parts) + "\n"


def slurm_conf(
    spec: dict, *, munge_socket: str = "", max_nodes: int = 1000, controller_ip: str = ""
) -> str:
    """slurm.conf for the controller. With ``munge_socket`` it is the client copy mtc's
    own host uses to reach the controller (same cluster, its local munged). With
    ``controller_ip`` the controller is ``<name>(<ip>)``: mtc's host needs no DNS."""
    slurm = spec["orchestrator_spec"]["slurm_spec"]
    settings: dict[str, str] = {
        "ClusterName": cluster_name(spec["cluster_id"]),
        "SlurmctldHost": controller_name(spec["cluster_id"])
        + (f"({controller_ip})" if controller_ip else ""),
        # slurmdbd runs on the controller (accounting_script), over MariaDB there or
        # Cloud SQL; nodes gather usage through their cgroups.
        "AccountingStorageType": "accounting_storage/slurmdbd",
        "AccountingStorageHost": controller_name(spec["cluster_id"]),
        "AccountingStorageTRES": "gres/gpu",
        "JobAcctGatherType": "jobacct_gather/cgroup",
        # Nodes fetch this config from the controller and register themselves.
        "SlurmctldParameters": "enable_configless,idle_on_node_suspend",
        "MaxNodeCount": str(max_nodes),
        "TreeWidth": "65533",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "SlurmUser": "slurm",
        "StateSaveLocation": "/var/spool/slurmctld",
        "SlurmdSpoolDir": "/var/spool/slurmd",
        "SlurmctldLogFile": "/var/log/slurm/slurmctld.log",
        "SlurmdLogFile": "/var/log/slurm/slurmd.log",
        "ProctrackType": "proctrack/cgroup",
        "TaskPlugin": "task/cgroup,task/affinity",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core_Memory",
        "GresTypes": "gpu",
        "PrologFlags": "Alloc,Contain",
        "Prolog": "/etc/slurm/mtc-prolog.sh",
        "Epilog": "/etc/slurm/mtc-epilog.sh",
        "HealthCheckProgram": HEALTH_CHECK_PROGRAM,
        "HealthCheckInterval": str(HEALTH_CHECK_INTERVAL),
        "HealthCheckNodeState": HEALTH_CHECK_NODE_STATE,
        "ReturnToService": "2",
        "JobRequeue": "1",
        "KillWait": str(KILL_WAIT_S),  # time for a checkpoint after SIGTERM (slurm.config)
        "SchedulerType": "sched/backfill",
        "PrivateData": PRIVATE_DATA,  # users see only their own jobs, usage and accounts
    }
    if munge_socket:
        settings["AuthInfo"] = f"socket={munge_socket}"
    lower = {k.lower(): k for k in settings}
    for key, value in (slurm.get("config_overrides") or {}).items():
        settings[lower.get(key.lower(), key)] = str(value)
    lines = ["# Written by mtc from the cluster spec; edits are overwritten."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    lines.append("")
    login = slurm["login_node_pool_id"]
    for pool in spec["node_pools"]:
        if pool["id"] != login:  # a node set per pool: dynamic nodes join by Feature
            lines.append(f"NodeSet={pool['id']} Feature={pool['id']}")
    for part in slurm["partitions"]:
        default = "YES" if part.get("default") else "NO"
        lines.append(
            f"PartitionName={part['id']} Nodes={','.join(part['node_pool_ids'])}"
            f" Default={default} MaxTime=INFINITE State=UP"
        )
    return "\n".join(lines) + "\n"
