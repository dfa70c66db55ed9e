"""`mtc gce image build`: the node image (image.py's contract) made on a builder VM.

The builder boots a base image, unpacks mtc's node/ and deploy/image from its own
metadata, runs deploy/image/provision.sh, with ``gpu_stack`` deploy/image/gpu-stack.sh
(NVIDIA driver, DCGM, the Ops Agent, gcsfuse), then an operator's extras script, and
reports ``mtc/image`` as ``done`` or ``failed: <why>``. mtc then stops it, makes an
image of its boot disk in the family nodes boot from, and deletes the builder whatever
happened.
"""

from __future__ import annotations

import base64
import io
import tarfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from ..base import ProviderError
from . import image, names
from .api import ApiRequest, Target
from .client import ComputeApi

REPO = Path(__file__).resolve().parents[3]
BUILDER_PREFIX = "mtc-image-builder"
# Debian 12: its Slurm is 22.05, the series mtc's clients speak (image.SLURM_SERIES).
DEFAULT_BASE = "projects/debian-cloud/global/images/family/debian-12"
DEFAULT_MACHINE_TYPE = "e2-standard-8"  # no GPU needed to build
BOOT_DISK_GB = 50
# Compute Engine's limit on one metadata value.
METADATA_VALUE_LIMIT = 256 * 1024
BUILD_TIMEOUT_S = 45 * 60

BUILDER_SCRIPT = r"""#!/bin/bash
# mtc image builder: provisions this VM once and reports mtc/image; mtc stops it, makes
# the image of its disk and deletes it.
set -uo pipefail
MD=http://metadata.google.internal/computeMetadata/v1/instance
report() {
  curl -sf -X PUT --data "$1" -H Metadata-Flavor:Google "$MD/guest-attributes/mtc/image" || true
}
fail() { echo "mtc-image: $1" >&2; report "failed: ${1:0:200}"; exit 1; }
mkdir -p /opt/mtc-src
curl -sf -H Metadata-Flavor:Google "$MD/attributes/mtc-source" | base64 -d \
  | tar -xz -C /opt/mtc-src || fail "could not unpack mtc's source from metadata"
MTC_SOURCE=/opt/mtc-src bash /opt/mtc-src/deploy/image/provision.sh \
  || fail "provision.sh failed (the serial console has its log)"
if [ "$(curl -sf -H Metadata-Flavor:Google "$MD/attributes/mtc-gpu-stack")" = TRUE ]; then
  bash /opt/mtc-src/deploy/image/gpu-stack.sh \
    || fail "gpu-stack.sh failed (the serial console has its log)"
fi
if curl -sf -H Metadata-Flavor:Google "$MD/attributes/mtc-extras" >/tmp/mtc-extras.sh; then
  bash /tmp/mtc-extras.sh || fail "the extras script failed (the serial console has its log)"
fi
rm -rf /opt/mtc-src /tmp/mtc-extras.sh
sync
report done
"""


def source_archive(repo: Path = REPO) -> bytes:
    """node/ and deploy/image as a .tar.gz (no bytecode): what provision.sh copies."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for part in ("node", "deploy/image"):
            tar.add(
                repo / part,
                arcname=part,
                filter=lambda info: None if "__pycache__" in info.name else info,
            )
    return buffer.getvalue()


def image_name(stamp: str) -> str:
    return names.resource_name(image.IMAGE_FAMILY, stamp)


def builder_request(
    target: Target,
    name: str,
    *,
    base_image: str,
    machine_type: str,
    source: bytes,
    extras: str = "",
    gpu_stack: bool = False,
    external_ip: bool = False,
) -> ApiRequest:
    encoded = base64.b64encode(source).decode()
    if len(encoded) > METADATA_VALUE_LIMIT:
        raise ProviderError(
            f"mtc's node/ and deploy/image are {len(encoded)} bytes in base64, over the "
            f"{METADATA_VALUE_LIMIT}-byte metadata value limit",
            code="GCE_IMAGE_SOURCE_TOO_LARGE",
            permanent=True,
        )
    metadata = [
        {"key": "startup-script", "value": BUILDER_SCRIPT},
        {"key": "enable-guest-attributes", "value": "TRUE"},
        {"key": "mtc-role", "value": "image-builder"},
        {"key": "mtc-source", "value": encoded},
    ]
    if gpu_stack:  # deploy/image/gpu-stack.sh: driver, DCGM, Ops Agent, gcsfuse
        metadata.append({"key": "mtc-gpu-stack", "value": "TRUE"})
    if extras:
        metadata.append({"key": "mtc-extras", "value": extras})
    subnetwork = target.subnetwork or target.network
    nic: dict = {
        "network": f"projects/{target.project}/global/networks/{target.network}",
        "subnetwork": f"projects/{target.project}/regions/{target.region}/subnetworks/{subnetwork}",
    }
    if external_ip:  # apt and pip need the internet: Cloud NAT, or this
        nic["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
    return ApiRequest(
        "instances",
        "insert",
        "zone",
        name,
        {
            "name": name,
            "machineType": f"zones/{target.zone}/machineTypes/{machine_type}",
            "disks": [
                {
                    "boot": True,
                    "autoDelete": True,
                    "initializeParams": {
                        "sourceImage": base_image,
                        "diskSizeGb": str(BOOT_DISK_GB),
                    },
                }
            ],
            "networkInterfaces": [nic],
            "metadata": {"items": metadata},
            "labels": {"mtc-role": "image-builder"},
        },
    )


def image_request(target: Target, name: str, builder: str, *, base_image: str) -> ApiRequest:
    return ApiRequest(
        "images",
        "insert",
        "global",
        name,
        {
            "name": name,
            "family": image.IMAGE_FAMILY,
            "sourceDisk": f"projects/{target.project}/zones/{target.zone}/disks/{builder}",
            # A3 Ultra, A3 Mega and A4 nodes boot only from images that declare gVNIC.
            "guestOsFeatures": [{"type": "GVNIC"}, {"type": "UEFI_COMPATIBLE"}],
            "labels": {"mtc-image": "node", "mtc-slurm": image.SLURM_SERIES.replace(".", "-")},
            "description": f"mtc node image: Slurm {image.SLURM_SERIES}, from {base_image}",
        },
    )


def image_build(
    target: Target,
    *,
    base_image: str = DEFAULT_BASE,
    machine_type: str = DEFAULT_MACHINE_TYPE,
    extras: str = "",
    gpu_stack: bool = False,
    external_ip: bool = False,
    keep_builder: bool = False,
    timeout_s: float = BUILD_TIMEOUT_S,
    say: Callable[[str], None] = print,
) -> str:
    """Build one image in the family and return its name; the builder goes in any case
    (``keep_builder``: stays after a failure, for a person to look at)."""
    api = ComputeApi(target)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    builder = names.resource_name(BUILDER_PREFIX, stamp)
    request = builder_request(
        target,
        builder,
        base_image=base_image,
        machine_type=machine_type,
        source=source_archive(),
        extras=extras,
        gpu_stack=gpu_stack,
        external_ip=external_ip,
    )
    say(f"builder {builder} ({machine_type}, from {base_image}) in {target.zone}")
    api.send(request)
    failed = True
    try:
        state = _await_builder(api, builder, timeout_s, say)
        if state != "done":
            raise ProviderError(f"the image build on {builder} {state}", code="GCE_IMAGE_FAILED")
        say("provisioned; stopping the builder")
        api.send(ApiRequest("instances", "stop", "zone", builder))
        name = image_name(stamp)
        say(f"making image {name} in family {image.IMAGE_FAMILY}")
        api.send(
            image_request(target, name, builder, base_image=base_image),
            timeout=settings.MTC_GCE_OPERATION_TIMEOUT_S * 3,
        )
        failed = False
        return name
    finally:
        if failed and keep_builder:
            say(f"kept {builder} for a look (delete it yourself)")
        else:
            say(f"deleting {builder}")
            api.send(ApiRequest("instances", "delete", "zone", builder))


def _await_builder(api: ComputeApi, builder: str, timeout_s: float, say) -> str:
    """The builder's ``mtc/image`` report: "done" or "failed: ..."."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = api.guest_attributes(builder).get("image", "")
        if state:
            return state
        time.sleep(settings.MTC_GCE_POLL_S * 10)
    return f"did not report within {timeout_s:.0f} s"
