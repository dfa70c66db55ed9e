"""gce startup scripts that tell the truth: a step that did not happen fails the boot with
why (never "ready" after a timeout), slurmd waits for the controller and is restarted by
systemd, the health agent is Slurm's HealthCheckProgram, and GPU nodes start DCGM and the
Ops Agent with the DCGM receiver v2. The slurmd and health-check parts of the rendered
script run here for real, with systemd and Slurm's commands replaced by shell functions
at their edge and system paths moved into a temporary dir."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from clusters.providers.gce import bootstrap
from clusters.reference_architectures import architecture_get

REPO = Path(__file__).resolve().parent.parent


def _spec() -> dict:
    return copy.deepcopy(architecture_get("a3-ultra-pretraining").build_spec())


def _pool(spec: dict, *, gpus: bool) -> dict:
    pool = copy.deepcopy(next(p for p in spec["node_pools"] if p["id"] == "a3u"))
    if not gpus:
        pool["machine_spec"] = {"machine_type": "n2-standard-8", "accelerator_count": 0}
    return pool


def _worker(gpus: bool = True) -> str:
    spec = _spec()
    return bootstrap.startup_script(spec, role="worker", pool=_pool(spec, gpus=gpus))


def _section(script: str, start: str, end: str | None = None) -> str:
    """The script from the line that starts with ``start`` up to ``end`` (or its end)."""
    head = script.index(start)
    tail = script.index(end, head) if end else len(script)
    return script[head:tail]


def _fail_function(script: str) -> str:
    return _section(script, "fail() {", "\n}\n") + "\n}\n"


def _run(program: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """Run ``program`` under ``set -euo pipefail`` with ``report`` writing the guest
    attributes mtc reads into a file; return the result and those attributes."""
    attributes = tmp_path / "attributes"
    prelude = (
        "set -euo pipefail\n"
        f'report() {{ printf \'%s=%s\\n\' "$1" "$2" >>{attributes}; }}\n'
        "sleep() { :; }\n"  # the loops' waits: the test need not wait them out
    )
    proc = subprocess.run(["bash", "-c", prelude + program], text=True, capture_output=True)
    seen = {}
    if attributes.exists():
        for line in attributes.read_text().splitlines():
            key, _, value = line.partition("=")
            seen[key] = value
    return proc, seen


def _slurmd_program(tmp_path: Path, *, controller_up: bool, registers: bool) -> str:
    script = _worker()
    section = _section(script, "# --- slurmd:").replace("/etc/systemd", str(tmp_path / "systemd"))
    calls = tmp_path / "calls"
    state = "IDLE" if registers else "DOWN*"
    stubs = (
        f'systemctl() {{ echo systemctl "$@" >>{calls}; }}\n'
        f'timeout() {{ echo probe "$@" >>{calls}; return {0 if controller_up else 1}; }}\n'
        f'scontrol() {{ echo "NodeName=$(hostname -s) State={state} Reason=x"; }}\n'
    )
    return _fail_function(script) + stubs + section


def test_a_node_whose_controller_never_answers_fails_and_never_starts_slurmd(tmp_path):
    proc, seen = _run(_slurmd_program(tmp_path, controller_up=False, registers=True), tmp_path)
    assert proc.returncode == 1
    assert seen["state"].startswith("failed: slurmctld on a3u-pretrain-controller:6817")
    assert "slurmd" not in seen  # never "ready"
    calls = (tmp_path / "calls").read_text()
    assert "probe 3 bash -c : </dev/tcp/a3u-pretrain-controller/6817" in calls
    assert "restart slurmd" not in calls


def test_a_slurmd_that_never_registers_fails_the_boot_instead_of_reporting_ready(tmp_path):
    proc, seen = _run(_slurmd_program(tmp_path, controller_up=True, registers=False), tmp_path)
    assert proc.returncode == 1
    assert seen == {"state": seen["state"]}
    assert seen["state"].startswith("failed: slurmd did not register")
    assert "mtc: slurmd did not register" in proc.stderr


def test_a_registered_node_is_ready_and_systemd_restarts_its_slurmd(tmp_path):
    proc, seen = _run(_slurmd_program(tmp_path, controller_up=True, registers=True), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert seen == {"slurmd": "ready", "state": "ready"}
    drop_in = (tmp_path / "systemd/system/slurmd.service.d/mtc.conf").read_text()
    assert "Restart=always\n" in drop_in and "RestartSec=5\n" in drop_in
    assert "--conf-server a3u-pretrain-controller" in drop_in
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls.index("systemctl restart slurmd") > calls.index("systemctl daemon-reload")


def test_the_controller_fails_its_boot_when_slurmctld_is_not_up():
    script = bootstrap.startup_script(_spec(), role="controller")
    assert "Restart=always" in script
    wait = _section(script, "for _ in $(seq 60); do scontrol ping", "report slurmctld ready")
    assert 'fail "slurmctld is not UP after 2 minutes' in wait


def test_slurm_runs_the_health_check_the_worker_writes():
    conf = bootstrap.slurm_conf(_spec())
    assert f"HealthCheckProgram={bootstrap.HEALTH_CHECK_PROGRAM}\n" in conf
    assert "HealthCheckNodeState=ANY,CYCLE\n" in conf
    assert f"cat >{bootstrap.HEALTH_CHECK_PROGRAM} <<'CHECK'" in _worker()


@pytest.mark.parametrize("gpus", [True, False])
def test_gpu_nodes_start_dcgm_and_the_ops_agents_dcgm_receiver_v2(gpus):
    script = _worker(gpus)
    gpu_part = _section(script, "# --- GPUs:", "# --- the health agent")
    assert gpu_part.startswith("# --- GPUs:")
    assert f"if [ {8 if gpus else 0} -gt 0 ]; then" in gpu_part
    assert "systemctl enable --now nvidia-persistenced" in gpu_part
    assert "systemctl enable --now nvidia-dcgm" in gpu_part
    assert "systemctl restart google-cloud-ops-agent" in gpu_part
    assert "receiver_version: 2" in gpu_part
    checks = "disk,gpu,ecc,xid,dcgm" if gpus else "disk"
    assert f"--checks {checks} " in script


def test_the_written_health_check_runs_the_real_agent(tmp_path, monkeypatch):
    """The health-agent part, rendered with the node runtime where this checkout is, run,
    and the program it writes run as slurmd would: the agent's report lands on disk."""
    home = tmp_path / "opt-mtc"
    home.mkdir()
    (home / "node").symlink_to(REPO / "node")
    program_path = tmp_path / "mtc-healthcheck"
    monkeypatch.setattr(bootstrap, "NODE_HOME", str(home))
    monkeypatch.setattr(bootstrap, "NODE_PYTHON", sys.executable)
    monkeypatch.setattr(bootstrap, "HEALTH_CHECK_PROGRAM", str(program_path))
    script = _worker(gpus=False)
    section = _section(script, "# --- the health agent", "# --- slurmd:")
    for system_path in ("/etc/mtc", "/var/lib/mtc", "/var/log/mtc-healthcheck.log"):
        section = section.replace(system_path, str(tmp_path / system_path.strip("/")))
    (tmp_path / "var/log").mkdir(parents=True)  # there on every node
    proc, seen = _run(_fail_function(script) + section, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert seen == {}
    check = subprocess.run([str(program_path)], text=True, capture_output=True, timeout=120)
    report = json.loads((tmp_path / "var/lib/mtc/healthcheck.json").read_text())
    assert check.returncode == 0, (tmp_path / "var/log/mtc-healthcheck.log").read_text()
    assert report["checks"][0]["name"] == "disk", report
    assert report["checks"][0]["status"] == "pass", report


def test_a_node_without_the_runtime_fails_its_boot_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(bootstrap, "NODE_HOME", str(tmp_path / "missing"))
    script = _worker(gpus=False)
    section = _section(script, "# --- the health agent", "# --- slurmd:")
    proc, seen = _run(_fail_function(script) + section, tmp_path)
    assert proc.returncode == 1
    assert seen["state"] == f"failed: the image has no mtc node runtime at {tmp_path}/missing " + (
        "(build it with deploy/image)"
    )
