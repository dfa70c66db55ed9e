"""Forms of the cluster pages: the JSON spec editors, the delete confirmation, and what
the create wizard's steps (clusters.wizard_forms) share: ids, key=value lists, partitions.
The forms check what a user can fix; the assembled spec then goes through the one
validator (clusters.spec) like the API's."""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.core.validators import RegexValidator

from .models import Cluster
from .spec import (
    ID_RE,
    LABEL_KEY_RE,
    LABEL_VALUE_RE,
    RESERVED_SLURM_KEYS,
    SLURM_KEY_RE,
)

MAX_SPEC_BYTES = 512 * 1024
ID_HELP = "Lowercase letters, digits and -, starting with a letter (at most 31)."
SLURM_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:=/+@%-]{1,200}$")
LUSTRE_FS_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
SHARE_RE = re.compile(r"^[A-Za-z0-9_-]+$")

ACCELERATOR_SUGGESTIONS = (
    "NVIDIA_H200_141GB",
    "NVIDIA_B200",
    "NVIDIA_H100_MEGA_80GB",
    "NVIDIA_H100_80GB",
    "NVIDIA_A100_80GB",
    "NVIDIA_L4",
)
MACHINE_SUGGESTIONS = (
    "local-2",
    "local-4",
    "a3-ultragpu-8g",
    "a4-highgpu-8g",
    "a3-megagpu-8g",
    "a3-highgpu-8g",
    "n2-standard-8",
)

id_validator = RegexValidator(ID_RE, ID_HELP)


def _id_field(label: str, **kwargs) -> forms.CharField:
    return forms.CharField(
        label=label, max_length=31, validators=[id_validator], help_text=ID_HELP, **kwargs
    )


def parse_key_values(
    text: str,
    *,
    key_re: re.Pattern,
    value_re: re.Pattern,
    key_hint: str,
    value_hint: str,
    reserved: set[str] | None = None,
) -> dict[str, str]:
    """``key=value`` lines (blank lines and # comments skipped) to a dict; every
    bad line is reported with its number."""
    out: dict[str, str] = {}
    problems: list[str] = []
    for number, raw in enumerate((text or "").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            problems.append(f"Line {number}: write key=value.")
            continue
        key, value = (part.strip() for part in line.split("=", 1))
        if not key_re.fullmatch(key):
            problems.append(f"Line {number}: '{key}' is not a valid key ({key_hint}).")
        elif reserved and key.lower() in reserved:
            problems.append(f"Line {number}: mtc manages '{key}' itself.")
        elif not value_re.fullmatch(value):
            problems.append(f"Line {number}: '{value}' is not a valid value ({value_hint}).")
        elif key in out:
            problems.append(f"Line {number}: '{key}' is given twice.")
        else:
            out[key] = value
    if problems:
        raise forms.ValidationError(problems)
    return out


def parse_labels(text: str) -> dict[str, str]:
    return parse_key_values(
        text,
        key_re=LABEL_KEY_RE,
        value_re=LABEL_VALUE_RE,
        key_hint="lowercase letters, digits, _ and -, starting with a letter",
        value_hint="lowercase letters, digits, _ and -, at most 63",
    )


def parse_overrides(text: str) -> dict[str, str]:
    return parse_key_values(
        text,
        key_re=SLURM_KEY_RE,
        value_re=SLURM_VALUE_RE,
        key_hint="a Slurm parameter name such as SlurmdTimeout",
        value_hint="letters, digits and _.,:=/+@%- without spaces",
        reserved=RESERVED_SLURM_KEYS,
    )


def parse_partitions(text: str) -> list[dict]:
    """``name = pool, pool`` lines; a ``*`` after the name marks the default
    partition, otherwise the first line is the default."""
    partitions: list[dict] = []
    problems: list[str] = []
    for number, raw in enumerate((text or "").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            problems.append(f"Line {number}: write partition = pool[, pool...].")
            continue
        name, pools = (part.strip() for part in line.split("=", 1))
        default = name.endswith("*")
        name = name.rstrip("*").strip()
        pool_ids = [p.strip() for p in pools.split(",") if p.strip()]
        if not ID_RE.fullmatch(name):
            problems.append(f"Line {number}: '{name}' is not a valid partition id ({ID_HELP}).")
            continue
        if not pool_ids:
            problems.append(f"Line {number}: name at least one node pool.")
            continue
        partitions.append({"id": name, "node_pool_ids": pool_ids, "default": default})
    if problems:
        raise forms.ValidationError(problems)
    if partitions and not any(p["default"] for p in partitions):
        partitions[0]["default"] = True
    return partitions


def suggest_cluster_id(base: str = "demo") -> str:
    taken = set(
        Cluster.objects.filter(cluster_id__startswith=base).values_list("cluster_id", flat=True)
    )
    if base not in taken:
        return base
    for n in range(2, 1000):
        if f"{base}-{n}" not in taken:
            return f"{base}-{n}"
    return base


# --- JSON editors ------------------------------------------------------------
def _load_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(
            f"Invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        ) from exc


class SpecUploadForm(forms.Form):
    spec_file = forms.FileField(
        label="Spec file",
        required=False,
        help_text="A .json file with the cluster spec. It wins over the text below.",
        widget=forms.ClearableFileInput(attrs={"accept": ".json,application/json"}),
    )
    spec_text = forms.CharField(
        label="Spec JSON",
        required=False,
        widget=forms.Textarea(attrs={"rows": 22, "class": "mono", "spellcheck": "false"}),
    )

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        upload = data.get("spec_file")
        if upload:
            if upload.size > MAX_SPEC_BYTES:
                self.add_error("spec_file", f"At most {MAX_SPEC_BYTES // 1024} KiB.")
                return data
            try:
                text = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                self.add_error("spec_file", "The file is not UTF-8 text.")
                return data
            field = "spec_file"
        else:
            text, field = data.get("spec_text", ""), "spec_text"
        if not text.strip():
            self.add_error("spec_text", "Paste a spec or choose a file.")
            return data
        if len(text.encode()) > MAX_SPEC_BYTES:
            self.add_error(field, f"At most {MAX_SPEC_BYTES // 1024} KiB.")
            return data
        try:
            spec = _load_json(text)
        except forms.ValidationError as exc:
            self.add_error(field, exc)
            return data
        if not isinstance(spec, dict):
            self.add_error(field, "The spec must be a JSON object.")
            return data
        data["spec"] = spec
        return data


class ReferenceSpecForm(forms.Form):
    cluster_id = _id_field("Cluster id")
    spec_text = forms.CharField(
        label="Spec JSON",
        max_length=MAX_SPEC_BYTES,
        widget=forms.Textarea(attrs={"rows": 28, "class": "mono", "spellcheck": "false"}),
    )

    def clean(self):
        data = super().clean()
        if "spec_text" not in data:
            return data
        try:
            spec = _load_json(data["spec_text"])
        except forms.ValidationError as exc:
            self.add_error("spec_text", exc)
            return data
        if not isinstance(spec, dict):
            self.add_error("spec_text", "The spec must be a JSON object.")
            return data
        if data.get("cluster_id"):
            spec["cluster_id"] = data["cluster_id"]
        data["spec"] = spec
        return data


class DeleteConfirmForm(forms.Form):
    confirm = forms.CharField(label="Type the cluster id to confirm", max_length=31)

    def __init__(self, *args, cluster_id: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.cluster_id = cluster_id
        self.fields["confirm"].widget.attrs.update(
            {"autocomplete": "off", "placeholder": cluster_id, "autofocus": True}
        )

    def clean_confirm(self) -> str:
        value = self.cleaned_data["confirm"].strip()
        if value != self.cluster_id:
            raise forms.ValidationError(
                f"Type '{self.cluster_id}' exactly to confirm the deletion."
            )
        return value
