"""The gce plan (what create would send), shown by the CLI and the wizard, and how
Compute Engine errors are classified. No network: the plan is pure."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from google.api_core import exceptions as gexc

from clusters.providers.gce.errors import Transient, from_http
from clusters.reference_architectures import architecture_get

from .test_pages import POOLS, SLURM, html, walk_wizard, wizard


@pytest.fixture
def operator_client(client, operator):
    client.force_login(operator)
    return client


def _plan_text(tmp_path, capsys, *flags) -> str:
    spec_file = tmp_path / "a3u.json"
    spec_file.write_text(json.dumps(architecture_get("a3-ultra-pretraining").build_spec()))
    call_command("mtc", "cluster", "plan", "-f", str(spec_file), *flags)
    return capsys.readouterr().out


@pytest.mark.django_db
def test_cli_plan_of_a3_ultra_shows_the_requests(tmp_path, capsys, settings):
    settings.MTC_GCE_PROJECT = "my-project"
    plan = json.loads(_plan_text(tmp_path, capsys, "--json"))
    requests = {r["method"]: r for r in plan["requests"]}
    # The reservation places its VMs: no placement policy of mtc's beside it.
    assert "compute.resourcePolicies.insert" not in requests
    templates = [r["body"] for r in plan["requests"] if r["method"].endswith("Templates.insert")]
    gpu = next(t["properties"] for t in templates if t["name"].startswith("a3u-pretrain-a3u-"))
    assert gpu["machineType"] == "a3-ultragpu-8g"
    assert gpu["guestAccelerators"] == [
        {"acceleratorType": "nvidia-h200-141gb", "acceleratorCount": 8}
    ]
    assert gpu["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["a3u-reservation"],
    }
    assert gpu["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"
    assert gpu["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert "resourcePolicies" not in gpu
    bulk = requests["compute.instances.bulkInsert"]
    assert bulk["body"]["count"] == "16" and len(bulk["body"]["perInstanceProperties"]) == 16
    assert bulk["http"] == (
        "POST /compute/v1/projects/my-project/zones/us-central1-a/instances/bulkInsert"
    )
    # The secret never appears in a plan.
    assert "generated at create, not shown" in json.dumps(plan)

    text = _plan_text(tmp_path, capsys)
    assert "22 Compute Engine and Cloud Monitoring requests for cluster a3u-pretrain" in text
    assert "--- metadata startup-script:" in text
    # Storage mtc makes: its address is read back at create, never a placeholder IP.
    assert "mount_once '<address read at create>:/home' /home" in text
    assert "storage: file.instances.create" in text and "storage: lustre.instances.create" in text
    assert "storage: servicenetworking.services.connections.create" in text
    assert "SlurmctldParameters=enable_configless" in text


@pytest.mark.django_db
def test_cli_plan_rejects_a_bad_spec_and_a_local_one(tmp_path):
    from django.core.management.base import CommandError

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cluster_id": "Bad", "provider": "gce"}))
    with pytest.raises(CommandError, match="cluster_id"):
        call_command("mtc", "cluster", "plan", "-f", str(bad))
    local = tmp_path / "local.json"
    local.write_text(json.dumps(architecture_get("local-dev").build_spec()))
    with pytest.raises(CommandError, match="no cloud requests"):
        call_command("mtc", "cluster", "plan", "-f", str(local))


def test_wizard_review_lists_the_compute_engine_requests(operator_client):
    basics = {
        "cluster_id": "wizg",
        "display_name": "",
        "provider": "gce",
        "zone": "us-central1-a",
        "labels": "",
    }
    pools = {
        **POOLS,
        "login-login_machine_type": "n2-standard-8",
        "pools-0-machine_type": "a3-ultragpu-8g",
    }
    walk_wizard(operator_client, basics=basics, pools=pools, slurm=SLURM)
    page = html(operator_client.get(wizard("review")))
    assert 'data-testid="cloud-requests"' in page
    assert "compute.instances.bulkInsert" in page and "compute.instanceTemplates.insert" in page
    assert "nvidia-h200-141gb" in page


def test_local_review_has_no_cloud_requests(operator_client):
    walk_wizard(operator_client)
    assert 'data-testid="cloud-requests"' not in html(operator_client.get(wizard("review")))


def _api_error(cls, reason: str, message: str):
    return cls(message, errors=[{"reason": reason, "message": message}])


def test_errors_are_classified_for_people():
    quota = from_http(
        _api_error(gexc.Forbidden, "quotaExceeded", "Quota 'GPUS' exceeded"),
        where="instances.bulkInsert",
    )
    assert quota.code == "QUOTA_EXCEEDED" and quota.permanent and "Quotas" in str(quota)
    denied = from_http(
        _api_error(gexc.Forbidden, "forbidden", "Required 'compute.instances.create' permission"),
        where="instances.insert",
    )
    assert denied.code == "PERMISSION_DENIED" and "compute.instances.create" in str(denied)
    assert isinstance(from_http(gexc.ServiceUnavailable("down"), where="x"), Transient)
    assert isinstance(
        from_http(_api_error(gexc.Forbidden, "rateLimitExceeded", "slow down"), where="x"),
        Transient,
    )
    bad = from_http(_api_error(gexc.BadRequest, "invalid", "Invalid value for field"), where="x")
    assert bad.permanent and "Invalid value" in str(bad)


@pytest.mark.django_db
def test_make_run_with_gce_checks_the_project_and_creates_no_demo(settings, capsys):
    from clusters.models import Cluster

    settings.MTC_PROVIDER = "gce"
    settings.MTC_GCE_PROJECT = ""
    call_command("mtc", "demo")
    out = capsys.readouterr().out
    assert "set MTC_GCE_PROJECT" in out
    settings.MTC_GCE_PROJECT = "my-project"
    settings.MTC_GCE_ANONYMOUS = True  # no credential lookup
    call_command("mtc", "demo")
    assert "no demo cluster is created on gce" in capsys.readouterr().out
    assert not Cluster.objects.exists()


def test_a_spec_without_provider_gets_the_installations(settings):
    from clusters.spec import validate_cluster_spec

    spec = architecture_get("a3-ultra-pretraining").build_spec()
    del spec["provider"]
    settings.MTC_PROVIDER = "gce"
    assert validate_cluster_spec(spec)["provider"] == "gce"


def test_reservation_errors_have_their_own_codes():
    missing = from_http(
        _api_error(
            gexc.BadRequest,
            "invalid",
            "Could not find the given reservation with the following name: a3u-reservation",
        ),
        where="instances.bulkInsert",
    )
    assert missing.code == "RESERVATION_MISMATCH" and missing.permanent
    # A full reservation answers 429: no retry mends it.
    full = from_http(
        _api_error(
            gexc.TooManyRequests,
            "rateLimitExceeded",
            "Reservation does not have enough resources for the request: specific "
            "reservation 'a3u-reservation' is insufficient: required 4 and short of 2 VM count.",
        ),
        where="instances.bulkInsert",
    )
    assert full.code == "RESERVATION_EXHAUSTED" and full.permanent
    from clusters.providers.gce.errors import error_for

    in_operation = error_for(
        "CONDITION_NOT_MET",
        "Specified reservation 'r' does not match the reservation's machine type a3-megagpu-8g.",
        where="bulkInsert",
    )
    assert in_operation.code == "RESERVATION_MISMATCH"
    assert error_for("ZONE_RESOURCE_POOL_EXHAUSTED", "no room", where="x").code == "STOCKOUT"


def test_a_gpu_pool_not_from_a_reservation_keeps_its_compact_placement():
    from clusters.providers.gce.plan import needs_placement_policy

    pool = {"machine_spec": {"accelerator_count": 8}, "provisioning_model": "SPOT"}
    assert needs_placement_policy(pool)
    assert not needs_placement_policy({**pool, "provisioning_model": "RESERVATION"})
    assert not needs_placement_policy({"machine_spec": {}, "provisioning_model": "STANDARD"})


@pytest.mark.django_db
def test_plan_shows_where_accounting_is_stored(tmp_path, capsys, settings):
    """slurmdbd on the controller: over MariaDB there by default, or a named Cloud SQL."""
    settings.MTC_GCE_PROJECT = "my-project"
    text = _plan_text(tmp_path, capsys)
    assert "Accounting storage: MariaDB on this controller" in text
    assert "AccountingStorageType=accounting_storage/slurmdbd" in text
    assert "sacctmgr -i add cluster a3u_pretrain" in text

    spec = architecture_get("a3-ultra-pretraining").build_spec()
    spec["orchestrator_spec"]["slurm_spec"]["accounting"] = {
        "cloud_sql": {"host": "10.20.0.3", "user": "slurm", "password_secret": "slurmdbd-db"}
    }
    spec_file = tmp_path / "sql.json"
    spec_file.write_text(json.dumps(spec))
    call_command("mtc", "cluster", "plan", "-f", str(spec_file))
    text = capsys.readouterr().out
    assert "Accounting storage: Cloud SQL" in text and "STORAGE_HOST=10.20.0.3" in text
    assert "--secret=slurmdbd-db" in text and "MariaDB on this controller" not in text


def test_a_cloud_sql_accounting_spec_is_checked_field_by_field():
    from clusters.spec import SpecError, validate_cluster_spec

    spec = architecture_get("a3-ultra-pretraining").build_spec()
    spec["orchestrator_spec"]["slurm_spec"]["accounting"] = {
        "cloud_sql": {"host": "db.example", "user": "x;y", "port": 0, "extra": 1}
    }
    with pytest.raises(SpecError) as err:
        validate_cluster_spec(spec)
    fields = err.value.fields
    base = "orchestrator_spec.slurm_spec.accounting.cloud_sql"
    for name in ("host", "user", "port", "password_secret", "extra"):
        assert f"{base}.{name}" in fields, name


def test_gce_slurm_conf_gives_jobs_time_to_checkpoint_after_sigterm():
    import copy

    from clusters.providers.gce.bootstrap import slurm_conf

    spec = copy.deepcopy(architecture_get("a3-ultra-pretraining").spec)
    assert "KillWait=120\n" in slurm_conf(spec)
    spec["orchestrator_spec"]["slurm_spec"]["config_overrides"] = {"KillWait": "300"}
    assert "KillWait=300\n" in slurm_conf(spec)


def _plan(key: str, settings) -> list[dict]:
    from clusters.providers.gce.provider import plan_describe

    settings.MTC_GCE_PROJECT = "my-project"
    settings.MTC_GCE_CONTROL_ADDRESS = "10.128.0.9"
    return plan_describe(architecture_get(key).build_spec())["requests"]


def _metadata(template: dict) -> dict[str, str]:
    return {i["key"]: i["value"] for i in template["properties"]["metadata"]["items"]}


@pytest.mark.django_db
def test_a3_ultra_plan_has_rdma_nics_the_rule_from_mtc_and_a_dashboard(settings):
    import re

    requests = _plan("a3-ultra-pretraining", settings)
    by_name = {(r["method"], r["name"]): r.get("body") for r in requests}
    templates = {  # by <cluster>-<pool>: the name without its content version
        n.rsplit("-", 1)[0]: b for (m, n), b in by_name.items() if m.endswith("Templates.insert")
    }
    # No metadata item holds key material: the munge key is a placeholder in a plan.
    for template in templates.values():
        for key, value in _metadata(template).items():
            assert "PRIVATE KEY" not in value, key
            assert not re.search(r"[A-Za-z0-9+/]{200,}={0,2}", value), key
        assert _metadata(template)["mtc-munge-key"].startswith("<munge key")
    gpu = templates["a3u-pretrain-a3u"]["properties"]
    assert gpu["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"
    # nic0 on mtc's own network, a second gVNIC VPC, eight MRDMA NICs on the RoCE VPC.
    nics = gpu["networkInterfaces"]
    assert [n["nicType"] for n in nics] == ["GVNIC", "GVNIC"] + ["MRDMA"] * 8
    assert nics[0]["network"].endswith("/networks/default")
    assert {n["network"].rsplit("/", 1)[1] for n in nics[2:]} == {"a3u-pretrain-roce"}
    assert len({n["subnetwork"] for n in nics[2:]}) == 8
    roce = by_name[("compute.networks.insert", "a3u-pretrain-roce")]
    assert roce["networkProfile"].endswith("/networkProfiles/us-central1-a-vpc-roce")
    assert roce["mtu"] == 8896
    assert by_name[("compute.networks.insert", "a3u-pretrain-gvnic-1")]["mtu"] == 8896
    # The firewall rule from mtc's host to slurmctld.
    rule = by_name[("compute.firewalls.insert", "a3u-pretrain-from-mtc")]
    assert rule["sourceRanges"] == ["10.128.0.9/32"]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["6817"]}]
    assert rule["targetTags"] == ["mtc-a3u-pretrain-login"]
    # SlurmctldHost names the address reserved for the controller; GRES has device files.
    controller = _metadata(templates["a3u-pretrain-login"])
    assert (
        "SlurmctldHost=a3u-pretrain-controller(<reserved at create>)"
        in (controller["mtc-slurm-conf"])
    )
    assert controller["mtc-gres-conf"].splitlines()[1:] == [
        "AutoDetect=off",
        "NodeName=a3u-pretrain-a3u-[0-15] Name=gpu Type=h200 File=/dev/nvidia[0-7]",
    ]
    address = by_name[("compute.addresses.insert", "a3u-pretrain-controller-ip")]
    assert address["addressType"] == "INTERNAL"
    # The dashboard: GPU charts by node from DCGM receiver v2, memory only state="used".
    dash = by_name[("monitoring.dashboards.insert", "mtc-a3u-pretrain")]
    filters = {
        t["widget"]["title"]: t["widget"]["xyChart"]["dataSets"][0]["timeSeriesQuery"][
            "timeSeriesFilter"
        ]
        for t in dash["mosaicLayout"]["tiles"]
    }
    assert set(filters) == {
        "GPU utilization by node",
        "GPU temperature by node",
        "GPU power by node",
        "GPU memory used by node",
        "Nodes by health",
        "Jobs by state",
    }
    memory = filters["GPU memory used by node"]
    assert 'workload.googleapis.com/gpu.dcgm.memory.bytes_used"' in memory["filter"]
    assert 'metric.labels.state="used"' in memory["filter"]
    assert 'metadata.user_labels."mtc-cluster"="a3u-pretrain"' in memory["filter"]
    assert memory["aggregation"]["groupByFields"] == ["metadata.system_labels.name"]
    (http,) = [r["http"] for r in requests if r["method"] == "monitoring.dashboards.insert"]
    assert http == "POST /v1/projects/my-project/dashboards"


@pytest.mark.django_db
def test_a3_mega_plan_has_the_tcpxo_layout(settings):
    requests = _plan("a3-mega-finetuning", settings)
    templates = {r["name"]: r["body"] for r in requests if r["method"].endswith("Templates.insert")}
    gpu = next(
        t["properties"]
        for t in templates.values()
        if t["properties"]["machineType"] == "a3-megagpu-8g"
    )
    assert [n["nicType"] for n in gpu["networkInterfaces"]] == ["GVNIC"] * 9
    data = [r["body"] for r in requests if r["method"] == "compute.networks.insert"]
    assert len(data) == 8 and {n["mtu"] for n in data} == {8244}
    assert not any("networkProfile" in n for n in data)


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["a3-ultra-pretraining", "a4-pretraining", "a3-mega-finetuning"])
def test_golden_plans_parse_with_the_typed_clients(key, settings):
    """Every Compute Engine body of every reference architecture is one the typed
    google-cloud-compute messages accept (an unknown or misspelt field fails)."""
    from google.cloud import compute_v1

    from clusters.providers.gce.client import KINDS

    for request in _plan(key, settings):
        resource, verb = request["method"].split(".")[1:]
        if resource == "dashboards":
            continue  # no typed client installed: the fake checks its shape
        if verb == "bulkInsert":
            message = compute_v1.BulkInsertInstanceResource
        elif verb == "addPeering":
            message = compute_v1.NetworksAddPeeringRequest
        else:
            message = getattr(compute_v1, KINDS[resource].message)
        message.from_json(json.dumps(request["body"]), ignore_unknown_fields=False)
