"""`mtc gce image build` against the recording endpoint: a builder VM that carries mtc's
node/ and deploy/image in its metadata, its report awaited, the VM stopped before its
disk becomes an image in the family nodes boot from (the endpoint refuses a running
one, as Compute Engine does), and the builder deleted whatever happened."""

from __future__ import annotations

import base64
import io
import re
import subprocess
import tarfile

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from clusters.providers.gce import image, image_build

from .test_gce_provider import compute  # noqa: F401  (the recording endpoint fixture)

ZONE = "us-central1-a"


def _build(*extra: str) -> str:
    out = io.StringIO()
    call_command("mtc", "gce", "image", "build", "--zone", ZONE, *extra, stdout=out)
    return out.getvalue()


def _builder_body(compute) -> dict:  # noqa: F811
    (insert,) = [r for r in compute.requests if r.call == "POST instances"]
    return insert.body


def test_a_build_makes_an_image_in_the_family_from_the_stopped_builder(compute, tmp_path):  # noqa: F811
    extras = tmp_path / "gpu.sh"
    extras.write_text("echo installing the GPU stack\n")
    output = _build("--extras", str(extras))
    (made,) = compute.names("images")
    assert f"image {made} is the newest of its family" in output
    assert made.startswith(f"{image.IMAGE_FAMILY}-")
    body = compute.resources[("images", made)]
    assert body["family"] == image.IMAGE_FAMILY == "mtc-slurm-22-05"
    builder = body["sourceDisk"].rsplit("/", 1)[1]
    assert builder.startswith(image_build.BUILDER_PREFIX)
    assert {"type": "GVNIC"} in body["guestOsFeatures"]
    calls = compute.calls()
    assert calls.index(f"POST instances/{builder}/stop") < calls.index("POST images")
    assert calls[-1] == f"DELETE instances/{builder}"
    assert compute.names("instances") == []

    sent = _builder_body(compute)
    assert sent["machineType"].endswith("/machineTypes/e2-standard-8")
    assert sent["disks"][0]["initializeParams"]["sourceImage"] == image_build.DEFAULT_BASE
    metadata = {i["key"]: i["value"] for i in sent["metadata"]["items"]}
    assert metadata["mtc-extras"] == "echo installing the GPU stack\n"
    archive = tarfile.open(fileobj=io.BytesIO(base64.b64decode(metadata["mtc-source"])))
    members = archive.getnames()
    assert "deploy/image/provision.sh" in members and "node/agent/mtc_agent.py" in members
    assert not [m for m in members if "__pycache__" in m]
    script = metadata["startup-script"]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "MTC_SOURCE=/opt/mtc-src bash /opt/mtc-src/deploy/image/provision.sh" in script


def test_a_failed_build_says_why_makes_no_image_and_deletes_the_builder(compute):  # noqa: F811
    compute.image_build_result = "failed: provision.sh failed (the serial console has its log)"
    with pytest.raises(CommandError, match="GCE_IMAGE_FAILED: .* failed: provision.sh failed"):
        _build()
    assert compute.names("images") == []
    assert compute.names("instances") == []


def test_keep_builder_leaves_a_failed_builder_for_a_look(compute):  # noqa: F811
    compute.image_build_result = "failed: the extras script failed"
    with pytest.raises(CommandError):
        _build("--keep-builder")
    (kept,) = compute.names("instances")
    assert kept.startswith(image_build.BUILDER_PREFIX)


def test_an_image_from_a_running_builder_is_refused_as_compute_engine_does(compute):  # noqa: F811
    """The endpoint's own rule, which the build relies on stopping the VM for."""
    from clusters.providers.base import ProviderError
    from clusters.providers.gce.client import ComputeApi
    from clusters.providers.gce.provider import target_for

    target = target_for({"zone": ZONE})
    api = ComputeApi(target)
    request = image_build.builder_request(
        target, "b1", base_image="img", machine_type="e2-standard-8", source=b"x"
    )
    api.send(request)
    with pytest.raises(ProviderError, match="already being used"):
        api.send(image_build.image_request(target, "img-1", "b1", base_image="img"))


def test_gpu_builds_run_the_gpu_stack_after_provision(compute):  # noqa: F811
    _build("--gpu")
    metadata = {i["key"]: i["value"] for i in _builder_body(compute)["metadata"]["items"]}
    assert metadata["mtc-gpu-stack"] == "TRUE" and "mtc-extras" not in metadata
    script = metadata["startup-script"]
    provision = script.index("deploy/image/provision.sh")
    assert provision < script.index("bash /opt/mtc-src/deploy/image/gpu-stack.sh")


def test_the_gpu_stack_installs_what_gpu_nodes_start():
    """gpu-stack.sh's steps, listed (its repositories and a GPU are not here): the
    driver with persistenced and the fabric manager, DCGM in the range the Ops Agent's
    receiver takes, the Ops Agent, gcsfuse; and it leaves to the startup script exactly
    the units a GPU node's startup script starts."""
    proc = subprocess.run(
        ["bash", str(image_build.REPO / "deploy/image/gpu-stack.sh")],
        env={"MTC_IMAGE_DRY_RUN": "1", "PATH": "/usr/bin:/bin"},
        text=True,
        capture_output=True,
    )
    assert proc.returncode == 0, proc.stderr
    steps = [line for line in proc.stdout.splitlines() if line.startswith("step: ")]
    text = "\n".join(steps)
    assert "nvidia-open-570 nvidia-fabricmanager-570 nvidia-persistenced" in text
    assert "datacenter-gpu-manager=1:3.3.9" in text  # Ops Agent: DCGM 3.1 to 3.3.9
    assert "cloudagents/add-google-cloud-ops-agent-repo.sh" in text
    assert "REPO_SUFFIX=2 bash /tmp/add-ops-agent-repo.sh --also-install" in text
    assert "install -y -qq gcsfuse" in text
    assert "not installed: the NCCL network plugin" in proc.stdout
    disabled = set(steps[-1].rsplit("systemctl disable ", 1)[1].split())
    from clusters.providers.gce import bootstrap

    worker = (bootstrap.SCRIPTS / "worker.sh").read_text()
    started = set(re.findall(r"systemctl (?:enable --now|restart) ([a-z-]+)", worker)) - {"slurmd"}
    assert (
        disabled
        == started
        == {
            "nvidia-persistenced",
            "nvidia-fabricmanager",
            "nvidia-dcgm",
            "google-cloud-ops-agent",
        }
    )
