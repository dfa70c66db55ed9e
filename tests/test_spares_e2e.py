"""Hot spares on a real local cluster: a pool of 3 with one spare, a 2-node job, one of
its nodes killed. The job runs again on 2 nodes, one of them the former spare, and the
repaired node comes back as the pool's spare."""

import time

import pytest
from django.urls import reverse

from clusters import services as cluster_services
from clusters.models import Cluster
from clusters.providers import get_provider
from health.models import Repair
from health.poll import cluster_health_poll
from jobs.models import Job
from jobs.sync import jobs_sync

from .conftest import make_spec
from .waiting import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def cluster(local_clusters):
    spec = make_spec("sp", nodes=3)
    spec["node_pools"][1]["spare_node_count"] = 1
    cluster_services.cluster_create(spec=spec)
    return Cluster.objects.get(cluster_id="sp")


def api_spares(api) -> list[str]:
    nodes = api.get("/api/v1/clusters/sp/nodes").json()
    nodes = nodes.get("results", nodes) if isinstance(nodes, dict) else nodes
    return sorted(n["name"] for n in nodes if n["spare"])


def job_nodes(cluster, job_id: str) -> list[str]:
    """Where Slurm runs the job now ([] when it is not running)."""
    jobs_sync(cluster=cluster)
    job = Job.objects.get(cluster=cluster, job_id=job_id)
    if job.state != "RUNNING" or not job.node_list:
        return []
    client = get_provider("local").slurm(cluster)
    return sorted(client.run(["scontrol", "show", "hostnames", job.node_list]).stdout.split())


def slurm_drains(cluster) -> dict[str, str]:
    """{node: drain reason} of the drained nodes, as sinfo shows them."""
    return {
        n.name: n.reason for n in get_provider("local").slurm(cluster).nodes() if "DRAIN" in n.flags
    }


def spare_badges(client, path: str) -> int:
    page = client.get(path)
    assert page.status_code == 200
    return page.content.count(b'data-testid="node-spare"')


def test_a_spare_takes_the_killed_nodes_place_and_the_repaired_node_is_the_spare(
    cluster, user_api, operator_api, operator, client
):
    client.force_login(operator)
    # Ready: the pool's last node is held as its spare, drained with reason "spare".
    assert api_spares(operator_api) == ["sp-gpu-2"]
    assert slurm_drains(cluster) == {"sp-gpu-2": "spare"}
    assert spare_badges(client, "/clusters/sp/") == 1
    assert spare_badges(client, reverse("health:node", args=["sp", "sp-gpu-2"])) == 1

    response = user_api.post(
        "/api/v1/clusters/sp/jobs",
        {"name": "two", "script": "#!/bin/bash\nsrun sleep 300\n", "nodes": 2},
        format="json",
    )
    assert response.status_code == 201, response.content
    job_id = response.json()["job_id"]
    wait_until(
        lambda: job_nodes(cluster, job_id) == ["sp-gpu-0", "sp-gpu-1"],
        what=lambda: f"the job on sp-gpu-0 and sp-gpu-1; it is on {job_nodes(cluster, job_id)}",
    )

    killed_at = time.monotonic()
    response = operator_api.post(
        "/api/v1/clusters/sp/nodes/sp-gpu-1/faults", {"kind": "kill"}, format="json"
    )
    assert response.status_code == 202
    cluster_health_poll(cluster)  # detects the dead slurmd; the repair runs inline
    repair = Repair.objects.get(node__name="sp-gpu-1")
    assert repair.state == "SUCCEEDED", repair.message
    assert repair.spare_node.name == "sp-gpu-2"
    assert [j["job_id"] for j in repair.jobs_requeued] == [job_id]

    wait_until(
        lambda: job_nodes(cluster, job_id) == ["sp-gpu-0", "sp-gpu-2"],
        what=lambda: f"the job on sp-gpu-0 and the spare; it is on {job_nodes(cluster, job_id)}",
    )
    running_again = time.monotonic() - killed_at
    job = Job.objects.get(cluster=cluster, job_id=job_id)
    assert job.requeue_count == 1
    assert any("interrupted: node sp-gpu-1" in e.cause for e in job.events.all())

    # The repaired node passed its checks and is the pool's spare now, held out of work.
    assert api_spares(operator_api) == ["sp-gpu-1"]
    assert slurm_drains(cluster) == {"sp-gpu-1": "spare"}
    detail = operator_api.get("/api/v1/clusters/sp/nodes/sp-gpu-1/health").json()
    assert detail["repairs"][0]["spare_node"] == "sp-gpu-2"
    assert spare_badges(client, reverse("health:node", args=["sp", "sp-gpu-1"])) == 1
    assert spare_badges(client, reverse("health:node", args=["sp", "sp-gpu-2"])) == 0
    assert running_again < 30
