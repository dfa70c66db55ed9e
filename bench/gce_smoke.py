"""What only a live Google Cloud project can confirm, checked against one: the
checklist at the end of docs/gce.md, "From an empty project to a training job".

    MTC_GCE_PROJECT=my-project .venv/bin/python bench/gce_smoke.py --zone us-east5-a \
        [--spec spec.json] [--run]

Read-only checks first (credentials, project, APIs, roles, the boot image, mtc's
network, the zone, the machine type, GPU quota, the reservation, the nodes' service
account), each printed as `ok`, `FAIL` or `skip` with what was seen. `--run` then
creates the spec's cluster through mtc, runs `srun hostname` on every node of its
default partition, prints how long each part took and deletes the cluster (this costs
money). Without Application Default Credentials or MTC_GCE_PROJECT it prints
`skipped: ...` and exits 0; a failed check exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mtc.settings")
# Operations run in this process (no worker needed): --run waits for each one.
os.environ.setdefault("MTC_CELERY_EAGER", "1")

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# The APIs a cluster's create touches (README, "Running on Compute Engine").
APIS = (
    "compute.googleapis.com",
    "monitoring.googleapis.com",
    "file.googleapis.com",
    "lustre.googleapis.com",
    "servicenetworking.googleapis.com",
)
# What create, repair and delete ask of mtc's account (the roles README names).
PERMISSIONS = (
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.reset",
    "compute.instances.getGuestAttributes",
    "compute.instanceTemplates.create",
    "compute.resourcePolicies.create",
    "compute.networks.create",
    "compute.networks.addPeering",
    "compute.subnetworks.create",
    "compute.addresses.createInternal",
    "compute.globalAddresses.create",
    "compute.firewalls.create",
    "iam.serviceAccounts.actAs",
    "monitoring.dashboards.create",
    "monitoring.timeSeries.create",
)


class Checklist:
    def __init__(self) -> None:
        self.failed = 0

    def check(self, name: str, probe: Callable[[], str]) -> None:
        """Run one probe: its return value is what it saw; an exception is a failure;
        a probe that returns "skip: why" did not apply."""
        try:
            seen = probe()
        except Exception as exc:  # noqa: BLE001 - every failure is reported the same way
            self.failed += 1
            print(f"FAIL  {name}: {type(exc).__name__}: {str(exc)[:300]}")
            return
        status = "skip" if seen.startswith("skip: ") else "ok"
        print(f"{status:<5} {name}: {seen.removeprefix('skip: ')}")


def gpu_pools(spec: dict) -> list[dict]:
    return [p for p in spec.get("node_pools", []) if p["machine_spec"].get("accelerator_type")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zone", default=os.environ.get("MTC_GCE_ZONE", "us-central1-a"))
    parser.add_argument("--spec", type=Path, help="the cluster spec to check (and --run)")
    parser.add_argument("--run", action="store_true", help="create, run srun, delete")
    args = parser.parse_args()

    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    project = os.environ.get("MTC_GCE_PROJECT", "")
    try:
        creds, adc_project = google.auth.default(scopes=[SCOPE])
    except DefaultCredentialsError as exc:
        print(f"skipped: no Application Default Credentials ({exc})")
        return 0
    if not project:
        print(f"skipped: MTC_GCE_PROJECT is not set (the credentials' project: {adc_project})")
        return 0

    import django

    django.setup()
    from django.conf import settings
    from google.auth.transport.requests import AuthorizedSession
    from google.cloud import compute_v1

    spec = json.loads(args.spec.read_text()) if args.spec else {}
    zone = spec.get("zone", args.zone) if spec else args.zone
    region = zone.rsplit("-", 1)[0]
    http = AuthorizedSession(creds)
    checks = Checklist()
    print(f"project {project}, zone {zone}")

    def rest(url: str, body: dict | None = None) -> dict:
        response = http.post(url, json=body) if body is not None else http.get(url)
        if response.status_code >= 400:
            raise RuntimeError(f"{response.status_code} {response.text[:200]}")
        return response.json()

    checks.check("project", lambda: compute_v1.ProjectsClient().get(project=project).name)

    def apis() -> str:
        base = f"https://serviceusage.googleapis.com/v1/projects/{project}/services"
        off = [a for a in APIS if rest(f"{base}/{a}").get("state") != "ENABLED"]
        if off:
            raise RuntimeError(f"not enabled: {', '.join(off)}")
        return f"{len(APIS)} enabled"

    checks.check("APIs", apis)

    def permissions() -> str:
        url = (
            f"https://cloudresourcemanager.googleapis.com/v1/projects/{project}:testIamPermissions"
        )
        held = set(rest(url, {"permissions": list(PERMISSIONS)}).get("permissions", []))
        missing = [p for p in PERMISSIONS if p not in held]
        if missing:
            raise RuntimeError(f"mtc's account lacks {', '.join(missing)}")
        return f"all {len(PERMISSIONS)} held"

    checks.check("permissions", permissions)

    def image() -> str:
        path = settings.MTC_GCE_IMAGE.format(project=project)
        parts = path.split("/")  # projects/<p>/global/images/[family/]<name>
        images = compute_v1.ImagesClient()
        if "family" in parts:
            found = images.get_from_family(project=parts[1], family=parts[-1])
        else:
            found = images.get(project=parts[1], image=parts[-1])
        return f"{found.name} ({found.creation_timestamp}, {found.status})"

    checks.check("boot image", image)
    checks.check(
        "mtc's network",
        lambda: (
            compute_v1.NetworksClient()
            .get(project=project, network=settings.MTC_GCE_NETWORK)
            .self_link
        ),
    )
    checks.check("zone", lambda: compute_v1.ZonesClient().get(project=project, zone=zone).status)

    for pool in spec.get("node_pools", []):
        machine = pool["machine_spec"]["machine_type"]
        checks.check(
            f"machine type {machine}",
            lambda machine=machine: (
                compute_v1.MachineTypesClient()
                .get(project=project, zone=zone, machine_type=machine)
                .description
            ),
        )

    def quota(pool: dict) -> str:
        accelerator = pool["machine_spec"]["accelerator_type"]
        wanted = pool["machine_spec"].get("accelerator_count", 0) * pool["scaling_spec"].get(
            "min_node_count", 0
        )
        quotas = compute_v1.RegionsClient().get(project=project, region=region).quotas
        metric = accelerator.upper().replace("-", "_").removesuffix("_141GB").removesuffix("_80GB")
        matching = [q for q in quotas if q.metric.startswith(metric) and q.metric.endswith("GPUS")]
        if not matching:
            return f"skip: no regional quota metric like {metric}*_GPUS (a reservation covers it?)"
        free = max(q.limit - q.usage for q in matching)
        if free < wanted:
            raise RuntimeError(f"{wanted} GPUs wanted, {free:.0f} free in {region}")
        return ", ".join(f"{q.metric} {q.usage:.0f}/{q.limit:.0f}" for q in matching)

    def reservation(pool: dict) -> str:
        affinity = pool["machine_spec"].get("reservation_affinity") or {}
        if affinity.get("reservation_affinity_type") != "SPECIFIC_RESERVATION":
            return "skip: the pool names no reservation"
        name = affinity["values"][0].rsplit("/", 1)[-1]
        found = compute_v1.ReservationsClient().get(project=project, zone=zone, reservation=name)
        sku = found.specific_reservation
        machine = sku.instance_properties.machine_type
        if machine != pool["machine_spec"]["machine_type"]:
            raise RuntimeError(f"{name} holds {machine}, the pool wants another machine type")
        room = sku.count - sku.in_use_count
        wanted = pool["scaling_spec"].get("min_node_count", 0)
        if room < wanted:
            raise RuntimeError(f"{name} has room for {room} VMs, the pool wants {wanted}")
        return f"{name}: {sku.in_use_count}/{sku.count} in use, {found.status}"

    for pool in gpu_pools(spec):
        checks.check(f"GPU quota ({pool['id']})", lambda pool=pool: quota(pool))
        checks.check(f"reservation ({pool['id']})", lambda pool=pool: reservation(pool))

    def node_account() -> str:
        from clusters.providers.gce.access import service_account

        email = service_account(settings.MTC_GCE_SERVICE_ACCOUNT, project)
        return rest(f"https://iam.googleapis.com/v1/projects/{project}/serviceAccounts/{email}")[
            "email"
        ]

    checks.check("nodes' service account", node_account)

    if args.run and not checks.failed:
        if not spec:
            print("FAIL  run: --run needs --spec")
            return 1
        run_cluster(spec, checks)
    return 1 if checks.failed else 0


def run_cluster(spec: dict, checks: Checklist) -> None:
    """Create the cluster through mtc, srun on every node, delete it; print the times."""
    from clusters import services
    from clusters.models import Cluster
    from clusters.providers import get_provider
    from clusters.providers.gce.api import compute_pools

    started = time.monotonic()
    spec = dict(spec, provider="gce")
    cluster_id = spec["cluster_id"]

    def create() -> str:
        services.cluster_create(spec=spec)  # runs the operation inline without a worker
        cluster = Cluster.objects.get(cluster_id=cluster_id)
        if cluster.state != "RUNNING":
            raise RuntimeError(f"cluster is {cluster.state}: {cluster.state_message}")
        return f"RUNNING after {time.monotonic() - started:.0f} s"

    def srun() -> str:
        cluster = Cluster.objects.get(cluster_id=cluster_id)
        slurm = get_provider(cluster.provider).slurm(cluster)
        nodes = sum(p["scaling_spec"].get("min_node_count", 0) for p in compute_pools(spec))
        at = time.monotonic()
        out = slurm.run(["srun", f"--nodes={nodes}", "hostname"], timeout=900).stdout
        return f"{len(out.split())} nodes answered in {time.monotonic() - at:.0f} s"

    def delete() -> str:
        at = time.monotonic()
        services.cluster_delete(cluster=Cluster.objects.get(cluster_id=cluster_id))
        return f"deleted in {time.monotonic() - at:.0f} s"

    checks.check("create", create)
    if not checks.failed:
        checks.check("srun on every node", srun)
    checks.check("delete", delete)


if __name__ == "__main__":
    sys.exit(main())
