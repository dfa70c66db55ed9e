"""The local provider's node side of health: each emulated node's device shim and
agent, its checks on demand, and real faults (kill, disk, slow) as well as the
emulated GPU faults the shim reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from health.agent.shim import inject as shim_faults
from health.agent.shim.install import install as shim_install

from . import procs

if TYPE_CHECKING:
    from clusters.models import Cluster, Node

AGENT_DIR = Path(__file__).resolve().parents[2] / "health" / "agent"
REAL_FAULTS = ("kill", "disk", "slow")
FAULT_KINDS = (*REAL_FAULTS, *shim_faults.KINDS)
# What survives which repair: GPU hardware faults go only with a new machine.
HARDWARE_FAULTS = ("ecc", "sdc", "dcgm", "gpu-missing")
FILL_FILE = "mtc-fault-fill"


class LocalNodes:
    """Mixed into LocalProvider (which supplies root(), node_dir(), conf_path(), ...)."""

    # --- set-up ----------------------------------------------------------
    def node_setup(self, cluster: Cluster, node: Node, *, keep_faults: tuple = ()) -> None:
        """Shim (emulated GPUs) and agent config for a node; faults in ``keep_faults``
        carry over (a reboot or reimage does not heal hardware)."""
        node_dir = self.node_dir(cluster, node.name)
        kept = {}
        if (node_dir / "faults.json").exists():
            current = shim_faults.faults(node_dir)
            kept = {k: v for k, v in current.items() if k in keep_faults and v}
        (node_dir / "scratch").mkdir(parents=True, exist_ok=True)
        if self.gpus_emulated:
            shim_install(node_dir, node.gpus, node.gpu_type or "NVIDIA H200")
            for kind, value in kept.items():
                params = value if isinstance(value, dict) else {}
                shim_faults.inject(node_dir, kind, **params)
        config_path = node_dir / "agent.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        scratch = str(node_dir / "scratch")
        config.update(
            {
                "node": node.name,
                "expected_gpus": node.gpus,
                "disk_paths": [scratch],
                "disk_capacity_gb": {scratch: settings.MTC_LOCAL_SCRATCH_GB},
                "disk_min_free_pct": 10,
                "disk_min_free_gb": 0.1,
                "speed_seconds": 0.3,
            }
        )
        config_path.write_text(json.dumps(config, indent=2))

    def _agent_env(self, cluster: Cluster, node: Node) -> dict[str, str]:
        env = dict(
            os.environ,
            MTC_NODE=node.name,
            SLURM_CONF=str(self.conf_path(cluster)),
            MTC_NODE_DIR=str(self.node_dir(cluster, node.name)),
        )
        return env

    def node_checks(self, cluster: Cluster, node: Node) -> dict | None:
        """Run the node's agent once, now, and return its report."""
        node_dir = self.node_dir(cluster, node.name)
        if not (node_dir / "agent.json").exists():
            self.node_setup(cluster, node)
        proc = subprocess.run(
            [
                sys.executable,
                str(AGENT_DIR / "mtc_agent.py"),
                "--node",
                node.name,
                "--config",
                str(node_dir / "agent.json"),
                "--once",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=self._agent_env(cluster, node),
            check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None

    def start_node_agent(self, cluster: Cluster, node: Node, *, interval: float) -> None:
        """The node's agent as a daemon: a report every ``interval`` seconds to
        health.json (the poller reads it) and, when configured, to the API."""
        node_dir = self.node_dir(cluster, node.name)
        pidfile = self.root(cluster) / "run" / f"agent-{node.name}.pid"
        if procs.daemon_pid(pidfile, str(node_dir / "agent.json")):
            return
        args = [
            sys.executable,
            str(AGENT_DIR / "mtc_agent.py"),
            "--node",
            node.name,
            "--config",
            str(node_dir / "agent.json"),
            "--interval",
            str(interval),
            "--output",
            str(node_dir / "health.json"),
        ]
        with open(self.root(cluster) / "log" / f"agent-{node.name}.log", "ab") as log:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=self._agent_env(cluster, node),
                start_new_session=True,
            )
        pidfile.write_text(str(proc.pid))

    # --- faults ----------------------------------------------------------
    def node_processes(self, cluster: Cluster, node: Node) -> list[int]:
        """The node's slurmd, agent, job tasks and their slurmstepd: what a power loss ends."""
        from health.agent.throttle import node_pids

        pids = node_pids(node.name, str(self.root(cluster) / "run" / f"slurmd-{node.name}.pid"))
        for pid in list(pids):
            try:
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                if b"slurmstepd" in Path(f"/proc/{ppid}/cmdline").read_bytes():
                    pids.add(ppid)
            except (OSError, ValueError, IndexError):
                continue
        agent_pid = procs.pid_from_file(self.root(cluster) / "run" / f"agent-{node.name}.pid")
        if agent_pid and procs.is_running(agent_pid):
            pids.add(agent_pid)
        return sorted(pids)

    def fault_inject(self, cluster: Cluster, node: Node, kind: str, **params) -> None:
        node_dir = self.node_dir(cluster, node.name)
        if kind == "kill":
            procs.stop(self.node_processes(cluster, node), timeout=0.5)
        elif kind == "disk":
            fill = node_dir / "scratch" / FILL_FILE
            with open(fill, "wb") as fh:  # a real (sparse) file as large as the scratch
                fh.truncate(int(settings.MTC_LOCAL_SCRATCH_GB * 2**30))
        elif kind == "slow":
            self._throttle_stop(cluster, node)
            pidfile = self.root(cluster) / "run" / f"throttle-{node.name}.pid"
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(AGENT_DIR / "throttle.py"),
                    "--node",
                    node.name,
                    "--pidfile",
                    str(self.root(cluster) / "run" / f"slurmd-{node.name}.pid"),
                    "--duty",
                    str(params.get("duty", 0.75)),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            pidfile.write_text(str(proc.pid))
        else:
            shim_faults.inject(node_dir, kind, **params)

    def fault_clear(self, cluster: Cluster, node: Node, kind: str | None = None) -> None:
        node_dir = self.node_dir(cluster, node.name)
        if kind in (None, "disk"):
            (node_dir / "scratch" / FILL_FILE).unlink(missing_ok=True)
        if kind in (None, "slow"):
            self._throttle_stop(cluster, node)
        if kind is None or kind in shim_faults.KINDS:
            if (node_dir / "faults.json").exists():
                shim_faults.clear(node_dir, kind)

    def _throttle_stop(self, cluster: Cluster, node: Node) -> None:
        pidfile = self.root(cluster) / "run" / f"throttle-{node.name}.pid"
        pid = procs.pid_from_file(pidfile)
        if pid and procs.is_running(pid):
            procs.stop([pid])
        pidfile.unlink(missing_ok=True)
