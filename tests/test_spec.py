"""The spec validator (no services needed)."""

import copy

import pytest

from clusters.demo import DEMO_SPEC
from clusters.spec import SpecError, validate_cluster_patch, validate_cluster_spec


def spec(**changes):
    data = copy.deepcopy(DEMO_SPEC)
    data.update(changes)
    return data


def errors_of(data) -> dict:
    with pytest.raises(SpecError) as info:
        validate_cluster_spec(data)
    return info.value.fields


def test_demo_spec_is_valid_and_normalised():
    clean = validate_cluster_spec(spec())
    assert clean["node_pools"][1]["provisioning_model"] == "STANDARD"
    assert clean["orchestrator_spec"]["slurm_spec"]["prolog_bash_scripts"] == []


def test_design_example_is_valid():
    data = {
        "cluster_id": "demo",
        "display_name": "Demo cluster",
        "provider": "local",
        "labels": {"team": "llm"},
        "zone": "us-central1-a",
        "network": {
            "network": "default",
            "subnetwork": "default",
            "mtu": 8896,
            "private_service_access": {"range_prefix_length": 20},
        },
        "node_pools": [
            {
                "id": "login",
                "machine_spec": {"machine_type": "n2-standard-8"},
                "scaling_spec": {"min_node_count": 1, "max_node_count": 1},
            },
            {
                "id": "gpu",
                "machine_spec": {
                    "machine_type": "a3-ultragpu-8g",
                    "accelerator_type": "NVIDIA_H200_141GB",
                    "accelerator_count": 8,
                    "reservation_affinity": {
                        "reservation_affinity_type": "SPECIFIC_RESERVATION",
                        "key": "compute.googleapis.com/reservation-name",
                        "values": ["my-reservation"],
                    },
                },
                "provisioning_model": "RESERVATION",
                "scaling_spec": {"min_node_count": 4, "max_node_count": 4},
                "boot_disk": {"boot_disk_type": "hyperdisk-balanced", "boot_disk_size_gb": 200},
            },
        ],
        "storage": {
            "home": {"type": "filestore", "ip": "10.0.0.2", "share": "home"},
            "lustre": [
                {
                    "ip": "10.1.0.5",
                    "filesystem": "lfs",
                    "mount_point": "/mnt/lustre",
                    "performance_tier_mbps_per_tib": 500,
                    "capacity_gib": 36000,
                }
            ],
            "gcs_fuse": [{"bucket": "my-datasets", "mount_point": "/gcs/my-datasets"}],
        },
        "orchestrator_spec": {
            "slurm_spec": {
                "login_node_pool_id": "login",
                "partitions": [{"id": "a3u", "node_pool_ids": ["gpu"], "default": True}],
                "prolog_bash_scripts": [],
                "epilog_bash_scripts": [],
                "config_overrides": {"SlurmdTimeout": "30"},
            }
        },
    }
    assert validate_cluster_spec(data)["cluster_id"] == "demo"


def test_unknown_pool_in_partition_names_the_path():
    data = spec()
    data["orchestrator_spec"]["slurm_spec"]["partitions"][0]["node_pool_ids"] = ["nope"]
    errors = errors_of(data)
    assert (
        "No node pool with id 'nope'"
        in errors["orchestrator_spec.slurm_spec.partitions[0].node_pool_ids[0]"]
    )


@pytest.mark.parametrize("bad_id", ["Demo", "1abc", "a" * 32, "has_underscore", "", "a b"])
def test_bad_cluster_id(bad_id):
    assert "cluster_id" in errors_of(spec(cluster_id=bad_id))


def test_negative_count_and_wrong_types_each_named():
    data = spec()
    data["node_pools"][1]["scaling_spec"]["min_node_count"] = -1
    data["node_pools"][1]["machine_spec"]["accelerator_count"] = "eight"
    data["labels"] = ["not", "an", "object"]
    errors = errors_of(data)
    assert errors["node_pools[1].scaling_spec.min_node_count"] == "Must be at least 0."
    assert errors["node_pools[1].machine_spec.accelerator_count"] == "Must be an integer."
    assert errors["labels"] == "Must be an object."


def test_missing_login_pool():
    data = spec()
    del data["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
    assert "orchestrator_spec.slurm_spec.login_node_pool_id" in errors_of(data)
    data = spec()
    data["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"] = "ghost"
    assert "No node pool" in errors_of(data)["orchestrator_spec.slurm_spec.login_node_pool_id"]


def test_counts_within_provider_limits(settings):
    settings.MTC_LOCAL_MAX_NODES_PER_CLUSTER = 8
    data = spec()
    data["node_pools"][1]["scaling_spec"] = {"min_node_count": 9, "max_node_count": 9}
    assert "Must be at most 8." == errors_of(data)["node_pools[1].scaling_spec.min_node_count"]


def test_max_below_min():
    data = spec()
    data["node_pools"][1]["scaling_spec"] = {"min_node_count": 4, "max_node_count": 2}
    assert "node_pools[1].scaling_spec.max_node_count" in errors_of(data)


def test_duplicate_pool_and_partition_ids():
    data = spec()
    data["node_pools"].append(copy.deepcopy(data["node_pools"][1]))
    parts = data["orchestrator_spec"]["slurm_spec"]["partitions"]
    parts.append(copy.deepcopy(parts[0]))
    errors = errors_of(data)
    assert "node_pools[2].id" in errors
    assert "orchestrator_spec.slurm_spec.partitions[1].id" in errors


def test_reserved_slurm_keys_and_unsafe_values_rejected():
    data = spec()
    data["orchestrator_spec"]["slurm_spec"]["config_overrides"] = {
        "SlurmctldPort": "1",
        "SlurmdTimeout": "30\nInclude /etc/passwd",
        "KillWait": "10",
    }
    errors = errors_of(data)
    base = "orchestrator_spec.slurm_spec.config_overrides"
    assert "manages this" in errors[f"{base}.SlurmctldPort"]
    assert f"{base}.SlurmdTimeout" in errors
    assert f"{base}.KillWait" not in errors


def test_storage_rules():
    data = spec(
        storage={
            "lustre": [
                {
                    "ip": "10.1.0.500",
                    "filesystem": "lfs",
                    "mount_point": "/mnt/../etc",
                    "performance_tier_mbps_per_tib": 300,
                }
            ],
            "gcs_fuse": [{"bucket": "Bad Bucket", "mount_point": "/home"}],
            "home": {"type": "filestore", "ip": "10.0.0.2", "share": "home"},
        }
    )
    errors = errors_of(data)
    assert "storage.lustre[0].ip" in errors
    assert "storage.lustre[0].mount_point" in errors
    assert "storage.lustre[0].performance_tier_mbps_per_tib" in errors
    assert "storage.gcs_fuse[0].bucket" in errors
    assert "already used" in errors["storage.gcs_fuse[0].mount_point"]


def test_unknown_fields_are_errors():
    errors = errors_of(spec(colour="blue"))
    assert errors["colour"] == "Unknown field."


def test_not_an_object():
    with pytest.raises(SpecError) as info:
        validate_cluster_spec(["a", "list"])
    assert "non_field_errors" in info.value.fields


def test_gce_needs_a_zone_and_no_local_machines():
    data = spec(provider="gce")
    errors = errors_of(data)
    assert "zone" in errors
    assert "node_pools[1].machine_spec.machine_type" in errors


def test_patch_resizes_and_keeps_the_rest():
    clean = validate_cluster_spec(spec())
    new = validate_cluster_patch(
        clean,
        {
            "node_pools": [
                {"id": "gpu", "scaling_spec": {"min_node_count": 6, "max_node_count": 6}}
            ],
            "labels": {"team": "llm"},
        },
    )
    assert new["node_pools"][1]["scaling_spec"]["min_node_count"] == 6
    assert new["node_pools"][0] == clean["node_pools"][0]
    assert new["labels"] == {"team": "llm"}


def test_patch_errors_name_paths():
    clean = validate_cluster_spec(spec())
    with pytest.raises(SpecError) as info:
        validate_cluster_patch(
            clean,
            {
                "node_pools": [
                    {"id": "ghost", "scaling_spec": {"min_node_count": 1}},
                    {"id": "gpu", "scaling_spec": {"min_node_count": -2}},
                ],
            },
        )
    assert "node_pools[0].id" in info.value.fields
    assert "node_pools[1].scaling_spec.min_node_count" in info.value.fields


def _a3u(**pool_changes) -> dict:
    from clusters.reference_architectures import architecture_get

    data = copy.deepcopy(architecture_get("a3-ultra-pretraining").build_spec())
    data["node_pools"][1].update(pool_changes)
    return data


def test_gce_rules_compute_engine_would_refuse_later():
    validate_cluster_spec(_a3u())
    # A3 Ultra attaches no Persistent Disk.
    disk = {"boot_disk_type": "pd-balanced", "boot_disk_size_gb": 200}
    assert "node_pools[1].boot_disk.boot_disk_type" in errors_of(_a3u(boot_disk=disk))
    # A reservation-bound pool names its reservation.
    pool = _a3u()["node_pools"][1]
    del pool["machine_spec"]["reservation_affinity"]
    assert "node_pools[1].machine_spec.reservation_affinity" in errors_of(
        _a3u(machine_spec=pool["machine_spec"])
    )
    # <cluster>-<pool>-<n> is an instance name: 63 characters at most.
    long_id = "p" + "o" * 30
    data = _a3u(id=long_id)
    data["orchestrator_spec"]["slurm_spec"]["partitions"][0]["node_pool_ids"] = [long_id]
    data["cluster_id"] = "c" + "l" * 30
    errors = errors_of(data)
    assert "node_pools[1].id" in errors and "63" in errors["node_pools[1].id"]
