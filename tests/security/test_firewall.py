"""From a user's job on a local cluster, every TCP listener of mtc's own processes is
refused (mtc/firewall.py's table), while the job's own 2-node srun still works over
loopback. mtc's processes: what `make test` started (Redis, MariaDB, PostgreSQL) and a
web server started the way `make run` starts it; their listeners are read from
/proc/net/tcp at the time, not from the table."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from clusters import services as cluster_services
from clusters.models import Cluster
from mtc import firewall
from mtc.devstack import Stack, free_port

from ..conftest import make_spec
from ..waiting import job_wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.security]
SLURM_DAEMONS = {"slurmctld", "slurmd", "slurmdbd", "slurmstepd", "slurmrestd", "munged"}

CONNECT = (
    "import socket, sys; s = socket.socket(); s.settimeout(5); port = int(sys.argv[1]); "
    "rc = s.connect_ex(('127.0.0.1', port)); "
    "print(f'port {port} ' + ('connected' if rc == 0 else f'refused: errno {rc}'))"
)
PROBE = '#!/bin/bash\nfor port in {ports}; do\n  /usr/bin/python3 -c "{connect}" $port\ndone\n'
PROBE += "srun -N2 -l hostname\n"


def listening_inodes() -> dict[str, int]:
    """{socket inode: port} of every TCP socket listening on this host."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                found[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return found


def own_listeners(roots: list[str], pids: set[int]) -> dict[int, str]:
    """{port: process} for the listeners of mtc's processes: those started for this run
    (their command line or working folder is in its folder) other than Slurm's daemons,
    and ``pids``."""
    inodes = listening_inodes()
    ports: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(f"/proc/{entry}/cwd")
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
            uid = os.stat(f"/proc/{entry}").st_uid
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        # Redis rewrites its command line; it runs in its folder. Users' processes (a
        # job's, a TensorBoard's) are not mtc's: mtc runs as root and system accounts.
        named = any(root in cmdline or cwd.startswith(root) for root in roots)
        ours = int(entry) in pids or (named and uid < 1000)
        if not ours or comm in SLURM_DAEMONS:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            inode = re.fullmatch(r"socket:\[(\d+)\]", target)
            if inode and inode[1] in inodes:
                ports[inodes[inode[1]]] = comm
    return ports


@pytest.fixture
def cluster(local_clusters, settings):
    settings.MTC_IDENTITY = "local"
    cluster_services.cluster_create(spec=make_spec("fw", nodes=2))
    return Cluster.objects.get(cluster_id="fw")


@pytest.fixture
def web_server():
    """gunicorn, started as `make run` starts it (its port joins the firewall's table)."""
    stack = Stack(django_settings.DATA_DIR, env={"MTC_PORT": str(free_port())})
    port = free_port()
    stack.start_web(port)
    yield stack.procs["web"].pid, port
    stack.stop_all()


def test_a_job_is_refused_by_every_listener_of_mtcs_and_still_runs_its_srun(
    cluster, web_server, user_api
):
    if why := firewall.firewall_problem():  # the host gives no nft: make test says so
        pytest.skip(f"no firewall on this host: {why}")
    table = firewall.table_for(django_settings.DATA_DIR)
    assert firewall.firewall_ports(table), f"make test made no table {table}"
    run_root = str(Path(django_settings.DATA_DIR).parent)  # make test's folder for this run
    listeners = own_listeners([run_root], {web_server[0]})
    assert web_server[1] in listeners and len(listeners) >= 2, listeners
    script = PROBE.format(ports=" ".join(str(p) for p in sorted(listeners)), connect=CONNECT)
    body = {"name": "probe", "script": script, "nodes": 2}
    job = user_api.post("/api/v1/clusters/fw/jobs", body, format="json")
    assert job.status_code == 201, job.content
    done = job_wait_state(cluster, job.json()["job_id"], {"COMPLETED", "FAILED"}, timeout=120)
    out = user_api.get(f"/api/v1/clusters/fw/jobs/{done.job_id}/output?stream=stdout")
    text = out.json()["data"]
    for port, process in listeners.items():
        assert f"port {port} refused" in text, f"{process} on {port}: {text}"
    assert re.search(r"^0: \S+$", text, re.M) and re.search(r"^1: \S+$", text, re.M), text
