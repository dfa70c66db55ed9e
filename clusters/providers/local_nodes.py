"""The local provider's node side of health: each emulated node's device shim and
agent (a daemon that reports to the API with the node's own token, and Slurm's
HealthCheckProgram), its checks on demand, and real faults (kill, disk, slow, straggle,
fabric) as well as the emulated GPU faults the shim reports. ``hang`` stops one training
rank on the node (SIGSTOP) until it is cleared (SIGCONT): its peers wait in their
collective."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from mtc import cpu
from mtc.secretfile import private_append
from node.fabric import MEASURING_COMM
from node.shim import inject as shim_faults
from node.shim.install import install as shim_install
from slurm import config as slurm_config

from . import owned, procs

if TYPE_CHECKING:
    from clusters.models import Cluster, Node

AGENT_DIR = Path(__file__).resolve().parents[2] / "node" / "agent"
# Slurm's HealthCheckProgram runs beside jobs: DCGM's quick level (health.policy's
# table takes its "healthcheck" entry from here).
HEALTHCHECK_DCGM_LEVEL = 1
# straggle: the node's job processes throttled (the agent's checks pass, step times tell);
# fabric: the node's fabric-check ranks throttled (slow collectives, the agent's checks pass).
REAL_FAULTS = ("kill", "disk", "slow", "straggle", "hang", "fabric")
FAULT_KINDS = (*REAL_FAULTS, *shim_faults.KINDS)
# What survives which repair: GPU hardware faults go only with a new machine.
HARDWARE_FAULTS = ("ecc", "sdc", "dcgm", "gpu-missing")
FILL_FILE = "mtc-fault-fill"
TOKEN_FILE = "agent.token"
# Slurm's health check: the quick checks only (no speed, correctness or deep DCGM), each
# run well inside the 60 s slurmd gives a HealthCheckProgram.
HEALTH_CHECKS = "disk,gpu,ecc,xid,dcgm"
# slurmd gives its health check no PATH: the script sets the system's.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The agent imported as a module (its bytecode cached) with the standard library only (-I -S):
# slurmd waits for a HealthCheckProgram round before its node registers, so a 32-node
# cluster's start is mostly these rounds.
AGENT_LAUNCH = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); import mtc_agent; sys.exit(mtc_agent.entry())"
)


def agent_command() -> list[str]:
    """The node agent's program; its arguments follow."""
    return [sys.executable, "-I", "-S", "-c", AGENT_LAUNCH, str(AGENT_DIR)]


class LocalNodes:
    """Mixed into LocalProvider (which supplies root(), node_dir(), conf_path(), ...)."""

    # --- set-up ----------------------------------------------------------
    def node_setup(
        self, cluster: Cluster, node: Node, *, keep_faults: tuple = (), token: bool = True
    ) -> None:
        """Shim (emulated GPUs) and agent config for a node; faults in ``keep_faults``
        carry over (a reboot or reimage does not heal hardware). ``token=False``: files
        only (safe in a thread); the caller writes the token (a database write)."""
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
                # health.json is written first and read by the poller when the API is out
                # of reach, so a report need not wait on long retries.
                "report_retries": 1,
                "report_backoff_s": 0.5,
                "report_timeout_s": 5.0,
            }
        )
        config_path.write_text(json.dumps(config, indent=2))
        if token:
            self.agent_token_write(cluster, node)

    def agent_token_write(self, cluster: Cluster, node: Node) -> Path:
        """A new token for the node's agent (the database keeps only its hash), in a file
        only its owner (the user mtc runs as) can read. A new machine (reimage, replace)
        gets a new one."""
        from clusters.services import node_token_issue

        path = self.node_dir(cluster, node.name) / TOKEN_FILE
        token = node_token_issue(node)
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
        return path

    def _agent_token_file(self, cluster: Cluster, node: Node) -> Path:
        """The node's token file, issued anew if the file or the stored hash is missing."""
        from clusters.models import Node as NodeRow

        path = self.node_dir(cluster, node.name) / TOKEN_FILE
        stored = NodeRow.objects.filter(pk=node.pk).values_list("agent_token_hash", flat=True)
        if not path.exists() or not stored.first():
            return self.agent_token_write(cluster, node)
        return path

    def report_url(self, cluster: Cluster, node: Node) -> str:
        from django.urls import reverse

        path = reverse(
            "node-health-report", kwargs={"cluster_id": cluster.cluster_id, "node": node.name}
        )
        return settings.MTC_PUBLIC_URL.rstrip("/") + path.rstrip("/")

    def health_check_write(self, cluster: Cluster) -> Path:
        """The cluster's HealthCheckProgram (slurm.conf names it): the agent's quick checks
        for the node slurmd says (SLURMD_NODENAME, its only environment variable), which
        drain the node themselves on a critical finding."""
        root = self.root(cluster)
        path = slurm_config.health_check_program(root)
        q = shlex.quote
        nodes, log_dir = root / "nodes", root / "log"
        text = f"""#!/bin/sh
# Slurm's HealthCheckProgram for cluster {cluster.cluster_id}, written by mtc (edits are
# overwritten). slurmd runs it when it starts and every HealthCheckInterval with no
# environment but SLURMD_NODENAME: several slurmd share this host, so that names the node.
PATH={SYSTEM_PATH}
SLURM_CONF={q(str(self.conf_path(cluster)))}
export PATH SLURM_CONF
node="${{SLURMD_NODENAME:-}}"
trigger="${{1:-healthcheck}}"  # "prolog" when a spec's prolog runs it
case "$trigger" in healthcheck|prolog|epilog) ;; *) trigger=healthcheck ;; esac
case "$node" in
  ""|*/*|.*) echo "mtc-healthcheck: SLURMD_NODENAME is not set" >&2; exit 0 ;;
esac
dir={q(str(nodes))}/"$node"
[ -f "$dir/agent.json" ] || exit 0
MTC_NODE_DIR="$dir"
export MTC_NODE_DIR
exec {" ".join(q(a) for a in agent_command())} --node "$node" \
  --config "$dir/agent.json" --once --checks {HEALTH_CHECKS} \
  --dcgm-level {HEALTHCHECK_DCGM_LEVEL} --trigger "$trigger" \
  --state-file "$dir/healthcheck-state.json" --output "$dir/healthcheck.json" \
  --slurm-drain >/dev/null 2>>{q(str(log_dir))}/"healthcheck-$node.log"
"""
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.chmod(0o755)
            tmp.replace(path)
        return path

    def _agent_env(self, cluster: Cluster, node: Node) -> dict[str, str]:
        env = procs.daemon_env(  # none of mtc's secrets (procs.DAEMON_ENV_ALLOW)
            MTC_NODE=node.name,
            SLURM_CONF=str(self.conf_path(cluster)),
            MTC_NODE_DIR=str(self.node_dir(cluster, node.name)),
        )
        return env

    def _agent_args(self, cluster: Cluster, node: Node, *extra: str) -> list[str]:
        """The node agent's command line: its script, node and config, then ``extra``."""
        config = self.node_dir(cluster, node.name) / "agent.json"
        return [*agent_command(), "--node", node.name, "--config", str(config), *extra]

    def node_checks(
        self,
        cluster: Cluster,
        node: Node,
        *,
        dcgm_level: int | None = None,
        trigger: str = "on-demand",
    ) -> dict | None:
        """Run the node's agent once, now, and return its report (``dcgm_level``: the
        diag level for this run, else the node's configured one)."""
        from node.agent.mtc_agent import DCGM_BUDGET_BY_LEVEL

        node_dir = self.node_dir(cluster, node.name)
        if not (node_dir / "agent.json").exists():
            self.node_setup(cluster, node)
        args = self._agent_args(cluster, node, "--once", "--trigger", trigger)
        if dcgm_level is not None:
            args += ["--dcgm-level", str(dcgm_level)]
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            # A deep diag on real GPUs takes minutes: wait for its budget, not less.
            timeout=60 + DCGM_BUDGET_BY_LEVEL.get(dcgm_level or 1, 120.0),
            env=self._agent_env(cluster, node),
            check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None

    def start_node_agents(self, cluster: Cluster, nodes: list[Node], *, interval: float) -> None:
        """start_node_agent for each node: the tokens on this thread (database), the
        processes side by side (each fork and exec of a Python takes a while)."""
        token_files = {n.pk: self._agent_token_file(cluster, n) for n in nodes}
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(
                pool.map(
                    lambda n: self.start_node_agent(
                        cluster, n, interval=interval, token_file=token_files[n.pk]
                    ),
                    nodes,
                )
            )

    def start_node_agent(
        self, cluster: Cluster, node: Node, *, interval: float, token_file: Path | None = None
    ) -> None:
        """The node's agent as a daemon: a report every ``interval`` seconds POSTed to the
        API with the node's token, and written to health.json, which the poller reads
        when a report did not get through."""
        node_dir = self.node_dir(cluster, node.name)
        pidfile = self.root(cluster) / "run" / f"agent-{node.name}.pid"
        if procs.daemon_pid(pidfile, str(node_dir / "agent.json")):
            return
        token_file = token_file or self._agent_token_file(cluster, node)
        args = self._agent_args(
            cluster,
            node,
            "--interval",
            str(interval),
            "--output",
            str(node_dir / "health.json"),
            "--report-url",
            self.report_url(cluster, node),
            "--token-file",
            str(token_file),
        )
        with private_append(self.root(cluster) / "log" / f"agent-{node.name}.log") as log:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=self._agent_env(cluster, node),
                start_new_session=True,
            )
        # Its checks' commands (the GPU tools) run in its session, so they yield too.
        cpu.priority_set(proc.pid, settings.MTC_LOCAL_NODE_NICE)
        pidfile.write_text(str(proc.pid))

    # --- faults ----------------------------------------------------------
    def node_processes(self, cluster: Cluster, node: Node) -> list[int]:
        """The node's slurmd, agent, job tasks and their slurmstepd: what a power loss ends."""
        return sorted(owned.node_owned(self.root(cluster), node.name))

    def fault_inject(self, cluster: Cluster, node: Node, kind: str, **params) -> None:
        node_dir = self.node_dir(cluster, node.name)
        if kind == "kill":
            procs.stop(self.node_processes(cluster, node), timeout=0.5)
        elif kind == "disk":
            fill = node_dir / "scratch" / FILL_FILE
            with open(fill, "wb") as fh:  # a real (sparse) file as large as the scratch
                fh.truncate(int(settings.MTC_LOCAL_SCRATCH_GB * 2**30))
        elif kind in ("slow", "straggle", "fabric"):
            duty = float(params.get("duty", 0.95 if kind == "fabric" else 0.75))
            self._throttle_start(cluster, node, kind, duty)
        elif kind == "hang":
            self._hang_start(cluster, node, params.get("rank"))
        else:
            shim_faults.inject(node_dir, kind, **params)

    def fault_clear(self, cluster: Cluster, node: Node, kind: str | None = None) -> None:
        node_dir = self.node_dir(cluster, node.name)
        if kind in (None, "disk"):
            (node_dir / "scratch" / FILL_FILE).unlink(missing_ok=True)
        if kind in (None, "slow", "straggle"):
            self._throttle_stop(cluster, node)
        if kind in (None, "hang"):
            self._hang_stop(cluster, node)
        if kind in (None, "fabric"):
            self._throttle_stop(cluster, node, "fabric")
        if kind is None or kind in shim_faults.KINDS:
            if (node_dir / "faults.json").exists():
                shim_faults.clear(node_dir, kind)

    def _throttle_pidfile(self, cluster: Cluster, node: Node, kind: str) -> Path:
        # slow and straggle share one: either replaces the other, a reboot ends both.
        prefix = "throttle" if kind in ("slow", "straggle") else f"throttle-{kind}"
        return self.root(cluster) / "run" / f"{prefix}-{node.name}.pid"

    def _throttle_start(self, cluster: Cluster, node: Node, kind: str, duty: float) -> None:
        """A duty cycle of stop/continue on the node's processes (slow), only on its job
        processes (straggle), or only on its fabric-check ranks while they measure
        (fabric: node/fabric.py names them so)."""
        if not 0 < duty < 1:
            raise ValueError("duty must be between 0 and 1")
        self._throttle_stop(cluster, node, kind)
        args = [
            sys.executable,
            str(AGENT_DIR / "throttle.py"),
            "--node",
            node.name,
            "--pidfile",
            str(self.root(cluster) / "run" / f"slurmd-{node.name}.pid"),
            "--duty",
            str(duty),
        ]
        if kind == "fabric":
            args += ["--only-comm", MEASURING_COMM]
        elif kind == "straggle":
            args.append("--jobs-only")
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._throttle_pidfile(cluster, node, kind).write_text(str(proc.pid))

    def _throttle_stop(self, cluster: Cluster, node: Node, kind: str = "slow") -> None:
        pidfile = self._throttle_pidfile(cluster, node, kind)
        pid = procs.pid_from_file(pidfile)
        if pid and procs.is_running(pid):
            procs.stop([pid])
        pidfile.unlink(missing_ok=True)

    def training_ranks(self, cluster: Cluster, node: Node) -> dict[int, int]:
        """{rank: pid} of the training processes (node.train.train under torchrun) of the
        jobs on the node."""
        ranks = {}
        for pid in self.node_processes(cluster, node):
            cmdline = owned._cmdline(pid)
            if b"node.train.train" not in cmdline or b"torch.distributed.run" in cmdline:
                continue
            environ = procs._read(f"/proc/{pid}/environ").split(b"\0")
            rank = next((e[5:] for e in environ if e.startswith(b"RANK=")), b"")
            if rank.isdigit():
                ranks[int(rank)] = pid
        return ranks

    def _hang_start(self, cluster: Cluster, node: Node, rank: object = None) -> None:
        """SIGSTOP one training rank (``rank``, else the node's first) and leave it so."""
        ranks = self.training_ranks(cluster, node)
        if not ranks:
            raise ValueError(f"no training process runs on {node.name}")
        if rank is not None and (not isinstance(rank, int) or rank not in ranks):
            raise ValueError(f"rank must be one of {sorted(ranks)} on {node.name}")
        chosen = rank if rank is not None else min(ranks)
        pid = ranks[chosen]
        os.kill(pid, signal.SIGSTOP)
        (self.root(cluster) / "run" / f"hang-{node.name}.pid").write_text(f"{pid}\n")

    def _hang_stop(self, cluster: Cluster, node: Node) -> None:
        pidfile = self.root(cluster) / "run" / f"hang-{node.name}.pid"
        pid = procs.pid_from_file(pidfile)
        if pid and procs.is_running(pid) and b"node.train.train" in owned._cmdline(pid):
            os.kill(pid, signal.SIGCONT)
        pidfile.unlink(missing_ok=True)
