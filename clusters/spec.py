"""The cluster spec (docs/spec.md): one validator for the API, the wizard,
JSON upload and the CLI. Errors are keyed by JSON path, e.g.
``node_pools[1].scaling_spec.min_node_count``.

Past 400 lines on purpose: the whole spec's rules in one place, in the order of the
spec's sections, so what the API, the wizard and the CLI accept cannot drift apart."""

from __future__ import annotations

import copy
import re
from typing import Any

from django.conf import settings

from mtc.fielderrors import FieldErrors

# Every spec string is one line: control characters, NEL and U+2028/U+2029 refused.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
ID_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
LOCAL_MACHINE_RE = re.compile(r"^local-([1-9][0-9]?)$")
MACHINE_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]{1,62}$")
ACCELERATOR_RE = re.compile(r"^[A-Z][A-Z0-9_]{1,62}$")
SLURM_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]{1,62}$")
MOUNT_RE = re.compile(r"^/[A-Za-z0-9._/-]{0,254}$")
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
IPV4_RE = re.compile(
    r"^(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){3}$"
)

PROVIDERS = ("local", "gce")
PROVISIONING_MODELS = ("STANDARD", "SPOT", "RESERVATION", "FLEX_START")
RESERVATION_AFFINITY_TYPES = ("NO_RESERVATION", "ANY_RESERVATION", "SPECIFIC_RESERVATION")
BOOT_DISK_TYPES = ("pd-standard", "pd-balanced", "pd-ssd", "hyperdisk-balanced")
# Machine series that attach no Persistent Disk (Compute Engine's disk support per
# machine series): A3 Ultra, A4 and A4X boot from Hyperdisk.
HYPERDISK_ONLY_FAMILIES = ("a3-ultragpu-", "a4-highgpu-", "a4x-highgpu-")
GCE_MAX_NAME = 63  # an instance name, and so the node's hostname
LUSTRE_TIERS = (125, 250, 500, 1000)
INSTANCE_RE = re.compile(r"[a-z][a-z0-9-]{0,62}")
# Slurm settings that mtc itself owns (ports, paths, auth): a spec may not override them.
RESERVED_SLURM_KEYS = {
    "clustername",
    # The installation's slurmdbd (mtc/accounting.py) and the munged it trusts.
    "accountingstoragetype",
    "accountingstoragehost",
    "accountingstorageport",
    "accountingstoragepass",
    "slurmctldhost",
    "slurmctldport",
    "slurmdport",
    "authtype",
    "authinfo",
    "credtype",
    "slurmuser",
    "slurmduser",
    "statesavelocation",
    "slurmdspooldir",
    "slurmctldpidfile",
    "slurmdpidfile",
    "slurmctldlogfile",
    "slurmdlogfile",
    "prolog",
    "epilog",
    "nodename",
    "partitionname",
    "grestypes",
    "include",
    "plugindir",
    "proctracktype",
    "taskplugin",
}
MAX_NODES = {"local": None, "gce": 1000}  # local comes from settings
MAX_ACCELERATORS = 16
MAX_SCRIPT_BYTES = 64 * 1024


class SpecError(FieldErrors):
    """A spec with errors: ``fields`` maps each JSON path to a message."""


class _Checker:
    def __init__(self) -> None:
        self.errors: dict[str, str] = {}

    def fail(self, path: str, message: str) -> None:
        self.errors.setdefault(path, message)

    def obj(self, value: Any, path: str, *, required: bool = True) -> dict | None:
        if value is None:
            if required:
                self.fail(path, "This field is required.")
            return None
        if not isinstance(value, dict):
            self.fail(path, "Must be an object.")
            return None
        return value

    def unknown(self, value: dict, allowed: set[str], path: str) -> None:
        for key in value:
            if key not in allowed:
                self.fail(f"{path}.{key}" if path else str(key), "Unknown field.")

    def string(
        self,
        value: Any,
        path: str,
        *,
        required: bool = True,
        pattern: re.Pattern | None = None,
        choices: tuple | None = None,
        max_len: int = 200,
        hint: str = "",
        multiline: bool = False,
    ) -> str | None:
        if value is None or value == "":
            if required:
                self.fail(path, "This field is required.")
            return None
        if not isinstance(value, str):
            self.fail(path, "Must be a string.")
            return None
        if len(value) > max_len:
            self.fail(path, f"At most {max_len} characters.")
            return None
        if not multiline and CONTROL_RE.search(value):  # a script keeps its own rule (NUL)
            self.fail(path, "No control characters or line/paragraph separators.")
            return None
        if choices is not None and value not in choices:
            self.fail(path, f"Must be one of: {', '.join(map(str, choices))}.")
            return None
        if pattern is not None and not pattern.fullmatch(value):
            self.fail(path, hint or f"Must match {pattern.pattern}.")
            return None
        return value

    def integer(
        self,
        value: Any,
        path: str,
        *,
        required: bool = True,
        minimum: int = 0,
        maximum: int | None = None,
    ) -> int | None:
        if value is None:
            if required:
                self.fail(path, "This field is required.")
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, "Must be an integer.")
            return None
        if value < minimum:
            self.fail(path, f"Must be at least {minimum}.")
            return None
        if maximum is not None and value > maximum:
            self.fail(path, f"Must be at most {maximum}.")
            return None
        return value

    def array(self, value: Any, path: str, *, required: bool = False) -> list:
        if value is None:
            if required:
                self.fail(path, "This field is required.")
            return []
        if not isinstance(value, list):
            self.fail(path, "Must be an array.")
            return []
        return value


def max_nodes_for(provider: str) -> int:
    if provider == "local":
        return settings.MTC_LOCAL_MAX_NODES_PER_CLUSTER
    return MAX_NODES[provider] or 1000


def _check_labels(c: _Checker, labels: Any, path: str) -> dict:
    labels = c.obj(labels, path, required=False) or {}
    if len(labels) > 64:
        c.fail(path, "At most 64 labels.")
    for key, value in labels.items():
        if not LABEL_KEY_RE.fullmatch(str(key)):
            c.fail(f"{path}.{key}", "Label keys are lowercase letters, digits, _ and -.")
        elif not isinstance(value, str) or not LABEL_VALUE_RE.fullmatch(value):
            c.fail(f"{path}.{key}", "Label values are lowercase letters, digits, _ and - (≤63).")
    return labels


def _check_scaling(c: _Checker, scaling: Any, path: str, provider: str) -> None:
    scaling = c.obj(scaling, path)
    if scaling is None:
        return
    c.unknown(scaling, {"min_node_count", "max_node_count"}, path)
    limit = max_nodes_for(provider)
    low = c.integer(scaling.get("min_node_count"), f"{path}.min_node_count", maximum=limit)
    high = c.integer(scaling.get("max_node_count", low), f"{path}.max_node_count", maximum=limit)
    if low is not None and high is not None and high < low:
        c.fail(f"{path}.max_node_count", "Must be at least min_node_count.")


def _check_spares(c: _Checker, pool: dict, path: str) -> None:
    """Hot spares (clusters/spares.py) come out of the pool's own nodes: at least one node
    must be left to take work."""
    spares = c.integer(pool.get("spare_node_count"), f"{path}.spare_node_count", required=False)
    scaling = pool.get("scaling_spec")
    count = scaling.get("min_node_count") if isinstance(scaling, dict) else None
    if spares and isinstance(count, int) and not isinstance(count, bool) and spares >= count:
        c.fail(
            f"{path}.spare_node_count",
            f"Must be less than the pool's node count ({count}): spares are idle nodes of it.",
        )


def _check_machine_spec(c: _Checker, machine: Any, path: str, provider: str) -> None:
    machine = c.obj(machine, path)
    if machine is None:
        return
    c.unknown(
        machine,
        {"machine_type", "accelerator_type", "accelerator_count", "reservation_affinity"},
        path,
    )
    machine_type = c.string(
        machine.get("machine_type"),
        f"{path}.machine_type",
        pattern=MACHINE_TYPE_RE,
        hint="A machine type such as a3-ultragpu-8g, or local-N on the local provider.",
    )
    if machine_type and provider == "gce" and machine_type.startswith("local-"):
        c.fail(f"{path}.machine_type", "local-N machine types exist only on the local provider.")
    accel = c.string(
        machine.get("accelerator_type"),
        f"{path}.accelerator_type",
        required=False,
        pattern=ACCELERATOR_RE,
        hint="An accelerator type such as NVIDIA_H200_141GB.",
    )
    count = c.integer(
        machine.get("accelerator_count"),
        f"{path}.accelerator_count",
        required=False,
        maximum=MAX_ACCELERATORS,
    )
    if accel and not count:
        c.fail(f"{path}.accelerator_count", "Required (at least 1) with accelerator_type.")
    if count and not accel:
        c.fail(f"{path}.accelerator_type", "Required with accelerator_count.")
    affinity = c.obj(
        machine.get("reservation_affinity"), f"{path}.reservation_affinity", required=False
    )
    if affinity is not None:
        apath = f"{path}.reservation_affinity"
        c.unknown(affinity, {"reservation_affinity_type", "key", "values"}, apath)
        kind = c.string(
            affinity.get("reservation_affinity_type"),
            f"{apath}.reservation_affinity_type",
            choices=RESERVATION_AFFINITY_TYPES,
        )
        if kind == "SPECIFIC_RESERVATION":
            c.string(affinity.get("key"), f"{apath}.key")
            values = c.array(affinity.get("values"), f"{apath}.values", required=True)
            if not values and f"{apath}.values" not in c.errors:
                c.fail(f"{apath}.values", "Name at least one reservation.")
            for i, value in enumerate(values):
                c.string(
                    value,
                    f"{apath}.values[{i}]",
                    pattern=ID_RE,
                    hint="A reservation name (lowercase letters, digits, -).",
                )


def _check_node_name_length(c: _Checker, cluster_id: str, pool: Any, path: str) -> None:
    """Nodes are named <cluster>-<pool>-<n>, and an instance name holds 63 characters."""
    if not isinstance(pool, dict) or not isinstance(pool.get("id"), str):
        return
    scaling = pool.get("scaling_spec") if isinstance(pool.get("scaling_spec"), dict) else {}
    largest = scaling.get("max_node_count") or scaling.get("min_node_count") or 1
    if not isinstance(largest, int) or f"{path}.id" in c.errors:
        return
    longest = f"{cluster_id}-{pool['id']}-{max(largest - 1, 0)}"
    if len(longest) > GCE_MAX_NAME:
        c.fail(
            f"{path}.id",
            f"Node names such as {longest} would pass Compute Engine's {GCE_MAX_NAME} "
            "characters: shorten the pool or cluster id.",
        )


def _check_pool(c: _Checker, pool: Any, path: str, provider: str) -> str | None:
    pool = c.obj(pool, path)
    if pool is None:
        return None
    c.unknown(
        pool,
        {
            "id",
            "machine_spec",
            "scaling_spec",
            "spare_node_count",
            "provisioning_model",
            "boot_disk",
            "zone",
        },
        path,
    )
    pool_id = c.string(
        pool.get("id"),
        f"{path}.id",
        pattern=ID_RE,
        hint="Ids are lowercase letters, digits and -, starting with a letter (≤31).",
    )
    _check_machine_spec(c, pool.get("machine_spec"), f"{path}.machine_spec", provider)
    _check_scaling(c, pool.get("scaling_spec"), f"{path}.scaling_spec", provider)
    _check_spares(c, pool, path)
    model = c.string(
        pool.get("provisioning_model"),
        f"{path}.provisioning_model",
        required=False,
        choices=PROVISIONING_MODELS,
    )
    machine = pool.get("machine_spec") if isinstance(pool.get("machine_spec"), dict) else {}
    affinity = machine.get("reservation_affinity")
    if (
        provider == "gce"
        and model == "RESERVATION"
        and not (
            isinstance(affinity, dict)
            and affinity.get("reservation_affinity_type") == "SPECIFIC_RESERVATION"
        )
        and f"{path}.machine_spec.reservation_affinity" not in c.errors
    ):
        # Reservation-bound VMs (A3 Ultra, A4 capacity) consume one named reservation.
        c.fail(
            f"{path}.machine_spec.reservation_affinity",
            "provisioning_model RESERVATION needs a SPECIFIC_RESERVATION naming the reservation.",
        )
    disk = c.obj(pool.get("boot_disk"), f"{path}.boot_disk", required=False)
    if disk is not None:
        c.unknown(disk, {"boot_disk_type", "boot_disk_size_gb"}, f"{path}.boot_disk")
        c.string(
            disk.get("boot_disk_type"),
            f"{path}.boot_disk.boot_disk_type",
            required=False,
            choices=BOOT_DISK_TYPES,
        )
        c.integer(
            disk.get("boot_disk_size_gb"),
            f"{path}.boot_disk.boot_disk_size_gb",
            required=False,
            minimum=10,
            maximum=65536,
        )
        machine_type = machine.get("machine_type")
        disk_type = disk.get("boot_disk_type")
        if (
            provider == "gce"
            and isinstance(machine_type, str)
            and machine_type.startswith(HYPERDISK_ONLY_FAMILIES)
            and isinstance(disk_type, str)
            and disk_type.startswith("pd-")
            and f"{path}.boot_disk.boot_disk_type" not in c.errors
        ):
            c.fail(
                f"{path}.boot_disk.boot_disk_type",
                f"{machine_type} takes Hyperdisk only: use hyperdisk-balanced.",
            )
    return pool_id


def _check_network(c: _Checker, network: Any) -> None:
    network = c.obj(network, "network", required=False)
    if network is None:
        return
    c.unknown(network, {"network", "subnetwork", "mtu", "private_service_access"}, "network")
    c.string(
        network.get("network"),
        "network.network",
        required=False,
        pattern=ID_RE,
        hint="A VPC network name.",
    )
    c.string(
        network.get("subnetwork"),
        "network.subnetwork",
        required=False,
        pattern=ID_RE,
        hint="A subnetwork name.",
    )
    c.integer(network.get("mtu"), "network.mtu", required=False, minimum=1300, maximum=8896)
    psa = c.obj(
        network.get("private_service_access"), "network.private_service_access", required=False
    )
    if psa is not None:
        c.unknown(psa, {"range_prefix_length"}, "network.private_service_access")
        c.integer(
            psa.get("range_prefix_length"),
            "network.private_service_access.range_prefix_length",
            minimum=8,
            maximum=29,
        )


def _check_storage(c: _Checker, storage: Any, provider: str = "local") -> None:
    storage = c.obj(storage, "storage", required=False)
    if storage is None:
        return
    c.unknown(storage, {"home", "lustre", "gcs_fuse", "run_root"}, "storage")
    mounts: dict[str, str] = {}

    def mount(value: Any, path: str) -> None:
        point = c.string(value, path, pattern=MOUNT_RE, hint="An absolute path such as /mnt/x.")
        if point and ".." in point.split("/"):
            c.fail(path, "May not contain '..'.")
        elif point in mounts:
            c.fail(path, f"Mount point already used by {mounts[point]}.")
        elif point:
            mounts[point] = path

    home = c.obj(storage.get("home"), "storage.home", required=False)
    if home is not None:
        # Filestore: ``instance`` names one to check, neither it nor ``ip`` asks mtc to
        # make one (``tier``, ``capacity_gib``); ``ip`` is a server mtc does not manage.
        c.unknown(home, {"type", "ip", "share", "instance", "tier", "capacity_gib"}, "storage.home")
        kind = c.string(home.get("type"), "storage.home.type", choices=("filestore", "nfs"))
        c.string(
            home.get("ip"),
            "storage.home.ip",
            required=kind == "nfs",
            pattern=IPV4_RE,
            hint="An IPv4 address.",
        )
        c.string(
            home.get("instance"),
            "storage.home.instance",
            required=False,
            pattern=INSTANCE_RE,
            hint="A Filestore instance id in the cluster's zone.",
        )
        if home.get("ip") and home.get("instance"):
            c.fail("storage.home.instance", "Name an instance or give an ip, not both.")
        c.string(
            home.get("tier"),
            "storage.home.tier",
            required=False,
            choices=("BASIC_HDD", "BASIC_SSD", "ZONAL", "REGIONAL"),
        )
        c.integer(
            home.get("capacity_gib"),
            "storage.home.capacity_gib",
            required=False,
            minimum=1024,
            maximum=102400,
        )
        c.string(
            home.get("share"),
            "storage.home.share",
            pattern=re.compile(r"^[A-Za-z0-9_-]+$"),
            hint="A share name.",
        )
        mounts["/home"] = "storage.home"
    for i, item in enumerate(c.array(storage.get("lustre"), "storage.lustre")):
        path = f"storage.lustre[{i}]"
        item = c.obj(item, path)
        if item is None:
            continue
        c.unknown(
            item,
            {
                "ip",
                "instance",
                "filesystem",
                "mount_point",
                "performance_tier_mbps_per_tib",
                "capacity_gib",
            },
            path,
        )
        # As for Filestore: ``instance`` is checked, neither it nor ``ip`` is made by mtc.
        c.string(
            item.get("ip"), f"{path}.ip", required=False, pattern=IPV4_RE, hint="An IPv4 address."
        )
        c.string(
            item.get("instance"),
            f"{path}.instance",
            required=False,
            pattern=INSTANCE_RE,
            hint="A Managed Lustre instance id in the cluster's zone.",
        )
        if item.get("ip") and item.get("instance"):
            c.fail(f"{path}.instance", "Name an instance or give an ip, not both.")
        made = not item.get("ip") and not item.get("instance")
        for key in ("performance_tier_mbps_per_tib", "capacity_gib"):
            if made and item.get(key) is None:
                c.fail(f"{path}.{key}", "Required when mtc makes the instance.")
        c.string(
            item.get("filesystem"),
            f"{path}.filesystem",
            pattern=re.compile(r"^[a-z][a-z0-9]{0,7}$"),
            hint="A Lustre file system name (≤8 lowercase letters and digits).",
        )
        mount(item.get("mount_point"), f"{path}.mount_point")
        tier = item.get("performance_tier_mbps_per_tib")
        if tier is not None and (isinstance(tier, bool) or tier not in LUSTRE_TIERS):
            c.fail(
                f"{path}.performance_tier_mbps_per_tib",
                f"Must be one of: {', '.join(map(str, LUSTRE_TIERS))}.",
            )
        c.integer(
            item.get("capacity_gib"),
            f"{path}.capacity_gib",
            required=False,
            minimum=9000,
            maximum=8_000_000,
        )
    for i, item in enumerate(c.array(storage.get("gcs_fuse"), "storage.gcs_fuse")):
        path = f"storage.gcs_fuse[{i}]"
        item = c.obj(item, path)
        if item is None:
            continue
        c.unknown(item, {"bucket", "mount_point"}, path)
        c.string(
            item.get("bucket"),
            f"{path}.bucket",
            pattern=BUCKET_RE,
            hint="A Cloud Storage bucket name.",
        )
        mount(item.get("mount_point"), f"{path}.mount_point")
    _check_run_root(c, storage.get("run_root"), provider, mounts)


def _check_run_root(c: _Checker, value: Any, provider: str, mounts: dict[str, str]) -> None:
    """Where jobs write (clusters/runroot.py). On gce it must be on storage every node
    mounts at the same path (Filestore /home or Lustre: a bucket through gcsfuse takes
    neither renames nor appends the way checkpoints and logs need); on the local
    provider it is any absolute path on this host."""
    path = "storage.run_root"
    root = c.string(
        value, path, required=False, pattern=MOUNT_RE, hint="An absolute path such as /home/mtc."
    )
    if not root:
        return
    if ".." in root.split("/") or root == "/":
        c.fail(path, "An absolute path below /, without '..'.")
        return
    if provider != "gce":
        return
    shared = [m for m, where in mounts.items() if not where.startswith("storage.gcs_fuse")]
    if not any(root == m or root.startswith(m.rstrip("/") + "/") for m in shared):
        c.fail(
            path,
            "Must be on the cluster's Filestore /home or a Lustre mount point "
            f"({', '.join(sorted(shared)) or 'the spec mounts neither'}).",
        )


SECRET_RE = re.compile(r"[A-Za-z0-9_-]{1,255}")
DB_USER_RE = re.compile(r"[A-Za-z0-9_]{1,32}")


def _check_accounting(c: _Checker, accounting: Any, path: str) -> None:
    """gce: slurmdbd on the controller over MariaDB there (absent), or over a Cloud SQL
    instance the spec names. Local clusters share the installation's slurmdbd."""
    accounting = c.obj(accounting, path, required=False)
    if accounting is None:
        return
    c.unknown(accounting, {"cloud_sql"}, path)
    sql = c.obj(accounting.get("cloud_sql"), f"{path}.cloud_sql")
    if sql is None:
        return
    base = f"{path}.cloud_sql"
    c.unknown(sql, {"host", "port", "user", "password_secret"}, base)
    c.string(sql.get("host"), f"{base}.host", pattern=IPV4_RE, hint="The instance's private IP.")
    c.integer(sql.get("port"), f"{base}.port", required=False, minimum=1, maximum=65535)
    c.string(sql.get("user"), f"{base}.user", pattern=DB_USER_RE, hint="A MySQL user name.")
    c.string(
        sql.get("password_secret"),
        f"{base}.password_secret",
        pattern=SECRET_RE,
        hint="A Secret Manager secret id (its latest version is the password).",
    )


def _check_slurm(c: _Checker, orchestrator: Any, pools: dict[str, dict]) -> None:
    orchestrator = c.obj(orchestrator, "orchestrator_spec")
    if orchestrator is None:
        return
    c.unknown(orchestrator, {"slurm_spec"}, "orchestrator_spec")
    base = "orchestrator_spec.slurm_spec"
    slurm = c.obj(orchestrator.get("slurm_spec"), base)
    if slurm is None:
        return
    c.unknown(
        slurm,
        {
            "login_node_pool_id",
            "partitions",
            "prolog_bash_scripts",
            "epilog_bash_scripts",
            "config_overrides",
            "accounting",
        },
        base,
    )
    _check_accounting(c, slurm.get("accounting"), f"{base}.accounting")
    login = c.string(
        slurm.get("login_node_pool_id"),
        f"{base}.login_node_pool_id",
        pattern=ID_RE,
        hint="The id of the login node pool.",
    )
    if login and login not in pools:
        c.fail(f"{base}.login_node_pool_id", f"No node pool with id '{login}'.")
    partitions = c.array(slurm.get("partitions"), f"{base}.partitions", required=True)
    if not partitions and f"{base}.partitions" not in c.errors:
        c.fail(f"{base}.partitions", "Define at least one partition.")
    seen: set[str] = set()
    defaults = 0
    for i, part in enumerate(partitions):
        path = f"{base}.partitions[{i}]"
        part = c.obj(part, path)
        if part is None:
            continue
        c.unknown(part, {"id", "node_pool_ids", "default"}, path)
        part_id = c.string(
            part.get("id"),
            f"{path}.id",
            pattern=ID_RE,
            hint="Ids are lowercase letters, digits and -, starting with a letter.",
        )
        if part_id in seen:
            c.fail(f"{path}.id", f"Partition '{part_id}' is defined twice.")
        seen.add(part_id or "")
        ids = c.array(part.get("node_pool_ids"), f"{path}.node_pool_ids", required=True)
        if not ids and f"{path}.node_pool_ids" not in c.errors:
            c.fail(f"{path}.node_pool_ids", "Name at least one node pool.")
        for j, pool_id in enumerate(ids):
            ppath = f"{path}.node_pool_ids[{j}]"
            if not isinstance(pool_id, str):
                c.fail(ppath, "Must be a string.")
            elif pool_id not in pools:
                c.fail(ppath, f"No node pool with id '{pool_id}'.")
            elif pool_id == login:
                c.fail(ppath, "The login node pool cannot be in a partition.")
        default = part.get("default", False)
        if not isinstance(default, bool):
            c.fail(f"{path}.default", "Must be true or false.")
        elif default:
            defaults += 1
    if defaults > 1:
        c.fail(f"{base}.partitions", "At most one partition can be the default.")
    for key in ("prolog_bash_scripts", "epilog_bash_scripts"):
        for i, script in enumerate(c.array(slurm.get(key), f"{base}.{key}")):
            spath = f"{base}.{key}[{i}]"
            script = c.string(script, spath, max_len=MAX_SCRIPT_BYTES, multiline=True)
            if script and "\x00" in script:
                c.fail(spath, "May not contain NUL bytes.")
    overrides = c.obj(slurm.get("config_overrides"), f"{base}.config_overrides", required=False)
    for key, value in (overrides or {}).items():
        opath = f"{base}.config_overrides.{key}"
        if not SLURM_KEY_RE.fullmatch(str(key)):
            c.fail(opath, "Slurm parameter names are letters and digits.")
        elif key.lower() in RESERVED_SLURM_KEYS:
            c.fail(opath, "mtc manages this Slurm parameter itself.")
        elif not isinstance(value, (str, int)) or isinstance(value, bool):
            c.fail(opath, "Must be a string or an integer.")
        elif not re.fullmatch(r"[A-Za-z0-9_.,:=/+@%-]{1,200}", str(value)):
            c.fail(opath, "Value may hold letters, digits and _.,:=/+@%- only (no spaces).")


def validate_cluster_spec(data: Any) -> dict:
    """Check a whole spec; return a normalised copy or raise SpecError."""
    c = _Checker()
    spec = c.obj(data, "")
    if spec is None:
        raise SpecError({"non_field_errors": "The spec must be a JSON object."})
    c.unknown(
        spec,
        {
            "cluster_id",
            "display_name",
            "provider",
            "labels",
            "zone",
            "network",
            "node_pools",
            "storage",
            "orchestrator_spec",
        },
        "",
    )
    c.string(
        spec.get("cluster_id"),
        "cluster_id",
        pattern=ID_RE,
        hint="Ids are lowercase letters, digits and -, starting with a letter (≤31).",
    )
    c.string(spec.get("display_name"), "display_name", required=False, max_len=200)
    # A spec that names no provider gets the installation's (MTC_PROVIDER, "local" by default).
    default = settings.MTC_PROVIDER
    provider = c.string(spec.get("provider", default), "provider", choices=PROVIDERS) or default
    c.string(
        spec.get("zone"),
        "zone",
        required=provider == "gce",
        pattern=ZONE_RE,
        hint="A zone such as us-central1-a.",
    )
    _check_labels(c, spec.get("labels"), "labels")
    _check_network(c, spec.get("network"))
    _check_storage(c, spec.get("storage"), provider)

    pools: dict[str, dict] = {}
    raw_pools = c.array(spec.get("node_pools"), "node_pools", required=True)
    if not raw_pools and "node_pools" not in c.errors:
        c.fail("node_pools", "Define at least a login pool and one compute pool.")
    for i, pool in enumerate(raw_pools):
        pool_id = _check_pool(c, pool, f"node_pools[{i}]", provider)
        if pool_id in pools:
            c.fail(f"node_pools[{i}].id", f"Node pool '{pool_id}' is defined twice.")
        elif pool_id:
            pools[pool_id] = pool
    _check_slurm(c, spec.get("orchestrator_spec"), pools)
    orchestrator = spec.get("orchestrator_spec")
    slurm_spec = orchestrator.get("slurm_spec") if isinstance(orchestrator, dict) else None
    login = slurm_spec.get("login_node_pool_id") if isinstance(slurm_spec, dict) else None
    for i, pool in enumerate(raw_pools):
        if isinstance(pool, dict) and pool.get("id") == login and pool.get("spare_node_count"):
            c.fail(f"node_pools[{i}].spare_node_count", "The login pool has no spares.")
    if provider == "gce" and isinstance(spec.get("cluster_id"), str):
        for i, pool in enumerate(raw_pools):
            _check_node_name_length(c, spec["cluster_id"], pool, f"node_pools[{i}]")

    if not c.errors:
        total = sum(p["scaling_spec"]["min_node_count"] for p in pools.values())
        if total > max_nodes_for(provider):
            c.fail("node_pools", f"At most {max_nodes_for(provider)} nodes on {provider}.")
    if c.errors:
        raise SpecError(c.errors)
    return normalize(spec)


def normalize(spec: dict) -> dict:
    """Fill in defaults so the stored spec says everything explicitly."""
    spec = copy.deepcopy(spec)
    spec.setdefault("provider", settings.MTC_PROVIDER)
    spec.setdefault("display_name", spec["cluster_id"])
    spec.setdefault("labels", {})
    for pool in spec["node_pools"]:
        scaling = pool["scaling_spec"]
        scaling.setdefault("max_node_count", scaling["min_node_count"])
        pool.setdefault("provisioning_model", "STANDARD")
    slurm = spec["orchestrator_spec"]["slurm_spec"]
    slurm.setdefault("prolog_bash_scripts", [])
    slurm.setdefault("epilog_bash_scripts", [])
    slurm.setdefault("config_overrides", {})
    if not any(p.get("default") for p in slurm["partitions"]):
        slurm["partitions"][0]["default"] = True
    return spec


def validate_cluster_patch(spec: dict, data: Any) -> dict:
    """Apply a PATCH body (pool scaling, labels, display_name) to a spec; return the
    new validated spec or raise SpecError with paths into the PATCH body."""
    c = _Checker()
    body = c.obj(data, "")
    if body is None:
        raise SpecError({"non_field_errors": "The body must be a JSON object."})
    c.unknown(body, {"node_pools", "labels", "display_name"}, "")
    if not body:
        c.fail("non_field_errors", "Nothing to change: give node_pools, labels or display_name.")
    new = copy.deepcopy(spec)
    pools_by_id = {p["id"]: p for p in new["node_pools"]}
    for i, item in enumerate(c.array(body.get("node_pools"), "node_pools")):
        path = f"node_pools[{i}]"
        item = c.obj(item, path)
        if item is None:
            continue
        c.unknown(item, {"id", "scaling_spec"}, path)
        pool_id = c.string(
            item.get("id"), f"{path}.id", pattern=ID_RE, hint="The id of an existing node pool."
        )
        if pool_id and pool_id not in pools_by_id:
            c.fail(f"{path}.id", f"No node pool with id '{pool_id}'.")
            continue
        _check_scaling(c, item.get("scaling_spec"), f"{path}.scaling_spec", new["provider"])
        if pool_id and not c.errors:
            scaling = dict(item["scaling_spec"])
            scaling.setdefault("max_node_count", scaling["min_node_count"])
            pools_by_id[pool_id]["scaling_spec"] = scaling
    if "labels" in body:
        new["labels"] = _check_labels(c, body["labels"], "labels")
    if "display_name" in body:
        new["display_name"] = c.string(body["display_name"], "display_name", max_len=200)
    if c.errors:
        raise SpecError(c.errors)
    return validate_cluster_spec(new)
