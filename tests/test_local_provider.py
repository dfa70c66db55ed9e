"""The local provider and the poller against real Slurm daemons."""

import os
import subprocess

import pytest

from clusters import operations, services
from clusters.models import Cluster, Node
from clusters.providers import get_provider, procs

from .conftest import cluster_root, make_spec, sinfo_json
from .test_cpu_priority import niceness
from .waiting import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def cluster(local_clusters):
    services.cluster_create(spec=make_spec("pv", nodes=2))
    return Cluster.objects.get(cluster_id="pv")


def test_layout_matches_the_published_contract(cluster):
    root = cluster_root("pv")
    conf = (root / "etc" / "slurm.conf").read_text()
    assert f"SlurmctldPort={cluster.controller_port}" in conf
    assert "NodeName=pv-gpu-0 " in conf and "Gres=gpu:h200:8" in conf
    assert "PartitionName=gpu Nodes=pv-gpu-0,pv-gpu-1 Default=YES" in conf
    assert "SlurmdTimeout=10" in conf and "ReturnToService=2" in conf
    assert "KillWait=120" in conf  # SIGTERM to SIGKILL: time for a checkpoint
    # What slurmctld runs with: room for the jobs a busy service submits (not 10,000).
    shown = subprocess.run(
        ["scontrol", "show", "config"],
        env=dict(os.environ, SLURM_CONF=str(root / "etc" / "slurm.conf")),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert any(line.split() == ["MaxJobCount", "=", "100000"] for line in shown.splitlines())
    gres = (root / "etc" / "gres.conf").read_text()
    assert f"File={root}/nodes/pv-gpu-1/dev/nvidia[0-7]" in gres
    assert len(list((root / "nodes" / "pv-gpu-1" / "dev").iterdir())) == 8


def test_poller_stores_drain_and_degraded(cluster):
    provider = get_provider("local")
    provider.drain_nodes(cluster, ["pv-gpu-1"], "maintenance window")
    assert operations.nodes_sync(cluster=cluster) == 1
    node = Node.objects.get(name="pv-gpu-1")
    assert node.slurm_state == "DRAINED" and node.slurm_reason == "maintenance window"
    assert Cluster.objects.get(pk=cluster.pk).state == "RUNNING"

    provider.slurm(cluster).node_update(["pv-gpu-1"], state="RESUME")
    # Its slurmd gone too: ReturnToService=2 brings back a DOWN node whose slurmd answers
    # slurmctld's next ping, a race this assertion would otherwise run against.
    provider._power_off(cluster, Node.objects.get(name="pv-gpu-1"))
    provider.slurm(cluster).node_update(["pv-gpu-1"], state="DOWN", reason="broken")
    operations.nodes_sync(cluster=cluster)
    assert Node.objects.get(name="pv-gpu-1").slurm_state.startswith("DOWN")
    assert Cluster.objects.get(pk=cluster.pk).state == "DEGRADED"

    provider.slurm(cluster).node_update(["pv-gpu-1"], state="RESUME")
    provider.reboot_node(cluster, Node.objects.get(name="pv-gpu-1"))  # registers at once
    provider.wait_ready(cluster, ["pv-gpu-1"], timeout=20)
    operations.nodes_sync(cluster=cluster)
    assert Node.objects.get(name="pv-gpu-1").slurm_state == "IDLE"
    assert Cluster.objects.get(pk=cluster.pk).state == "RUNNING"


def test_reboot_reimage_replace_bring_the_node_back(cluster):
    provider = get_provider("local")
    node = Node.objects.get(name="pv-gpu-0")
    scratch = cluster_root("pv") / "nodes" / "pv-gpu-0" / "scratch" / "leftover"
    scratch.write_text("x")
    provider.reboot_node(cluster, node)
    provider.wait_ready(cluster, ["pv-gpu-0"], timeout=20)
    assert scratch.exists()
    provider.reimage_node(cluster, node)
    provider.wait_ready(cluster, ["pv-gpu-0"], timeout=20)
    assert not scratch.exists()
    assert provider.replace_node(cluster, node) == "local://pv/pv-gpu-0#1"
    provider.wait_ready(cluster, ["pv-gpu-0"], timeout=20)
    assert sinfo_json("pv")["pv-gpu-0"] == "idle"


def test_emulated_nodes_yield_the_cpu_to_the_control_plane(cluster, settings):
    """A node's slurmd and health agent stand for another machine: they run below the
    web server's priority, and so does every session they lead (a daemon detaches into
    its own one, which Linux gives as much CPU as the web server's whole session)."""
    provider = get_provider("local")
    node = Node.objects.get(name="pv-gpu-0")
    provider.reboot_node(cluster, node)
    provider.wait_ready(cluster, ["pv-gpu-0"], timeout=20)
    nice = settings.MTC_LOCAL_NODE_NICE
    assert nice > 0
    slurmd = provider._slurmd_pid(cluster, "pv-gpu-0")
    own, group = niceness(slurmd)
    assert own == nice and group in (None, nice)

    provider.start_node_agent(cluster, node, interval=60)
    agent = procs.pid_from_file(cluster_root("pv") / "run" / "agent-pv-gpu-0.pid")
    try:
        own, group = niceness(agent)
        assert own == nice and group in (None, nice)
    finally:
        procs.stop([agent])


def test_controller_restore_after_host_restart(cluster):
    provider = get_provider("local")
    provider.stop_cluster(cluster)
    assert not provider.controller_alive(cluster)
    assert operations.clusters_restore() == ["pv"]
    assert provider.controller_alive(cluster)
    assert sinfo_json("pv") == {"pv-gpu-0": "idle", "pv-gpu-1": "idle"}
    assert Cluster.objects.get(pk=cluster.pk).state == "RUNNING"
    assert operations.clusters_restore() == []


def test_scale_down_waits_for_running_jobs(cluster):
    """A node that runs a job is drained and removed only once the job ends."""
    import subprocess
    import time

    conf = cluster_root("pv") / "etc" / "slurm.conf"
    env = {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}
    subprocess.run(
        ["sbatch", "-w", "pv-gpu-1", "-o", "/dev/null", "--wrap", "sleep 4"],
        env=env,
        check=True,
        capture_output=True,
    )
    wait_until(
        lambda: (
            "RUNNING"
            in subprocess.run(
                ["squeue", "--noheader", "--format=%T"], env=env, capture_output=True, text=True
            ).stdout
        ),
        what="the job to start",
        every=0.1,
    )
    start = time.monotonic()
    services.cluster_update(
        cluster=cluster,
        patch={
            "node_pools": [
                {"id": "gpu", "scaling_spec": {"min_node_count": 1, "max_node_count": 1}}
            ]
        },
    )
    assert time.monotonic() - start >= 2
    assert sinfo_json("pv") == {"pv-gpu-0": "idle"}
    assert cluster.operations.first().state == "SUCCEEDED"


def test_node_whose_port_is_taken_moves_to_another(local_clusters, monkeypatch, settings):
    """A port something outside mtc grabbed between allocation and start."""
    import socket

    from clusters import operations as ops

    last = ops.allocate_ports(1)[0]  # where allocation stands now
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", last + 2))  # the first node's port (controller gets last + 1)
    blocker.listen()
    monkeypatch.setattr(ops, "_port_free", lambda port: True)
    try:
        services.cluster_create(spec=make_spec("mv", nodes=2))
    finally:
        blocker.close()
    cluster = Cluster.objects.get(cluster_id="mv")
    assert cluster.operations.first().state == "SUCCEEDED"
    assert Node.objects.get(name="mv-gpu-0").port != last + 2
    assert sinfo_json("mv") == {"mv-gpu-0": "idle", "mv-gpu-1": "idle"}


def test_a_whole_cluster_outage_is_one_outage_and_the_restore_comes_first(cluster):
    from health.models import NodeFailure, Repair
    from health.poll import cluster_health_poll

    provider = get_provider("local")
    provider.stop_cluster(cluster)  # every daemon gone, as after a host restart
    # The health poll may run before the node poll has seen anything go.
    assert cluster_health_poll(cluster) == {"ingested": 0, "unresponsive": 0}
    assert not NodeFailure.objects.exists()
    operations.nodes_sync(cluster=cluster)
    stopped = Cluster.objects.get(pk=cluster.pk)
    assert stopped.state == "DEGRADED"
    assert "controller is not answering" in stopped.state_message
    assert cluster_health_poll(stopped) == {"ingested": 0, "unresponsive": 0}
    assert not NodeFailure.objects.exists() and not Repair.objects.exists()

    assert operations.clusters_restore() == ["pv"]  # runs at once (eager Celery)
    operations.nodes_sync(cluster=cluster)
    back = Cluster.objects.get(pk=cluster.pk)
    assert back.state == "RUNNING" and back.state_message == ""
    assert sinfo_json("pv") == {"pv-gpu-0": "idle", "pv-gpu-1": "idle"}
    assert cluster_health_poll(back)["unresponsive"] == 0
    assert not NodeFailure.objects.exists() and not Repair.objects.exists()
