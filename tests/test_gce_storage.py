"""gce shared storage against the recording endpoint: Filestore and Managed Lustre named
in a spec are checked (exist, ready, on the cluster's network) and mounted at their
read-back address; what mtc only checked outlives the cluster. A failed mount fails
the node and says which."""

from __future__ import annotations

import subprocess

import pytest

from clusters.models import Cluster
from clusters.providers import get_provider
from clusters.providers.gce import bootstrap
from clusters.spec import SpecError, validate_cluster_spec

from . import test_gce_provider
from .test_gce_provider import CID, a3u_spec, operation

# The provider tests' recording endpoint, fixture and all (pytest finds it by name).
globals()["compute"] = test_gce_provider.compute

ZONE = "projects/mtc-test/locations/us-central1-a/instances"


def named_spec() -> dict:
    spec = a3u_spec(1)
    spec["storage"]["home"] = {"type": "filestore", "share": "home", "instance": "team-home"}
    spec["storage"]["lustre"][0] = {
        "instance": "team-lfs",
        "filesystem": "lfs",
        "mount_point": "/mnt/lustre",
    }
    return spec


def existing(fake, *, network: str = "default", state: str = "READY") -> None:
    net = f"projects/mtc-test/global/networks/{network}"
    fake.storage[("file", "team-home")] = {
        "name": f"{ZONE}/team-home",
        "state": state,
        "networks": [{"network": net, "ipAddresses": ["10.50.0.2"]}],
    }
    fake.storage[("lustre", "team-lfs")] = {
        "name": f"{ZONE}/team-lfs",
        "state": "ACTIVE",
        "network": net,
        "filesystem": "lfs",
        "mountPoint": "10.60.0.3@tcp:/lfs",
    }


def test_named_instances_are_checked_mounted_and_kept(compute, operator_api):
    existing(compute)
    op = operation(operator_api, operator_api.post("/api/v1/clusters", named_spec(), format="json"))
    assert op["state"] == "SUCCEEDED", op
    writes = [r.path for r in compute.writes() if not r.path.startswith("/compute/")]
    assert not [w for w in writes if "/file/" in w or "/lustre/" in w or "servicenet" in w]
    assert compute.connections == {}  # nothing to make: no peering asked of Google
    template = next(
        r.body for r in compute.requests if r.call == "POST instanceTemplates"
    )  # the controller's
    script = {i["key"]: i["value"] for i in template["properties"]["metadata"]["items"]}[
        "startup-script"
    ]
    assert "mount_once 10.50.0.2:/home /home nfs" in script
    assert "mount_once 10.60.0.3@tcp:/lfs /mnt/lustre lustre" in script
    op = operation(operator_api, operator_api.delete(f"/api/v1/clusters/{CID}"))
    assert op["state"] == "SUCCEEDED", op
    assert set(compute.storage) == {("file", "team-home"), ("lustre", "team-lfs")}


@pytest.mark.parametrize(
    ("network", "state", "message"),
    [
        ("default", "CREATING", "is CREATING, not READY"),
        ("elsewhere", "READY", "is on network 'projects/mtc-test/global/networks/elsewhere'"),
    ],
)
def test_a_named_instance_that_is_not_usable_fails_create_clearly(
    compute, operator_api, network, state, message
):
    existing(compute, network=network, state=state)
    op = operation(operator_api, operator_api.post("/api/v1/clusters", named_spec(), format="json"))
    assert op["state"] == "FAILED"
    assert "storage.home: filestore instance 'team-home'" in op["error"]["message"]
    assert message in op["error"]["message"]
    assert not any(r.call == "POST instanceTemplates" for r in compute.requests)


def test_a_missing_named_instance_fails_and_nothing_is_made(compute, operator_api):
    op = operation(operator_api, operator_api.post("/api/v1/clusters", named_spec(), format="json"))
    assert op["state"] == "FAILED"
    assert "'team-home' does not exist" in op["error"]["message"]
    assert compute.storage == {}


def test_a_rerun_after_a_lost_answer_makes_storage_once(compute, operator_api):
    op = operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(1), format="json"))
    assert op["state"] == "SUCCEEDED", op
    cluster = Cluster.objects.get(cluster_id=CID)
    compute.clear_log()
    get_provider("gce").apply(cluster, list(cluster.nodes.select_related("pool")))
    assert not [r for r in compute.writes() if not r.path.startswith("/compute/")]
    assert len(compute.storage) == 2 and len(compute.connections) == 1
    # The fake answers a second create of the same id with 409, as Google does.
    from clusters.providers.gce import storage

    api = storage.RestApi(f"{compute_url(compute)}/file", "Filestore")
    status, _ = api.call("POST", f"v1/{ZONE}?instanceId={CID}-home", body={}, ok=(409,))
    assert status == 409


def compute_url(fake) -> str:
    from django.conf import settings

    return settings.MTC_GCE_FILESTORE_ENDPOINT.rsplit("/file", 1)[0]


def test_the_fake_refuses_filestore_without_the_peering(compute):
    from clusters.providers.base import ProviderError
    from clusters.providers.gce import storage

    api = storage.RestApi(f"{compute_url(compute)}/file", "Filestore")
    body = {
        "tier": "BASIC_SSD",
        "fileShares": [{"name": "home", "capacityGb": "2560"}],
        "networks": [{"network": "default", "connectMode": "PRIVATE_SERVICE_ACCESS"}],
    }
    with pytest.raises(ProviderError, match="private service access is not set up"):
        api.call("POST", f"v1/{ZONE}?instanceId=x", body=body)
    with pytest.raises(ProviderError, match="invalid tier"):
        api.call("POST", f"v1/{ZONE}?instanceId=x", body={**body, "tier": "GOLD"})


def test_spec_rules_for_storage_name_the_field():
    spec = a3u_spec(1)
    del spec["storage"]["lustre"][0]["capacity_gib"]  # mtc would make it: capacity needed
    spec["storage"]["home"] = {"type": "nfs", "share": "home"}  # an NFS server needs its ip
    with pytest.raises(SpecError) as err:
        validate_cluster_spec(spec)
    fields = set(err.value.fields)
    assert {"storage.lustre[0].capacity_gib", "storage.home.ip"} <= fields


def test_a_failed_mount_fails_the_node_and_says_which(tmp_path):
    script = bootstrap.startup_script.__globals__["SCRIPTS"] / "common.sh"
    text = script.read_text()
    start = text.index("mount_once() {")
    function = text[start : text.index("\n}\n", start) + 3]
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "mount").write_text("#!/bin/sh\necho 'mount.nfs: Connection timed out' >&2\nexit 32\n")
    (stub / "mount").chmod(0o755)
    (stub / "mountpoint").write_text("#!/bin/sh\nexit 1\n")
    (stub / "mountpoint").chmod(0o755)
    reported = tmp_path / "reported"
    run = subprocess.run(
        [
            "bash",
            "-c",
            f'set -euo pipefail; report() {{ echo "$1=$2" >> {reported}; }}\n{function}'
            f"mount_once 10.50.0.2:/home {tmp_path}/home nfs defaults\necho after",
        ],
        capture_output=True,
        text=True,
        env={"PATH": f"{stub}:/usr/bin:/bin"},
        timeout=10,
    )
    assert run.returncode == 1 and "after" not in run.stdout
    assert "mount 10.50.0.2:/home on" in run.stderr and "Connection timed out" in run.stderr
    assert reported.read_text().startswith("state=failed: mount 10.50.0.2:/home on ")


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["a3-ultra-pretraining", "a4-pretraining", "a3-mega-finetuning"])
def test_reference_architectures_ask_mtc_to_make_storage_the_api_would_take(key, settings):
    """No placeholder IPs: every reference architecture's Filestore and Lustre are made
    by mtc, with bodies the recording endpoint's shape checks accept (no typed client)."""
    from clusters.providers.gce.provider import plan_describe
    from clusters.reference_architectures import architecture_get

    from .gce_fake import FakeCompute

    settings.MTC_GCE_PROJECT = "my-project"
    spec = architecture_get(key).build_spec()
    assert "ip" not in spec["storage"]["home"]
    assert all("ip" not in item for item in spec["storage"]["lustre"])
    steps = plan_describe(spec)["storage"]
    methods = [s["method"] for s in steps]
    assert methods == [
        "servicenetworking.services.connections.create",
        "file.instances.create",
        "lustre.instances.create",
    ]
    fake = FakeCompute()
    fake.connections[steps[0]["body"]["network"]] = {}
    assert fake._storage_shape("file", steps[1]["body"]) == ""
    assert fake._storage_shape("lustre", steps[2]["body"]) == ""


def test_the_wizard_storage_step_can_ask_mtc_to_make_storage():
    from clusters.wizard_forms import StorageForm

    form = StorageForm(
        {"home_share": "home", "lustre_filesystem": "lfs", "lustre_mount_point": "/mnt/lustre"}
    )
    assert not form.is_valid()
    assert set(form.errors) == {"lustre_tier", "lustre_capacity_gib"}  # mtc makes it
    form = StorageForm({"home_type": "nfs", "home_share": "home"})
    assert not form.is_valid() and "home_ip" in form.errors  # an NFS server needs its IP
    form = StorageForm(
        {
            "home_share": "home",
            "lustre_filesystem": "lfs",
            "lustre_mount_point": "/mnt/lustre",
            "lustre_tier": "500",
            "lustre_capacity_gib": "18000",
        }
    )
    assert form.is_valid(), form.errors
