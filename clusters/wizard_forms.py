"""The create wizard's steps (basics, node pools, network, storage, Slurm) and the spec
they build (build_spec). Each form checks what a user can fix on its step; the assembled
spec then goes through the one validator (clusters.spec) like the API's.

Past 400 lines on purpose: the five step forms and build_spec read together, field by
field, as the one place where a form field becomes a spec field."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.core.validators import RegexValidator

from .forms import (
    LUSTRE_FS_RE,
    SHARE_RE,
    _id_field,
    parse_labels,
    parse_overrides,
    parse_partitions,
)
from .models import Cluster
from .spec import (
    ACCELERATOR_RE,
    BUCKET_RE,
    ID_RE,
    IPV4_RE,
    LUSTRE_TIERS,
    MACHINE_TYPE_RE,
    MAX_ACCELERATORS,
    MAX_SCRIPT_BYTES,
    MOUNT_RE,
    PROVISIONING_MODELS,
    ZONE_RE,
    max_nodes_for,
)


class BasicsForm(forms.Form):
    cluster_id = _id_field("Cluster id")
    display_name = forms.CharField(label="Display name", max_length=200, required=False)
    provider = forms.ChoiceField(
        choices=[
            ("local", "local: real Slurm daemons on this machine"),
            ("gce", "gce: Google Compute Engine"),
        ],
        initial="local",
    )
    zone = forms.CharField(
        max_length=63,
        required=False,
        help_text="Required on gce, for example us-central1-a.",
    )
    labels = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "team=llm\nenv=dev"}),
        required=False,
        help_text="One key=value per line.",
    )

    def clean_cluster_id(self) -> str:
        cluster_id = self.cleaned_data["cluster_id"]
        if Cluster.objects.filter(cluster_id=cluster_id).exists():
            raise forms.ValidationError(f"A cluster with id '{cluster_id}' already exists.")
        return cluster_id

    def clean_zone(self) -> str:
        zone = self.cleaned_data["zone"].strip()
        if zone and not ZONE_RE.fullmatch(zone):
            raise forms.ValidationError("A zone such as us-central1-a.")
        return zone

    def clean_labels(self) -> str:
        text = self.cleaned_data["labels"]
        parse_labels(text)
        return text.strip()

    def clean(self):
        data = super().clean()
        if data.get("provider") == "gce" and not data.get("zone") and "zone" not in self.errors:
            self.add_error("zone", "A zone is required on the gce provider.")
        return data


class LoginPoolForm(forms.Form):
    login_pool_id = _id_field("Login pool id", initial="login")
    login_machine_type = forms.CharField(
        label="Login machine type",
        max_length=63,
        initial="local-2",
        validators=[RegexValidator(MACHINE_TYPE_RE, "A machine type such as n2-standard-8.")],
    )


class ComputePoolForm(forms.Form):
    pool_id = _id_field("Pool id", initial="gpu")
    machine_type = forms.CharField(
        label="Machine type",
        max_length=63,
        initial="local-2",
        validators=[
            RegexValidator(MACHINE_TYPE_RE, "A machine type such as a3-ultragpu-8g or local-2.")
        ],
        widget=forms.TextInput(attrs={"list": "machine-types"}),
    )
    accelerator_type = forms.CharField(
        label="Accelerator type",
        max_length=63,
        required=False,
        initial="NVIDIA_H200_141GB",
        validators=[RegexValidator(ACCELERATOR_RE, "An accelerator type such as NVIDIA_B200.")],
        widget=forms.TextInput(attrs={"list": "accelerator-types"}),
    )
    accelerator_count = forms.IntegerField(
        label="GPUs per node", min_value=0, max_value=MAX_ACCELERATORS, initial=8
    )
    node_count = forms.IntegerField(label="Nodes", min_value=0, initial=2)
    provisioning_model = forms.ChoiceField(
        label="Provisioning",
        choices=[(m, m) for m in PROVISIONING_MODELS],
        initial="STANDARD",
    )
    reservation = forms.CharField(
        label="Reservation",
        max_length=63,
        required=False,
        validators=[RegexValidator(ID_RE, "A reservation name (lowercase letters, digits, -).")],
        help_text="Optional: a specific reservation to consume.",
    )

    def clean(self):
        data = super().clean()
        accel, count = data.get("accelerator_type"), data.get("accelerator_count")
        if accel and not count and "accelerator_count" not in self.errors:
            self.add_error("accelerator_count", "At least 1 when an accelerator type is set.")
        if count and not accel and "accelerator_type" not in self.errors:
            self.add_error("accelerator_type", "Required when GPUs per node is above 0.")
        if data.get("provisioning_model") == "RESERVATION" and not data.get("reservation"):
            if "reservation" not in self.errors:
                self.add_error("reservation", "Name the reservation to provision from.")
        return data


class BaseComputePoolFormSet(forms.BaseFormSet):
    def _construct_form(self, i, **kwargs):
        # Every pool shown is a pool asked for: an added pool left at its defaults
        # is still a pool (Django would otherwise skip unchanged extra forms).
        form = super()._construct_form(i, **kwargs)
        form.empty_permitted = False
        return form

    def clean(self):
        if any(self.errors):
            return
        seen: set[str] = set()
        for form in self.forms:
            if self.can_delete and self._should_delete_form(form):
                continue
            pool_id = form.cleaned_data.get("pool_id")
            if pool_id in seen:
                form.add_error("pool_id", f"Pool '{pool_id}' is defined twice.")
            seen.add(pool_id)


ComputePoolFormSet = forms.formset_factory(
    ComputePoolForm,
    formset=BaseComputePoolFormSet,
    extra=0,
    min_num=1,
    validate_min=True,
    max_num=16,
    validate_max=True,
    can_delete=True,
)


def check_pools(login: LoginPoolForm, pools: forms.BaseFormSet, provider: str) -> bool:
    """Checks across the login form and the compute pools; errors land on the fields."""
    ok = login.is_valid() & pools.is_valid()
    if not ok:
        return False
    login_id = login.cleaned_data["login_pool_id"]
    if provider == "gce" and login.cleaned_data["login_machine_type"].startswith("local-"):
        login.add_error("login_machine_type", "local-N machine types exist only on local.")
    total = 0
    for form in pools.forms:
        if pools._should_delete_form(form):
            continue
        data = form.cleaned_data
        if data["pool_id"] == login_id:
            form.add_error("pool_id", "The login pool already uses this id.")
        if provider == "gce" and data["machine_type"].startswith("local-"):
            form.add_error("machine_type", "local-N machine types exist only on local.")
        total += data["node_count"]
    limit = max_nodes_for(provider)
    if total > limit:
        pools._non_form_errors = pools.error_class(
            [f"At most {limit} nodes in all on the {provider} provider (asked for {total})."],
            renderer=pools.renderer,
        )
    return (
        not login.errors
        and not any(f.errors for f in pools.forms)
        and not (pools.non_form_errors())
    )


def pools_data(login: LoginPoolForm, pools: forms.BaseFormSet) -> dict:
    compute = [
        {k: v for k, v in form.cleaned_data.items() if k != "DELETE"}
        for form in pools.forms
        if not pools._should_delete_form(form)
    ]
    return {**login.cleaned_data, "compute": compute}


class NetworkForm(forms.Form):
    network = forms.CharField(
        max_length=31,
        required=False,
        validators=[RegexValidator(ID_RE, "A VPC network name.")],
        help_text="An existing VPC network (gce). Leave empty on local.",
    )
    subnetwork = forms.CharField(
        max_length=31,
        required=False,
        validators=[RegexValidator(ID_RE, "A subnetwork name.")],
    )
    mtu = forms.IntegerField(
        label="MTU",
        min_value=1300,
        max_value=8896,
        required=False,
        help_text="8896 for RDMA-capable GPU networks.",
    )


def _regex(pattern: re.Pattern, message: str) -> RegexValidator:
    return RegexValidator(pattern, message)


class StorageForm(forms.Form):
    home_type = forms.ChoiceField(
        label="/home type", choices=[("filestore", "Filestore"), ("nfs", "NFS")], required=False
    )
    home_ip = forms.CharField(
        label="/home server IP",
        required=False,
        help_text="Empty for Filestore: mtc makes the instance.",
        max_length=15,
        validators=[_regex(IPV4_RE, "An IPv4 address.")],
    )
    home_share = forms.CharField(
        label="/home share",
        required=False,
        max_length=100,
        validators=[_regex(SHARE_RE, "A share name.")],
    )
    lustre_ip = forms.CharField(
        label="Lustre IP",
        required=False,
        help_text="Empty: mtc makes the instance (give tier and capacity).",
        max_length=15,
        validators=[_regex(IPV4_RE, "An IPv4 address.")],
    )
    lustre_filesystem = forms.CharField(
        label="Lustre file system",
        required=False,
        max_length=8,
        validators=[_regex(LUSTRE_FS_RE, "At most 8 lowercase letters and digits.")],
    )
    lustre_mount_point = forms.CharField(
        label="Lustre mount point",
        required=False,
        max_length=255,
        initial="/mnt/lustre",
        validators=[_regex(MOUNT_RE, "An absolute path such as /mnt/lustre.")],
    )
    lustre_tier = forms.TypedChoiceField(
        label="Lustre tier (MBps per TiB)",
        choices=[("", "—")] + [(t, str(t)) for t in LUSTRE_TIERS],
        coerce=int,
        empty_value=None,
        required=False,
    )
    lustre_capacity_gib = forms.IntegerField(
        label="Lustre capacity (GiB)", min_value=9000, max_value=8_000_000, required=False
    )
    gcs_bucket = forms.CharField(
        label="Cloud Storage bucket",
        required=False,
        max_length=63,
        validators=[_regex(BUCKET_RE, "A Cloud Storage bucket name.")],
    )
    gcs_mount_point = forms.CharField(
        label="Bucket mount point",
        required=False,
        max_length=255,
        validators=[_regex(MOUNT_RE, "An absolute path such as /gcs/my-bucket.")],
        help_text="Defaults to /gcs/<bucket>.",
    )

    def clean(self):
        data = super().clean()

        def given(name: str) -> bool:  # typed in, valid or not
            return bool(data.get(name)) or name in self.errors

        def need(name: str, message: str) -> None:
            if not given(name):
                self.add_error(name, message)

        if given("home_ip") or given("home_share"):
            data["home_type"] = data.get("home_type") or "filestore"
            # Filestore without an IP: mtc makes the instance; an NFS server needs its IP.
            if data["home_type"] == "nfs":
                need("home_ip", "Give both the server IP and the share for /home.")
            need("home_share", "Give both the server IP and the share for /home.")
        lustre_set = any(
            given(n)
            for n in ("lustre_ip", "lustre_filesystem", "lustre_tier", "lustre_capacity_gib")
        )
        if lustre_set:
            for name in ("lustre_filesystem", "lustre_mount_point"):
                need(name, "Required for a Lustre mount.")
            if not given("lustre_ip"):  # mtc makes the instance: it needs size and tier
                for name in ("lustre_tier", "lustre_capacity_gib"):
                    need(name, "Required for a Lustre mount. (No IP: mtc makes it.)")
        if given("gcs_mount_point"):
            need("gcs_bucket", "Name the bucket to mount.")
        if data.get("gcs_bucket") and not given("gcs_mount_point"):
            data["gcs_mount_point"] = f"/gcs/{data['gcs_bucket']}"
        mounts = {"/home": "home"} if given("home_ip") or given("home_share") else {}
        for name, used in (("lustre_mount_point", lustre_set), ("gcs_mount_point", True)):
            point = data.get(name)
            if not point or not used:
                continue
            if ".." in point.split("/"):
                self.add_error(name, "May not contain '..'.")
            elif point in mounts:
                self.add_error(name, f"{point} is already used by another mount.")
            mounts[point] = name
        return data


class SlurmForm(forms.Form):
    partitions = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}),
        help_text=(
            "One partition per line: name = pool, pool. The first line is the default "
            "partition (or mark one with *, as in gpu* = gpu)."
        ),
    )
    config_overrides = forms.CharField(
        label="slurm.conf overrides",
        widget=forms.Textarea(
            attrs={"rows": 3, "class": "mono", "placeholder": "SlurmdTimeout=30"}
        ),
        required=False,
        help_text="One Parameter=value per line.",
    )
    prolog = forms.CharField(
        label="Prolog script",
        widget=forms.Textarea(
            attrs={"rows": 4, "class": "mono", "placeholder": "#!/bin/bash\n# runs before each job"}
        ),
        required=False,
        strip=False,
        max_length=MAX_SCRIPT_BYTES,
    )
    epilog = forms.CharField(
        label="Epilog script",
        widget=forms.Textarea(
            attrs={"rows": 4, "class": "mono", "placeholder": "#!/bin/bash\n# runs after each job"}
        ),
        required=False,
        strip=False,
        max_length=MAX_SCRIPT_BYTES,
    )

    def __init__(self, *args, pool_ids: list[str], login_pool_id: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool_ids = pool_ids
        self.login_pool_id = login_pool_id

    def clean_partitions(self) -> str:
        text = self.cleaned_data["partitions"]
        partitions = parse_partitions(text)
        if not partitions:
            raise forms.ValidationError("Define at least one partition.")
        problems, seen = [], set()
        for part in partitions:
            if part["id"] in seen:
                problems.append(f"Partition '{part['id']}' is defined twice.")
            seen.add(part["id"])
            for pool_id in part["node_pool_ids"]:
                if pool_id == self.login_pool_id:
                    problems.append(f"'{pool_id}' is the login pool; it cannot be in a partition.")
                elif pool_id not in self.pool_ids:
                    problems.append(
                        f"Partition '{part['id']}': no compute pool '{pool_id}' "
                        f"(pools: {', '.join(self.pool_ids)})."
                    )
        if sum(1 for p in partitions if p["default"]) > 1:
            problems.append("Mark at most one partition as the default.")
        if problems:
            raise forms.ValidationError(problems)
        return text.strip()

    def clean_config_overrides(self) -> str:
        text = self.cleaned_data["config_overrides"]
        parse_overrides(text)
        return text.strip()

    def _script(self, name: str) -> str:
        text = self.cleaned_data[name].replace("\r\n", "\n")
        if "\x00" in text:
            raise forms.ValidationError("May not contain NUL bytes.")
        return text if text.strip() else ""

    def clean_prolog(self) -> str:
        return self._script("prolog")

    def clean_epilog(self) -> str:
        return self._script("epilog")


def default_partitions(pool_ids: list[str]) -> str:
    return "\n".join(f"{pool_id} = {pool_id}" for pool_id in pool_ids)


# --- from wizard data to a spec ---------------------------------------------
def build_spec(data: dict[str, Any]) -> dict:
    """Assemble the cluster spec from the wizard's stored steps (each already checked)."""
    basics, pools = data["basics"], data["pools"]
    network, storage, slurm = data.get("network", {}), data.get("storage", {}), data["slurm"]
    spec: dict[str, Any] = {"cluster_id": basics["cluster_id"]}
    if basics.get("display_name"):
        spec["display_name"] = basics["display_name"]
    spec["provider"] = basics["provider"]
    if basics.get("zone"):
        spec["zone"] = basics["zone"]
    spec["labels"] = parse_labels(basics.get("labels", ""))

    net = {k: network[k] for k in ("network", "subnetwork", "mtu") if network.get(k)}
    if net:
        spec["network"] = net

    node_pools = [
        {
            "id": pools["login_pool_id"],
            "machine_spec": {"machine_type": pools["login_machine_type"]},
            "scaling_spec": {"min_node_count": 1, "max_node_count": 1},
        }
    ]
    for pool in pools["compute"]:
        machine: dict[str, Any] = {"machine_type": pool["machine_type"]}
        if pool.get("accelerator_type") and pool.get("accelerator_count"):
            machine["accelerator_type"] = pool["accelerator_type"]
            machine["accelerator_count"] = pool["accelerator_count"]
        if pool.get("reservation"):
            machine["reservation_affinity"] = {
                "reservation_affinity_type": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name",
                "values": [pool["reservation"]],
            }
        count = pool["node_count"]
        node_pools.append(
            {
                "id": pool["pool_id"],
                "machine_spec": machine,
                "provisioning_model": pool["provisioning_model"],
                "scaling_spec": {"min_node_count": count, "max_node_count": count},
            }
        )
    spec["node_pools"] = node_pools

    store: dict[str, Any] = {}
    if storage.get("home_share"):  # no IP: mtc makes the Filestore instance
        store["home"] = {
            "type": storage.get("home_type") or "filestore",
            "share": storage["home_share"],
        }
        if storage.get("home_ip"):
            store["home"]["ip"] = storage["home_ip"]
    if storage.get("lustre_filesystem"):  # no IP: mtc makes the Lustre instance
        lustre = {
            "filesystem": storage["lustre_filesystem"],
            "mount_point": storage["lustre_mount_point"],
        }
        if storage.get("lustre_ip"):
            lustre = {"ip": storage["lustre_ip"], **lustre}
        if storage.get("lustre_tier"):
            lustre["performance_tier_mbps_per_tib"] = storage["lustre_tier"]
        if storage.get("lustre_capacity_gib"):
            lustre["capacity_gib"] = storage["lustre_capacity_gib"]
        store["lustre"] = [lustre]
    if storage.get("gcs_bucket"):
        store["gcs_fuse"] = [
            {"bucket": storage["gcs_bucket"], "mount_point": storage["gcs_mount_point"]}
        ]
    if store:
        spec["storage"] = store

    spec["orchestrator_spec"] = {
        "slurm_spec": {
            "login_node_pool_id": pools["login_pool_id"],
            "partitions": parse_partitions(slurm["partitions"]),
            "prolog_bash_scripts": [slurm["prolog"]] if slurm.get("prolog") else [],
            "epilog_bash_scripts": [slurm["epilog"]] if slurm.get("epilog") else [],
            "config_overrides": parse_overrides(slurm.get("config_overrides", "")),
        }
    }
    return spec
