"""The local provider: real Slurm daemons on this machine (docs/spec.md).

Per cluster, ``$MTC_DATA_DIR/clusters/<id>/`` holds etc/ (slurm.conf, gres.conf,
munge.key), run/ (pid files, munge and slurmrestd sockets), log/, state/ and
nodes/<node>/ (spool, emulated GPU device files, scratch). One munged, one
slurmctld and one slurmrestd (job submission over a unix socket) per cluster, one
``slurmd -N <node>`` per node. The daemons detach from whoever started them, so a
cluster outlives a restart of the web stack.

What runs per node (shim, agent, faults) is in local_nodes.py; this module is past 400
lines on purpose: every cluster-wide daemon's start, stop and wait in one place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from mtc import accounting, cpu, userfs
from mtc.secretfile import private_append
from slurm import SlurmClient, SlurmError
from slurm import config as slurm_config
from slurm.rest import RestClient

from . import cgroups, jwt, munge, owned, procs
from .base import Provider, ProviderError
from .local_nodes import HARDWARE_FAULTS, LocalNodes

if TYPE_CHECKING:
    from clusters.models import Cluster, Node

log = logging.getLogger(__name__)
RESTD_RETRY_S = 300
# slurmrestd's unprivileged user (_start_slurmrestd says why it is not root).
RESTD_USER, RESTD_GROUP = "nobody", "nogroup"
READY_STATES = {"IDLE", "ALLOCATED", "MIXED", "COMPLETING"}
NODE_STARTS_AT_ONCE = 8
# slurmrestd stays in the foreground: the Popen objects of the ones this process
# started, so their exit is reaped (no zombies, no ResourceWarning).
_restd_children: dict[int, subprocess.Popen] = {}


def host_gpu_devices() -> list[str]:
    """Real NVIDIA device files on this host, if any."""
    if not shutil.which("nvidia-smi"):
        return []
    return sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))


class LocalProvider(LocalNodes, Provider):
    name = "local"
    uses_ports = True

    def __init__(self) -> None:
        self.real_gpus = host_gpu_devices()
        self.gpus_emulated = not self.real_gpus

    # --- paths -----------------------------------------------------------
    def root(self, cluster: Cluster) -> Path:
        return Path(settings.DATA_DIR) / "clusters" / cluster.cluster_id

    def conf_path(self, cluster: Cluster) -> Path:
        return self.root(cluster) / "etc" / "slurm.conf"

    def munge_socket(self, cluster: Cluster) -> str:
        return munge.socket_path(self.root(cluster))

    def node_dir(self, cluster: Cluster, name: str) -> Path:
        return self.root(cluster) / "nodes" / name

    def rest_socket(self, cluster: Cluster) -> str:
        # In a directory of its own that only slurmrestd's user may enter.
        path = str(self.root(cluster) / "run" / "restd" / "slurmrestd.sock")
        if len(path) < 100:  # AF_UNIX paths are limited to 108 bytes
            return path
        digest = hashlib.sha1(path.encode()).hexdigest()[:16]
        # Still a directory of its own: _start_slurmrestd hands it to slurmrestd's user.
        return f"/tmp/mtc-slurmrestd-{digest}/slurmrestd.sock"

    def slurm(self, cluster: Cluster) -> SlurmClient:
        # Submits try slurmrestd first; a missing or dead socket falls back to sbatch.
        return SlurmClient(
            self.conf_path(cluster),
            rest_socket=self.rest_socket(cluster),
            rest_auth=self.rest_auth(cluster),
        )

    def rest_auth(self, cluster: Cluster):
        """user (None: mtc) -> slurmrestd's headers: a token minted for that user alone
        (jwt.py), so slurmctld authenticates the request as theirs and judges its
        options as theirs, never as root speaking for them."""
        root = self.root(cluster)

        def headers(user: str | None) -> dict[str, str]:
            name = user or jwt.own_name()
            return {"X-SLURM-USER-NAME": name, "X-SLURM-USER-TOKEN": jwt.token(root, user=name)}

        return headers

    def login_command(self, cluster: Cluster) -> str:
        return f"SLURM_CONF={self.conf_path(cluster)} sinfo"

    # --- daemons ---------------------------------------------------------
    def _env(self, cluster: Cluster) -> dict[str, str]:
        # An allowlist: the daemons (and so every job under them) see none of mtc's secrets.
        return procs.daemon_env(SLURM_CONF=str(self.conf_path(cluster)))

    def _spawn(self, cluster: Cluster, args: list[str]) -> None:
        """Start a daemon that forks into the background; its output goes to log/."""
        with private_append(self.root(cluster) / "log" / "daemons.out") as out:
            proc = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=self._env(cluster),
                timeout=30,
                check=False,
                start_new_session=True,
            )
        if proc.returncode != 0:
            raise ProviderError(
                f"{args[0]} failed to start (exit {proc.returncode}); see "
                f"{self.root(cluster) / 'log'}",
                code="DAEMON_START_FAILED",
            )

    def _munged_pid(self, cluster: Cluster) -> int | None:
        return munge.pid(self.root(cluster))

    def _slurmctld_pid(self, cluster: Cluster) -> int | None:
        return procs.daemon_pid(
            self.root(cluster) / "run" / "slurmctld.pid", str(self.conf_path(cluster))
        )

    def _slurmd_pid(self, cluster: Cluster, name: str) -> int | None:
        return procs.daemon_pid(
            self.root(cluster) / "run" / f"slurmd-{name}.pid", str(self.conf_path(cluster))
        )

    def _slurmrestd_pid(self, cluster: Cluster) -> int | None:
        _reap_restd()  # one that died under this process is a zombie until then
        return procs.daemon_pid(
            self.root(cluster) / "run" / "slurmrestd.pid", self.rest_socket(cluster)
        )

    def _start_slurmrestd(self, cluster: Cluster) -> None:
        """slurmrestd on the cluster's unix socket, with JWT auth: mtc sends its own
        token and the owner's name, and slurmrestd submits as the owner. It is a
        speed-up for submits only, so a host without it, or one that fails to start,
        leaves the cluster working on sbatch (logged).

        It runs as an unprivileged user (nobody): Slurm 22.05 refuses to let a root
        slurmrestd speak for another user ("rejecting thread config for user X while
        running as root"), and it needs no privilege, since slurmctld checks the
        token. Its socket's directory is that user's, 0700; only root (mtc) and it
        reach the socket, and a request without mtc's token is refused anyway."""
        if not shutil.which("slurmrestd"):
            log.warning("slurmrestd is not installed; %s submits with sbatch", cluster.cluster_id)
            return
        socket_path = self.rest_socket(cluster)
        Path(socket_path).unlink(missing_ok=True)  # a killed daemon's socket blocks bind
        env = self._env(cluster)
        env["SLURM_JWT"] = "daemon"  # authenticate each request by its own token
        user = {}
        if os.geteuid() == 0:
            user = {"user": RESTD_USER, "group": RESTD_GROUP, "extra_groups": []}
        socket_dir = Path(socket_path).parent
        restd = userfs.Ids(pwd.getpwnam(RESTD_USER).pw_uid, os.getegid()) if user else None
        userfs.dir_own(socket_dir, restd, mode=0o700)
        args = [
            "slurmrestd",
            "-f",
            str(self.conf_path(cluster)),
            "-a",
            "rest_auth/jwt",
            "-s",
            "openapi/v0.0.38",  # the newest v0.0.x plugin 22.05 ships
            f"unix:{socket_path}",
        ]
        with private_append(self.root(cluster) / "log" / "slurmrestd.log") as out:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                start_new_session=True,
                **user,
            )
        _restd_children[proc.pid] = proc
        (self.root(cluster) / "run" / "slurmrestd.pid").write_text(f"{proc.pid}\n")
        client = RestClient(socket_path, timeout=2, headers=self.rest_auth(cluster)(None))
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            if Path(socket_path).exists():
                if client.ping():
                    return
            time.sleep(0.05)
        log.error(
            "slurmrestd of %s did not answer (see %s); submits use sbatch",
            cluster.cluster_id,
            self.root(cluster) / "log" / "slurmrestd.log",
        )
        self._stop_slurmrestd(cluster)
        (self.root(cluster) / "run" / "slurmrestd.failed").touch()

    def services_check(self, cluster: Cluster) -> None:
        """Start a cluster's slurmrestd again if it died (submits meanwhile use sbatch);
        after a failed start, wait a while before the next try."""
        failed = self.root(cluster) / "run" / "slurmrestd.failed"
        if failed.exists() and time.time() - failed.stat().st_mtime < RESTD_RETRY_S:
            return
        if shutil.which("slurmrestd") and not self._slurmrestd_pid(cluster):
            failed.unlink(missing_ok=True)
            log.info("restarting slurmrestd of %s", cluster.cluster_id)
            self._start_slurmrestd(cluster)

    def _stop_slurmrestd(self, cluster: Cluster) -> None:
        pid = self._slurmrestd_pid(cluster)
        if pid:
            self._stop_pid(pid)
        _reap_restd()
        (self.root(cluster) / "run" / "slurmrestd.pid").unlink(missing_ok=True)
        Path(self.rest_socket(cluster)).unlink(missing_ok=True)

    def _ensure_munged(self, cluster: Cluster) -> None:
        munge.ensure(self.root(cluster))

    def _accounting(self) -> slurm_config.AccountingConf | None:
        """The installation's slurmdbd, when one is configured (else no accounting)."""
        if not settings.MTC_SLURMDBD_PORT:
            return None
        return slurm_config.AccountingConf(
            host="127.0.0.1",
            port=settings.MTC_SLURMDBD_PORT,
            munge_socket=accounting.munge_socket(settings.MTC_ACCOUNTING_DIR),
        )

    def _accounting_register(self, cluster: Cluster) -> None:
        """slurmdbd must know the cluster before its slurmctld starts. When slurmdbd is
        away the cluster still starts: slurmctld keeps its records until it is back."""
        if not settings.MTC_SLURMDBD_PORT:
            return
        try:
            name = slurm_config.cluster_name(cluster.cluster_id)
            self.slurm(cluster).accounting_cluster_add(name)
        except SlurmError as exc:
            log.warning("registering %s with slurmdbd failed: %s", cluster.cluster_id, exc)

    def _start_slurmctld(self, cluster: Cluster) -> None:
        """Started, not yet answering: its slurmdbd registration takes most of a second,
        and the slurmds may start meanwhile (each one's first health check is the slow
        part of its start; it registers once the controller answers)."""
        self._spawn(cluster, ["slurmctld", "-f", str(self.conf_path(cluster))])

    def _slurmctld_wait(self, cluster: Cluster) -> None:
        self._wait(self.slurm(cluster).ping, 20, "slurmctld did not answer")

    def _stop_pid(self, pid: int | None) -> None:
        if pid and procs.stop([pid]):
            raise ProviderError(f"process {pid} would not stop", code="DAEMON_STOP_FAILED")

    @staticmethod
    def _wait(predicate, timeout: float, message: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise ProviderError(message, code="TIMEOUT")

    # --- config ----------------------------------------------------------
    def _gpu_files(self, cluster: Cluster, node: Node) -> str:
        if self.real_gpus:
            return ",".join(self.real_gpus[: node.gpus])
        dev = self.node_dir(cluster, node.name) / "dev"
        dev.mkdir(parents=True, exist_ok=True)
        for i in range(node.gpus):
            _emulated_gpu(dev / f"nvidia{i}", i)
        return f"{dev}/nvidia[0-{node.gpus - 1}]" if node.gpus > 1 else f"{dev}/nvidia0"

    def _write_hooks(self, cluster: Cluster, kind: str, scripts: list[str]) -> str:
        """Prolog/epilog scripts from the spec, run in order by one wrapper."""
        hook_dir = self.root(cluster) / "etc" / f"{kind}.d"
        shutil.rmtree(hook_dir, ignore_errors=True)
        if not scripts:
            return ""
        hook_dir.mkdir(parents=True)
        for i, script in enumerate(scripts):
            (hook_dir / f"{i:02d}.sh").write_text(script)
        wrapper = self.root(cluster) / "etc" / f"{kind}.sh"
        # $MTC_HEALTHCHECK lets a spec's prolog run the node agent's quick checks
        # (`"$MTC_HEALTHCHECK" prolog`): a failure fails the prolog, so Slurm drains the
        # node and requeues the job instead of starting it there.
        healthcheck = slurm_config.health_check_program(self.root(cluster))
        wrapper.write_text(
            f'#!/bin/bash\nset -e\nexport MTC_HEALTHCHECK="{healthcheck}"\n'
            f'for script in "{hook_dir}"/*.sh; do /bin/bash "$script"; done\n'
        )
        wrapper.chmod(0o755)
        return str(wrapper)

    def _render(self, cluster: Cluster, nodes: list[Node]) -> bool:
        """Write slurm.conf and gres.conf; return True when either changed."""
        slurm_spec = cluster.spec["orchestrator_spec"]["slurm_spec"]
        pools_of_partition = {p["id"]: p for p in slurm_spec["partitions"]}
        partitions = [
            slurm_config.PartitionConf(
                name=pid,
                nodes=tuple(n.name for n in nodes if n.pool.pool_id in part["node_pool_ids"]),
                default=bool(part.get("default")),
            )
            for pid, part in pools_of_partition.items()
        ]
        conf = slurm_config.ClusterConf(
            cluster_id=cluster.cluster_id,
            root=self.root(cluster),
            controller_port=cluster.controller_port,
            nodes=[
                slurm_config.NodeConf(
                    name=n.name,
                    port=n.port,
                    cpus=n.cpus,
                    pool_id=n.pool.pool_id,
                    gpus=n.gpus,
                    gpu_type=n.gpu_type,
                    gpu_files=self._gpu_files(cluster, n) if n.gpus else "",
                    memory_mb=cgroups.host_memory_mb(),
                )
                for n in nodes
            ],
            partitions=partitions,
            munge_socket=self.munge_socket(cluster),
            overrides={str(k): str(v) for k, v in slurm_spec["config_overrides"].items()},
            prolog=self._write_hooks(cluster, "prolog", slurm_spec["prolog_bash_scripts"]),
            epilog=self._write_hooks(cluster, "epilog", slurm_spec["epilog_bash_scripts"]),
            jwt_key=str(jwt.key_path(self.root(cluster))),
            accounting=self._accounting(),
            cgroups=cgroups.cgroups_problem() is None,
        )
        changed = False
        etc = self.root(cluster) / "etc"
        for filename, text in (
            ("slurm.conf", slurm_config.render_slurm_conf(conf)),
            ("gres.conf", slurm_config.render_gres_conf(conf)),
            ("cgroup.conf", slurm_config.render_cgroup_conf(conf)),
        ):
            path = etc / filename
            if not path.exists() or path.read_text() != text:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(text)
                tmp.replace(path)
                changed = True
        return changed

    # --- Provider --------------------------------------------------------
    def apply(self, cluster: Cluster, nodes: list[Node]) -> None:
        root = self.root(cluster)
        for sub in ("etc", "run", "log", "state", "nodes"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        fresh = []
        for node in nodes:
            for sub in ("spool", "scratch"):
                (self.node_dir(cluster, node.name) / sub).mkdir(parents=True, exist_ok=True)
            if not (self.node_dir(cluster, node.name) / "agent.json").exists():
                fresh.append(node)
        self._ensure_munged(cluster)
        self.health_check_write(cluster)  # slurm.conf names it; slurmd runs it at start
        changed = self._render(cluster, nodes)
        ctld = self._slurmctld_pid(cluster)
        with ThreadPoolExecutor(max_workers=NODE_STARTS_AT_ONCE) as pool:
            # slurmdbd must know the cluster before its controller starts: sacctmgr
            # (a few hundred ms of table creation) runs while the nodes' files are written.
            restarting = not ctld or changed  # a changed config restarts it below
            registered = pool.submit(self._accounting_register, cluster) if restarting else None
            # New nodes' files (shim, agent config) side by side; their tokens after, on
            # this thread: the database connection is this thread's.
            list(pool.map(lambda n: self.node_setup(cluster, n, token=False), fresh))
            if registered is not None:
                registered.result()
        for node in fresh:
            self.agent_token_write(cluster, node)
        self._protect(root, nodes)
        running_slurmds = [n for n in nodes if self._slurmd_pid(cluster, n.name)]
        if ctld and changed:
            # Adding or removing nodes needs a controller restart in Slurm 22.05;
            # its state (jobs, drains) is kept in state/.
            self._stop_pid(ctld)
            ctld = None
        if not ctld:
            self._start_slurmctld(cluster)
            if changed and running_slurmds:
                self._slurmctld_wait(cluster)
                self.slurm(cluster).reconfigure()  # running slurmds re-read the config

        def start(node: Node) -> None:
            if not self._slurmd_pid(cluster, node.name):
                self._start_slurmd(cluster, node)

        # Each slurmd takes a few hundred ms to daemonize: started side by side, a
        # 32-node cluster is up in the time of a few, not of 32 in a row. (Only the
        # processes: the agents below write their tokens through the database.)
        with ThreadPoolExecutor(max_workers=NODE_STARTS_AT_ONCE) as pool:
            list(pool.map(start, nodes))
        self._slurmctld_wait(cluster)
        if changed:
            self._stop_slurmrestd(cluster)  # it reads slurm.conf once, at start
        if not self._slurmrestd_pid(cluster):
            self._start_slurmrestd(cluster)  # it answers once the controller does

    def nodes_ready(self, cluster: Cluster, nodes: list[Node]) -> None:
        # The agents' first rounds (the speed check's matmul among them) start once the
        # nodes have registered: on a laptop's cores they would slow the HealthCheckProgram
        # rounds slurmd runs before it registers a node.
        if settings.MTC_LOCAL_NODE_AGENTS:
            self.start_node_agents(cluster, nodes, interval=settings.MTC_AGENT_INTERVAL_S)

    def _protect(self, root: Path, nodes: list[Node]) -> None:
        """Jobs run as their owners under these daemons: they may pass through to what
        they need by its path (slurm.conf, the munge socket, their node's folder), list
        nothing, and read no log, state, key or token."""
        modes = {root.parent: 0o711, root: 0o711, root / "etc": 0o711, root / "run": 0o711}
        modes.update({root / "log": 0o700, root / "state": 0o700, root / "nodes": 0o711})
        modes.update({root / "nodes" / n.name: 0o711 for n in nodes})
        for path, mode in modes.items():
            if path.exists() and path.stat().st_mode & 0o777 != mode:
                os.chmod(path, mode)

    def wait_ready(self, cluster: Cluster, names: list[str], *, timeout: float = 60) -> None:
        client = self.slurm(cluster)
        wanted = set(names)

        def ready() -> bool:
            try:
                seen = {n.name: n for n in client.nodes()}
            except SlurmError:
                return False
            return all(
                name in seen
                and seen[name].state in READY_STATES
                and "NOT_RESPONDING" not in seen[name].flags
                for name in wanted
            )

        try:
            self._wait(ready, timeout, "")
        except ProviderError:
            dead = [name for name in names if not self._slurmd_pid(cluster, name)]
            detail = "; ".join(f"{name}: {self._last_error(cluster, name)}" for name in dead)
            raise ProviderError(
                f"nodes did not register with Slurm within {timeout:.0f}s"
                + (f" (slurmd not running on {detail})" if dead else ""),
                code="TIMEOUT",
            ) from None
        for name in names:  # registered: each slurmd has daemonized into its own session
            if pid := self._slurmd_pid(cluster, name):
                cpu.priority_set(pid, settings.MTC_LOCAL_NODE_NICE)

    def _last_error(self, cluster: Cluster, name: str) -> str:
        log_file = self.root(cluster) / "log" / f"slurmd-{name}.log"
        try:
            lines = log_file.read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        errors = [line for line in lines if "error:" in line and "pmix" not in line.lower()]
        return errors[-1].split("error:", 1)[1].strip() if errors else "no error logged"

    def delete_nodes(self, cluster: Cluster, nodes: list[Node]) -> None:
        for node in nodes:
            self._power_off(cluster, node)
            shutil.rmtree(self.node_dir(cluster, node.name), ignore_errors=True)
            (self.root(cluster) / "run" / f"slurmd-{node.name}.pid").unlink(missing_ok=True)
            cgroups.node_cgroups_remove(node.name)

    def delete_cluster(self, cluster: Cluster) -> None:
        root = self.root(cluster)
        if not root.exists():
            return
        if self._slurmctld_pid(cluster):
            try:
                self.slurm(cluster).cancel_all()
            except SlurmError as exc:
                log.warning("cancelling jobs of %s: %s", cluster.cluster_id, exc)
        daemons = (
            self._slurmctld_pid(cluster),
            self._munged_pid(cluster),
            self._slurmrestd_pid(cluster),
        )
        pids = {pid for pid in daemons if pid} | owned.cluster_owned(root)
        left = procs.stop(sorted(pids))
        # Once more for what was born meanwhile (a batch script's srun as its node went).
        late = owned.cluster_owned(root) - pids
        if late:
            left += procs.stop(sorted(late))
        _reap_restd()
        if left:
            raise ProviderError(f"processes {left} would not stop", code="DAEMON_STOP_FAILED")
        Path(self.munge_socket(cluster)).unlink(missing_ok=True)
        Path(self.rest_socket(cluster)).unlink(missing_ok=True)
        nodes_dir = root / "nodes"
        for name in os.listdir(nodes_dir) if nodes_dir.is_dir() else []:
            cgroups.node_cgroups_remove(name)
        shutil.rmtree(root, ignore_errors=True)

    def stop_cluster(self, cluster: Cluster) -> None:
        """Stop the daemons but keep the files, as when the machine powers off."""
        root = self.root(cluster)
        if root.exists():
            procs.stop(sorted(owned.cluster_owned(root)))
            _reap_restd()

    def controller_alive(self, cluster: Cluster) -> bool:
        return self._slurmctld_pid(cluster) is not None

    def dead_nodes(self, cluster: Cluster, nodes: list[Node]) -> list[Node]:
        return [n for n in nodes if not self._slurmd_pid(cluster, n.name)]

    def _start_slurmd(self, cluster: Cluster, node: Node) -> None:
        self._spawn(cluster, ["slurmd", "-f", str(self.conf_path(cluster)), "-N", node.name])

    def _restart(self, cluster: Cluster, node: Node) -> None:
        self._start_slurmd(cluster, node)
        if settings.MTC_LOCAL_NODE_AGENTS:
            self.start_node_agent(cluster, node, interval=settings.MTC_AGENT_INTERVAL_S)

    def _power_off(self, cluster: Cluster, node: Node) -> None:
        self._throttle_stop(cluster, node)
        left = procs.stop(self.node_processes(cluster, node))
        if left:
            raise ProviderError(
                f"processes {left} of {node.name} would not stop", code="DAEMON_STOP_FAILED"
            )

    def reboot_node(self, cluster: Cluster, node: Node) -> None:
        """Every process of the node ends and its slurmd starts again; its disk stays,
        and so do GPU hardware faults (a reboot clears an XID's state, not a bad GPU)."""
        self._power_off(cluster, node)
        self.fault_clear(cluster, node, "xid")
        self._restart(cluster, node)

    def reimage_node(self, cluster: Cluster, node: Node) -> None:
        """A fresh disk: the node's state and scratch are wiped; hardware faults stay."""
        self._power_off(cluster, node)
        self._wipe(cluster, node, keep_faults=HARDWARE_FAULTS)
        self._restart(cluster, node)

    def replace_node(self, cluster: Cluster, node: Node) -> str:
        """Locally a new machine is a fresh node directory and slurmd under the same
        name, with none of the old machine's faults."""
        generation = int(node.provider_id.rsplit("#", 1)[-1]) + 1 if "#" in node.provider_id else 1
        self._power_off(cluster, node)
        self._wipe(cluster, node, keep_faults=())
        self._restart(cluster, node)
        return f"local://{cluster.cluster_id}/{node.name}#{generation}"

    def _wipe(self, cluster: Cluster, node: Node, *, keep_faults: tuple) -> None:
        node_dir = self.node_dir(cluster, node.name)
        kept = {}
        if keep_faults and (node_dir / "faults.json").exists():
            kept = (node_dir / "faults.json").read_text()
        shutil.rmtree(node_dir, ignore_errors=True)
        for sub in ("spool", "scratch"):
            (node_dir / sub).mkdir(parents=True, exist_ok=True)
        if kept:
            (node_dir / "faults.json").write_text(kept)
        if node.gpus:
            self._gpu_files(cluster, node)
        self.node_setup(cluster, node, keep_faults=keep_faults)


def _reap_restd() -> None:
    """Collect the exit status of slurmrestd processes this process started."""
    for pid, proc in list(_restd_children.items()):
        if proc.poll() is not None:
            del _restd_children[pid]


# NVIDIA's character devices (major 195, minor = the GPU's index): an emulated GPU is
# one too, so the devices cgroup allows a job its own and refuses the others as it
# would real ones (opening one answers ENXIO: no driver). A plain file where mknod is
# not allowed (Slurm then cannot constrain devices; cgroups.py says so).
NVIDIA_MAJOR = 195


def _emulated_gpu(path: Path, index: int) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISCHR(info.st_mode) and os.minor(info.st_rdev) == index:
        return
    if info is not None:
        path.unlink()
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, index))
    except PermissionError:
        path.touch()
