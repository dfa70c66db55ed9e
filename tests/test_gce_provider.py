"""The gce provider against a local recording Compute Engine endpoint: the real
google-cloud-compute clients (REST, anonymous credentials) send every request to
tests/gce_fake.py, which answers like the API. Slurm on the cluster is FakeSlurm."""

from __future__ import annotations

import copy
import json

import pytest

from clusters.models import Cluster, Node
from clusters.providers import get_provider
from clusters.providers.gce import GceProvider
from clusters.reference_architectures import architecture_get
from identity.models import PosixAccount

from .gce_fake import CONNECTIONS, FakeCompute, FakeServer, FakeSlurm

CID = "a3u-pretrain"


@pytest.fixture
def compute(transactional_db, settings, monkeypatch):
    fake = FakeCompute()
    # The reference A3 Ultra architecture consumes this reservation by name.
    fake.reservations["a3u-reservation"] = {
        "machineType": "a3-ultragpu-8g",
        "count": 16,
        "inUseCount": 0,
        "specificReservationRequired": True,
    }
    with FakeServer(fake) as server:
        settings.CELERY_TASK_ALWAYS_EAGER = True
        settings.MTC_GCE_API_ENDPOINT = server.url
        settings.MTC_GCE_DASHBOARD_ENDPOINT = server.url  # the same fake keeps dashboards
        settings.MTC_GCE_FILESTORE_ENDPOINT = f"{server.url}/file"  # and storage
        settings.MTC_GCE_LUSTRE_ENDPOINT = f"{server.url}/lustre"
        settings.MTC_GCE_SERVICENETWORKING_ENDPOINT = f"{server.url}/servicenetworking"
        settings.MTC_GCE_CONTROL_ADDRESS = "10.128.0.9"
        # mtc's own VPC, there before any cluster (clusters go on it by default).
        fake.resources[("networks", "default")] = {"name": "default", "mtu": 1460}
        fake.resources[("subnetworks", "default")] = {"name": "default"}
        settings.MTC_GCE_ANONYMOUS = True
        settings.MTC_GCE_PROJECT = "mtc-test"
        settings.MTC_GCE_POLL_S = 0.005
        settings.MTC_GCE_RETRIES = 2
        settings.MTC_GCE_READY_TIMEOUT_S = 5
        slurm = FakeSlurm(fake)
        monkeypatch.setattr(GceProvider, "slurm", lambda self, cluster: slurm)
        fake.slurm = slurm
        yield fake
        for cluster in Cluster.objects.all():  # stop the local munged of each cluster
            get_provider(cluster.provider).delete_cluster(cluster)


def a3u_spec(nodes: int = 4) -> dict:
    spec = copy.deepcopy(architecture_get("a3-ultra-pretraining").build_spec())
    for pool in spec["node_pools"]:
        if pool["id"] == "a3u":
            pool["scaling_spec"] = {"min_node_count": nodes, "max_node_count": 8}
    return spec


def operation(api, response) -> dict:
    assert response.status_code == 202, response.content
    return api.get(f"/api/v1/operations/{response.json()['id']}").json()


def bodies(fake: FakeCompute, call: str) -> list[dict]:
    return [r.body for r in fake.requests if r.call == call]


def test_create_sends_network_placement_templates_and_bulk_insert(
    compute, operator_api, client, operator
):
    op = operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(), format="json"))
    assert op["state"] == "SUCCEEDED", op
    cluster = operator_api.get(f"/api/v1/clusters/{CID}").json()
    assert cluster["state"] == "RUNNING"

    posts = compute.calls("POST")
    # mtc's own network is there already: only the GPU data networks are made.
    assert posts == [
        "POST networks",  # the second gVNIC VPC
        "POST subnetworks",
        "POST networks",  # the RoCE VPC and a subnet per MRDMA NIC
        *["POST subnetworks"] * 8,
        "POST addresses",  # the controller's
        "POST addresses",  # private services access
        # Storage the spec asks for, after the range it needs, before the templates
        # whose startup scripts mount it at its real address.
        f"POST {CONNECTIONS}",
        "POST /file/v1/projects/mtc-test/locations/us-central1-a/instances",  # <id>-home
        "POST /lustre/v1/projects/mtc-test/locations/us-central1-a/instances",  # <id>-lfs
        *["POST firewalls"] * 4,
        "POST instanceTemplates",
        "POST instanceTemplates",
        "POST instances",
        "POST instances/bulkInsert",
        "POST /v1/projects/mtc-test/dashboards",
    ]
    gvnic, roce = bodies(compute, "POST networks")
    assert gvnic["mtu"] == roce["mtu"] == 8896 and gvnic["autoCreateSubnetworks"] is False
    assert roce["networkProfile"].endswith("/us-central1-a-vpc-roce")
    templates = {  # by <cluster>-<pool>: the name without its content version
        t["name"].rsplit("-", 1)[0]: t["properties"]
        for t in bodies(compute, "POST instanceTemplates")
    }
    gpu = templates[f"{CID}-a3u"]
    assert gpu["machineType"] == "a3-ultragpu-8g"
    assert gpu["guestAccelerators"] == [
        {"acceleratorType": "nvidia-h200-141gb", "acceleratorCount": 8}
    ]
    assert gpu["reservationAffinity"]["consumeReservationType"] == "SPECIFIC_RESERVATION"
    assert gpu["reservationAffinity"]["values"] == ["a3u-reservation"]
    assert gpu["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert [n["nicType"] for n in gpu["networkInterfaces"]] == ["GVNIC"] * 2 + ["MRDMA"] * 8
    # Reservation-bound: placed by the reservation, ended with it.
    assert gpu["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"
    assert gpu["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert "resourcePolicies" not in gpu
    assert compute.reservations["a3u-reservation"]["inUseCount"] == 4
    assert gpu["labels"]["mtc-cluster"] == CID
    metadata = {item["key"]: item["value"] for item in gpu["metadata"]["items"]}
    # Mounts use the addresses read back from the instances, never placeholders.
    home = compute.storage[("file", f"{CID}-home")]
    lustre = compute.storage[("lustre", f"{CID}-lfs")]
    assert home["state"] == "READY" and lustre["state"] == "ACTIVE"
    assert (
        f"mount_once {home['networks'][0]['ipAddresses'][0]}:/home /home nfs"
        in (metadata["startup-script"])
    )
    assert f"mount_once {lustre['mountPoint']} /mnt/lustre lustre" in metadata["startup-script"]
    assert "read at create" not in json.dumps(templates)
    assert home["tier"] == "BASIC_SSD" and home["fileShares"][0]["capacityGb"] == "2560"
    assert home["networks"][0]["connectMode"] == "PRIVATE_SERVICE_ACCESS"
    assert home["networks"][0]["reservedIpRange"] == f"{CID}-psa"
    assert lustre["perUnitStorageThroughput"] == "500" and lustre["capacityGib"] == "36000"
    (connection,) = compute.connections.values()
    assert connection["reservedPeeringRanges"] == [f"{CID}-psa"]
    assert "--conf-server a3u-pretrain-controller" in metadata["startup-script"]
    assert "Gres=gpu:h200:8" in metadata["startup-script"]
    assert len(metadata["mtc-munge-key"]) > 1000  # the real key, base64
    controller = templates[f"{CID}-login"]
    assert (
        "NodeSet=a3u Feature=a3u"
        in {i["key"]: i["value"] for i in controller["metadata"]["items"]}["mtc-slurm-conf"]
    )
    (bulk,) = bodies(compute, "POST instances/bulkInsert")
    assert bulk["count"] == "4" and bulk["minCount"] == "4"
    assert sorted(bulk["perInstanceProperties"]) == [f"{CID}-a3u-{i}" for i in range(4)]
    assert bulk["sourceInstanceTemplate"].rsplit("/", 1)[1].startswith(f"{CID}-a3u-")
    (ctl,) = [r for r in compute.requests if r.call == "POST instances"]
    assert ctl.body["name"] == f"{CID}-controller"
    # The controller is on the address reserved for it, the one slurm.conf names.
    (address,) = [r for r in compute.resources.values() if r["name"] == f"{CID}-controller-ip"]
    assert ctl.body["networkInterfaces"][0]["networkIP"] == address["address"]
    conf = {i["key"]: i["value"] for i in controller["metadata"]["items"]}["mtc-slurm-conf"]
    assert f"SlurmctldHost={CID}-controller({address['address']})" in conf
    client_conf = GceProvider().conf_path(Cluster.objects.get(cluster_id=CID)).read_text()
    assert f"SlurmctldHost={CID}-controller({address['address']})" in client_conf
    (rule,) = [b for b in bodies(compute, "POST firewalls") if b["name"] == f"{CID}-from-mtc"]
    assert rule["sourceRanges"] == ["10.128.0.9/32"]
    # The dashboard is made with the cluster and linked from its page.
    assert list(compute.dashboards) == [f"mtc-{CID}"]
    client.force_login(operator)
    page = client.get(f"/clusters/{CID}/").content.decode()
    assert 'data-testid="dashboard-link"' in page
    assert f"monitoring/dashboards/builder/mtc-{CID}?project=mtc-test" in page
    assert ctl.query["sourceInstanceTemplate"].rsplit("/", 1)[1].startswith(f"{CID}-login-")
    nodes = operator_api.get(f"/api/v1/clusters/{CID}/nodes").json()
    assert len(nodes["results"] if "results" in nodes else nodes) == 4
    node = Node.objects.get(name=f"{CID}-a3u-2")
    instance_id = compute.resources[("instances", node.name)]["id"]
    assert node.provider_id == f"gce://mtc-test/us-central1-a/{node.name}#{instance_id}"


def test_resize_adds_with_bulk_insert_and_removes_after_drain(compute, operator_api):
    operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(), format="json"))
    compute.clear_log()

    def resize(count: int) -> dict:
        patch = {
            "node_pools": [
                {"id": "a3u", "scaling_spec": {"min_node_count": count, "max_node_count": 8}}
            ]
        }
        return operation(
            operator_api, operator_api.patch(f"/api/v1/clusters/{CID}", patch, format="json")
        )

    assert resize(6)["state"] == "SUCCEEDED"
    assert compute.calls("POST") == ["POST instances/bulkInsert"]  # nothing else is remade
    (bulk,) = bodies(compute, "POST instances/bulkInsert")
    assert sorted(bulk["perInstanceProperties"]) == [f"{CID}-a3u-4", f"{CID}-a3u-5"]
    compute.clear_log()

    assert resize(3)["state"] == "SUCCEEDED"
    gone = [f"{CID}-a3u-{i}" for i in (3, 4, 5)]
    assert compute.slurm.drained == gone  # drained in Slurm before the machines go
    # Side by side, so in no set order.
    assert sorted(compute.calls("DELETE")) == [f"DELETE instances/{name}" for name in gone]
    assert compute.calls("POST") == []
    assert compute.names("instances") == [f"{CID}-a3u-{i}" for i in range(3)] + [
        f"{CID}-controller"
    ]
    assert Node.objects.filter(cluster__cluster_id=CID).count() == 3


def test_a_changed_template_is_a_new_version_that_resize_and_repairs_use(
    compute, operator_api, django_user_model
):
    """Templates cannot change: a new account (every node must have it) makes a new
    version at the next apply; new nodes and recreated ones come from it, and the old
    version is deleted."""
    operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(2), format="json"))
    cluster = Cluster.objects.get(cluster_id=CID)
    old = cluster.provider_state["templates"]["a3u"]
    assert old.startswith(f"{CID}-a3u-") and ("instanceTemplates", old) in compute.resources
    user = django_user_model.objects.create_user("newcomer", password="newcomer-pass-1")
    account = PosixAccount.objects.get(user=user)  # made with the user
    compute.clear_log()
    scaling = {"min_node_count": 3, "max_node_count": 8}
    patch = {"node_pools": [{"id": "a3u", "scaling_spec": scaling}]}
    op = operation(
        operator_api, operator_api.patch(f"/api/v1/clusters/{CID}", patch, format="json")
    )
    assert op["state"] == "SUCCEEDED", op
    cluster.refresh_from_db()
    new = cluster.provider_state["templates"]["a3u"]
    assert new != old and new.startswith(f"{CID}-a3u-")
    (template,) = [t for t in bodies(compute, "POST instanceTemplates") if t["name"] == new]
    accounts = {i["key"]: i["value"] for i in template["properties"]["metadata"]["items"]}
    assert f'"name": "{account.name}"' in accounts["mtc-accounts"]
    (bulk,) = bodies(compute, "POST instances/bulkInsert")
    assert bulk["sourceInstanceTemplate"].endswith(f"/instanceTemplates/{new}")
    assert f"DELETE instanceTemplates/{old}" in compute.calls("DELETE")
    assert ("instanceTemplates", old) not in compute.resources
    compute.clear_log()
    node = cluster.nodes.select_related("pool").get(index=0)
    get_provider("gce").reimage_node(cluster, node)
    (insert,) = [r for r in compute.requests if r.call == "POST instances"]
    assert insert.query["sourceInstanceTemplate"].endswith(f"/instanceTemplates/{new}")


def test_repairs_reset_recreate_and_replace(compute, operator_api):
    operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(2), format="json"))
    cluster = Cluster.objects.get(cluster_id=CID)
    node = cluster.nodes.select_related("pool").get(index=1)
    provider = get_provider("gce")
    compute.clear_log()

    provider.reboot_node(cluster, node)
    assert compute.calls("POST") == [f"POST instances/{node.name}/reset"]
    compute.clear_log()

    before = compute.resources[("instances", node.name)]["id"]
    provider.reimage_node(cluster, node)
    assert compute.calls("DELETE") == [f"DELETE instances/{node.name}"]
    (insert,) = [r for r in compute.requests if r.call == "POST instances"]
    assert insert.body == {"name": node.name}
    assert insert.query["sourceInstanceTemplate"].rsplit("/", 1)[1].startswith(f"{CID}-a3u-")
    assert compute.resources[("instances", node.name)]["id"] != before  # a new VM
    compute.clear_log()

    # A3 Ultra from a reservation: Google moves the VM off its host on request, and
    # mtc waits for the new boot (the old boot's attributes outlive the move).
    provider_id = provider.replace_node(cluster, node)
    (faulty,) = compute.writes()
    assert faulty.call == f"POST instances/{node.name}/reportHostAsFaulty"
    assert faulty.body["disruptionSchedule"] == "IMMEDIATE" and faulty.body["faultReasons"]
    inst = compute.resources[("instances", node.name)]
    assert inst["host"] == 1 and compute.booting[node.name][0] == 0  # new boot seen
    assert provider_id.endswith(f"#{inst['id']}")


def test_replace_deletes_and_inserts_where_google_has_no_faulty_host_report(compute, operator_api):
    spec = a3u_spec(1)
    pool = next(p for p in spec["node_pools"] if p["id"] == "a3u")
    pool["provisioning_model"] = "STANDARD"  # not reservation-bound
    del pool["machine_spec"]["reservation_affinity"]
    op = operation(operator_api, operator_api.post("/api/v1/clusters", spec, format="json"))
    assert op["state"] == "SUCCEEDED", op
    cluster = Cluster.objects.get(cluster_id=CID)
    node = cluster.nodes.select_related("pool").get(index=0)
    before = compute.resources[("instances", node.name)]["id"]
    compute.clear_log()
    provider_id = get_provider("gce").replace_node(cluster, node)
    after = compute.resources[("instances", node.name)]["id"]
    assert after != before and provider_id.endswith(f"#{after}")
    assert [r.call for r in compute.writes()] == [
        f"DELETE instances/{node.name}",
        "POST instances",
    ]
    # The fake refuses the report for this VM, as Compute Engine does.
    from clusters.providers.base import ProviderError
    from clusters.providers.gce import repairs

    with pytest.raises(ProviderError, match="not supported for machine type"):
        get_provider("gce").api(cluster).send(repairs.faulty_host_request(node.name))


def test_a_reboot_repair_drains_resets_and_returns_the_node(compute, operator_api):
    operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(2), format="json"))
    compute.clear_log()
    node = f"{CID}-a3u-0"
    response = operator_api.post(
        f"/api/v1/clusters/{CID}/nodes/{node}/repair", {"action": "reboot"}, format="json"
    )
    op = operation(operator_api, response)
    assert op["state"] == "SUCCEEDED", op
    assert [r.call for r in compute.writes()] == [f"POST instances/{node}/reset"]
    assert compute.slurm.updates[0] == ((node,), "DRAIN")
    assert compute.slurm.updates[-1] == ((node,), "RESUME")
    # Guest attributes outlive a reset: the node came back only once its new boot said
    # so, not on the old boot's "ready".
    assert compute.booting[node] == [0, 0]


def test_a_reset_that_never_boots_again_is_a_timeout(compute, operator_api, settings):
    operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(2), format="json"))
    settings.MTC_GCE_READY_TIMEOUT_S = 0.3
    compute.reset_old_reads = 10**6  # the VM never comes back from the reset
    cluster = Cluster.objects.get(cluster_id=CID)
    node = cluster.nodes.get(index=0)
    from clusters.providers.base import ProviderError

    with pytest.raises(ProviderError, match="did not boot again"):
        get_provider("gce").reboot_node(cluster, node)


def test_delete_removes_everything_create_made(compute, operator_api):
    operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(2), format="json"))
    made = set(compute.resources) - {("networks", "default"), ("subnetworks", "default")}
    assert ("networks", f"{CID}-roce") in made and compute.dashboards
    cluster = Cluster.objects.get(cluster_id=CID)
    compute.clear_log()
    op = operation(operator_api, operator_api.delete(f"/api/v1/clusters/{CID}"))
    assert op["state"] == "SUCCEEDED", op
    assert set(compute.resources) == {("networks", "default"), ("subnetworks", "default")}
    assert compute.dashboards == {}
    deleted = {
        tuple(r.call.split(" ", 1)[1].split("/")[:2])
        for r in compute.writes()
        if "/dashboards" not in r.path and r.path.startswith("/compute/")
    }
    assert deleted == made  # exactly what create made, nothing else
    # Filestore and Lustre mtc made are gone, and the peering it made with them.
    assert compute.storage == {} and compute.connections == {}
    assert not Cluster.objects.filter(cluster_id=CID).exists()
    # Run again (a delete whose worker died at the end): every 404 counts as done.
    compute.clear_log()
    get_provider("gce").delete_cluster(cluster)
    assert compute.calls("DELETE") and len(compute.resources) == 2


def test_delete_removes_the_instances_side_by_side(compute, operator_api):
    """Nine instances (eight nodes and the controller) deleted at once, not one after
    another: their delete operations are open together."""
    operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(8), format="json"))
    assert len(compute.names("instances")) == 9
    op = operation(operator_api, operator_api.delete(f"/api/v1/clusters/{CID}"))
    assert op["state"] == "SUCCEEDED", op
    assert compute.names("instances") == []
    assert compute.peak_open_deletes >= 4, compute.peak_open_deletes


def test_delete_keeps_a_network_mtc_did_not_make(compute, operator_api):
    compute.resources[("networks", "shared")] = {"name": "shared"}
    compute.resources[("subnetworks", "shared")] = {"name": "shared"}
    spec = a3u_spec(1)
    spec["network"] = {"network": "shared", "subnetwork": "shared", "mtu": 8896}
    operation(operator_api, operator_api.post("/api/v1/clusters", spec, format="json"))
    # A network of the spec's own is peered with mtc's, both ways, and not made.
    posts = compute.calls("POST")
    assert posts[:2] == ["POST networks/shared/addPeering", "POST networks/default/addPeering"]
    made = [b["name"] for b in bodies(compute, "POST networks")]
    assert made == [f"{CID}-gvnic-1", f"{CID}-roce"]
    assert compute.resources[("networks", "default")]["peerings"][0]["network"].endswith(
        "/networks/shared"
    )
    operation(operator_api, operator_api.delete(f"/api/v1/clusters/{CID}"))
    assert set(compute.resources) == {
        ("networks", "shared"),
        ("subnetworks", "shared"),
        ("networks", "default"),
        ("subnetworks", "default"),
    }
    assert not compute.resources[("networks", "default")]["peerings"]
    assert not compute.resources[("networks", "shared")]["peerings"]


def test_stockout_leaves_error_and_retry_completes_without_duplicates(
    compute, operator_api, client, operator
):
    compute.stockout = True
    op = operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(), format="json"))
    assert op["state"] == "FAILED" and op["error"]["code"] == "STOCKOUT"
    cluster = operator_api.get(f"/api/v1/clusters/{CID}").json()
    assert cluster["state"] == "ERROR"
    client.force_login(operator)
    page = client.get(f"/clusters/{CID}/").content.decode()
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in page and "no capacity" in page
    assert 'data-testid="retry"' in page

    compute.stockout = False
    op = operation(operator_api, operator_api.post(f"/api/v1/clusters/{CID}/retry"))
    assert op["state"] == "SUCCEEDED", op
    assert operator_api.get(f"/api/v1/clusters/{CID}").json()["state"] == "RUNNING"
    # Everything made once: the retry only sent what was missing.
    posts = compute.calls("POST")
    assert posts.count("POST networks") == 2 and posts.count("POST instanceTemplates") == 2
    assert posts.count("POST instances") == 1  # the controller
    assert posts.count("POST instances/bulkInsert") == 2  # the stockout, then the retry
    assert len(compute.names("instances")) == 5
    response = operator_api.post(f"/api/v1/clusters/{CID}/retry")
    assert response.status_code == 409


def test_transient_errors_are_retried_and_a_rerun_creates_nothing(compute, operator_api):
    compute.fail_once.append(("POST", "/instanceTemplates", 503))
    op = operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(2), format="json"))
    assert op["state"] == "SUCCEEDED", op
    assert compute.calls("POST").count("POST instanceTemplates") == 3  # 503, then both
    compute.clear_log()
    cluster = Cluster.objects.get(cluster_id=CID)
    get_provider("gce").apply(cluster, list(cluster.nodes.select_related("pool")))
    assert compute.calls("POST") == []  # all there: only looked


def test_nodes_that_never_report_ready_time_out_with_their_names(compute, operator_api):
    compute.never_ready.add(f"{CID}-a3u-1")
    op = operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(2), format="json"))
    assert op["state"] == "FAILED" and op["error"]["code"] == "TIMEOUT"
    assert f"{CID}-a3u-1" in op["error"]["message"]


@pytest.mark.parametrize(
    "reservation, code",
    [
        (None, "RESERVATION_MISMATCH"),  # not in the project
        ({"machineType": "a3-megagpu-8g", "count": 16}, "RESERVATION_MISMATCH"),
        ({"machineType": "a3-ultragpu-8g", "count": 2}, "RESERVATION_EXHAUSTED"),
    ],
)
def test_a_reservation_that_cannot_take_the_pool_fails_with_its_own_code(
    compute, operator_api, reservation, code
):
    del compute.reservations["a3u-reservation"]
    if reservation:
        compute.reservations["a3u-reservation"] = {
            **reservation,
            "inUseCount": 0,
            "specificReservationRequired": True,
        }
    op = operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(), format="json"))
    assert op["state"] == "FAILED" and op["error"]["code"] == code, op
    assert "reservation" in op["error"]["message"]
    assert operator_api.get(f"/api/v1/clusters/{CID}").json()["state"] == "ERROR"
    # Retried bulkInserts are not how a full reservation is met: one try, one answer.
    assert compute.calls("POST").count("POST instances/bulkInsert") == 1


def test_a_reservation_pool_must_name_its_reservation(db, operator_api):
    spec = a3u_spec()
    pool = next(p for p in spec["node_pools"] if p["id"] == "a3u")
    del pool["machine_spec"]["reservation_affinity"]
    response = operator_api.post("/api/v1/clusters", spec, format="json")
    assert response.status_code == 400
    assert "node_pools[1].machine_spec.reservation_affinity" in response.json()["error"]["fields"]
    assert not Cluster.objects.exists()


def test_the_fake_refuses_a_non_mrdma_nic_on_a_roce_network(compute, operator_api, monkeypatch):
    """As Compute Engine does: a VPC with the RoCE network profile takes MRDMA NICs only."""
    from clusters.providers.gce import networks

    nics = networks.nics
    monkeypatch.setattr(networks, "nics", lambda *a: [{**n, "nicType": "GVNIC"} for n in nics(*a)])
    op = operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(1), format="json"))
    assert op["state"] == "FAILED", op
    assert "RoCE network profile takes only MRDMA NICs" in op["error"]["message"]
    assert compute.names("instances") == [f"{CID}-controller"]


def test_the_dashboard_api_creates_once_refuses_a_bad_body_and_deletes(compute):
    from clusters.providers.base import ProviderError
    from clusters.providers.gce.dashboard import DashboardsApi, dashboard_body

    api = DashboardsApi("mtc-test")
    body = dashboard_body(a3u_spec(), "mtc-test")
    api.create(body)
    api.create(body)  # 409: made by an earlier try
    assert list(compute.dashboards) == [f"mtc-{CID}"]
    with pytest.raises(ProviderError, match="needs displayName and tiles") as error:
        api.create({"name": "projects/mtc-test/dashboards/other", "displayName": "x"})
    assert error.value.code == "MONITORING_ERROR"
    api.delete(f"mtc-{CID}")
    api.delete(f"mtc-{CID}")  # 404: gone already
    assert compute.dashboards == {}


@pytest.mark.slurm
def test_readiness_is_what_a_real_slurmctld_says(local_clusters, operator_api, monkeypatch):
    """The gce provider's readiness check (after the guest attributes) is a real
    ``scontrol ping`` and ``sinfo`` through slurm/client.py: here against a local
    cluster's slurmctld, standing in for the controller mtc reaches over the VPC."""
    from tests.conftest import make_spec

    spec = make_spec("gr", nodes=2)
    op = operation(operator_api, operator_api.post("/api/v1/clusters", spec, format="json"))
    assert op["state"] == "SUCCEEDED", op
    local = Cluster.objects.get(cluster_id="gr")
    slurm = get_provider("local").slurm(local)
    monkeypatch.setattr(GceProvider, "slurm", lambda self, cluster: slurm)
    nodes = sorted(local.nodes.values_list("name", flat=True))
    assert GceProvider()._slurm_ready(local) == {*nodes, "gr-controller"}
    slurm.node_update([nodes[0]], state="DOWN", reason="readiness test")
    assert GceProvider()._slurm_ready(local) == {nodes[1], "gr-controller"}


def test_create_needs_mtcs_own_network(compute, operator_api, settings):
    settings.MTC_GCE_NETWORK = "mtc-vpc"  # not in the project
    op = operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(1), format="json"))
    assert op["state"] == "FAILED" and op["error"]["code"] == "GCE_NOT_CONFIGURED", op
    assert "MTC_GCE_NETWORK" in op["error"]["message"]
    assert compute.calls("POST") == []  # nothing half-made
