"""Checking a deploy request: which version, which cluster, how many replicas. The same
checks serve the API and the deploy form; each problem is named by its field."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters.choices import CLUSTER_LIVE_STATES
from clusters.models import Cluster
from jobs import services as job_services
from mtc import userfs
from mtc.fielderrors import FieldErrors
from mtc.numbers import is_whole_number
from registry.models import Model, ModelAlias, ModelVersion, VersionState
from slurm.submit import SubmissionError

from . import conf

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ALIAS_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
FIELDS = {
    "name",
    "model",
    "version",
    "cluster",
    "partition",
    "min_replicas",
    "max_replicas",
    "cpus_per_replica",
    "gpus_per_replica",
    "target_rps_per_replica",
    "load_window_s",
    "scale_down_delay_s",
}
# Names the replica job's checks use, as the deploy request calls them.
JOB_FIELDS = {
    "partition": "partition",
    "cpus_per_task": "cpus_per_replica",
    "gpus_per_node": "gpus_per_replica",
}


class DeployError(FieldErrors):
    """``fields`` maps each bad field to a message (HTTP 400)."""


@dataclass
class DeployPlan:
    name: str
    version: ModelVersion
    version_alias: str
    cluster: Cluster
    partition: str
    min_replicas: int
    max_replicas: int
    cpus_per_replica: int
    gpus_per_replica: int
    target_rps_per_replica: float
    load_window_s: int
    scale_down_delay_s: int
    chat: bool


def _int(data: dict, key: str, errors: dict, *, default: int, low: int, high: int) -> int:
    value = data.get(key, default)
    if value is None or value == "":
        return default
    if isinstance(value, str) and is_whole_number(value.strip()):
        value = int(value)  # the form posts strings
    if isinstance(value, bool) or not isinstance(value, int):
        errors[key] = "Must be an integer."
        return default
    if not low <= value <= high:
        errors[key] = f"Must be between {low} and {high}."
    return value


def _float(data: dict, key: str, errors: dict, *, default: float, high: float) -> float:
    value = data.get(key, default)
    if value is None or value == "":
        return default
    try:
        value = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        value = None
    if value is None or not 0 < value <= high:
        errors[key] = f"Must be a number above 0, at most {high:g}."
        return default
    return value


def has_chat_template(export_path: str) -> bool:
    """Whether the saved tokenizer carries a chat template (files save_pretrained writes)."""
    root = Path(export_path)
    if userfs.is_file(root / "chat_template.jinja") or userfs.is_file(root / "chat_template.json"):
        return True
    try:
        config = json.loads(userfs.read_bytes(root / "tokenizer_config.json", limit=64 * 2**20))
        return isinstance(config, dict) and bool(config.get("chat_template"))
    except (OSError, ValueError):
        return False


def version_resolve(model_name: Any, ref: Any, errors: dict) -> tuple[ModelVersion | None, str]:
    """``{"model": name, "version": number or alias}`` -> (a READY version, the alias)."""
    if not isinstance(model_name, str) or not model_name:
        errors["model"] = "This field is required (a model name)."
        return None, ""
    model = Model.objects.filter(name=model_name).first()
    if model is None:
        errors["model"] = f"No model '{model_name}'."
        return None, ""
    if isinstance(ref, str) and is_whole_number(ref.strip()):
        ref = int(ref)
    alias = ""
    if isinstance(ref, int) and not isinstance(ref, bool):
        version = ModelVersion.objects.filter(model=model, number=ref).first()
        missing = f"Model '{model.name}' has no version {ref}."
    elif isinstance(ref, str) and ALIAS_RE.fullmatch(ref):
        alias = ref
        found = ModelAlias.objects.filter(model=model, alias=ref).select_related("version").first()
        version = found.version if found else None
        missing = f"Model '{model.name}' has no alias '{ref}'."
    else:
        errors["version"] = "A version number (1, 2, ...) or an alias is required."
        return None, ""
    if version is None:
        errors["version"] = missing
        return None, alias
    if version.state != VersionState.READY:
        errors["version"] = f"{version} is {version.state}; only READY versions can be served."
    elif not version.export_path or not userfs.is_file(Path(version.export_path) / "config.json"):
        errors["version"] = f"{version} has no exported model at '{version.export_path}'."
    return version, alias


def endpoint_validate(data: Any) -> DeployPlan:
    """Check a deploy request; raises DeployError naming each bad field."""
    if not isinstance(data, dict):
        raise DeployError({"non_field_errors": "The body must be a JSON object."})
    errors: dict[str, str] = {str(k): "Unknown field." for k in data if k not in FIELDS}
    version, alias = version_resolve(data.get("model"), data.get("version"), errors)

    cluster = None
    cluster_id = data.get("cluster")
    if not isinstance(cluster_id, str) or not cluster_id:
        errors["cluster"] = "This field is required (a cluster id)."
    else:
        cluster = Cluster.objects.filter(cluster_id=cluster_id).first()
        if cluster is None:
            errors["cluster"] = f"No cluster '{cluster_id}'."
        elif cluster.state not in CLUSTER_LIVE_STATES:
            errors["cluster"] = f"Cluster '{cluster_id}' is {cluster.state}; it must be RUNNING."

    name = data.get("name") or ""
    if name and (not isinstance(name, str) or not NAME_RE.fullmatch(name)):
        errors["name"] = "Lower-case letters, digits, '.', '_' and '-' (up to 63)."
    limit = conf.max_replicas_limit()
    low = _int(data, "min_replicas", errors, default=1, low=1, high=limit)
    high = _int(data, "max_replicas", errors, default=low, low=1, high=limit)
    if "min_replicas" not in errors and "max_replicas" not in errors and high < low:
        errors["max_replicas"] = f"Must be at least min_replicas ({low})."
    cpus = _int(data, "cpus_per_replica", errors, default=1, low=1, high=256)
    gpus = _int(data, "gpus_per_replica", errors, default=0, low=0, high=16)
    capacity = _float(data, "target_rps_per_replica", errors, default=4.0, high=100_000)
    window = _int(data, "load_window_s", errors, default=30, low=1, high=3600)
    delay = _int(data, "scale_down_delay_s", errors, default=60, low=0, high=86_400)
    partition = data.get("partition") or ""
    if not isinstance(partition, str):
        errors["partition"] = "Must be a partition name."
        partition = ""

    if cluster is not None and "cluster" not in errors:
        # The replica job must be one the cluster can run: the jobs API's own checks.
        job = {"name": "replica", "script": "#!/bin/bash\n", "nodes": 1}
        job.update(cpus_per_task=cpus, gpus_per_node=gpus)
        if partition:
            job["partition"] = partition
        try:
            job_services.job_validate(cluster=cluster, data=job)
        except SubmissionError as exc:
            for key, message in exc.fields.items():
                errors.setdefault(JOB_FIELDS.get(key, key), message)
    if errors:
        raise DeployError(errors)
    return DeployPlan(
        name=name or f"{version.model.name}-{version.number}",
        version=version,
        version_alias=alias,
        cluster=cluster,
        partition=partition,
        min_replicas=low,
        max_replicas=high,
        cpus_per_replica=cpus,
        gpus_per_replica=gpus,
        target_rps_per_replica=capacity,
        load_window_s=window,
        scale_down_delay_s=delay,
        chat=has_chat_template(version.export_path),
    )
