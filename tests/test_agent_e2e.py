"""The node agent end to end: the device shim installed into a node directory, faults injected,
``mtc_agent.py --once`` run as a subprocess (``-S``: the standard library only)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.shim import inject, install

AGENT_DIR = Path(__file__).resolve().parents[1] / "node" / "agent"
AGENT = AGENT_DIR / "mtc_agent.py"
CHECKS = ["disk", "gpu", "ecc", "xid", "dcgm", "speed", "correctness", "host"]


def _find_python38() -> str | None:
    """A working python3.8 (the oldest the agent supports), if this machine has one."""
    candidates = [shutil.which("python3.8"), "/usr/bin/python3.8"]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.8*/bin/python3.8"))
    for candidate in candidates:
        if not candidate or not os.path.exists(candidate):
            continue
        try:
            ok = subprocess.run(
                [candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"],
                capture_output=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if ok.returncode == 0:
            return candidate
    return None


PYTHON38 = _find_python38()


@pytest.fixture
def env(tmp_path) -> dict:
    """PATH with a plain ``python3`` first (the shim scripts' interpreter), not a wrapper."""
    pybin = tmp_path / "pybin"
    pybin.mkdir()
    (pybin / "python3").symlink_to(os.path.realpath(sys.executable))
    return dict(os.environ, PATH=f"{pybin}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def node(tmp_path) -> Path:
    node_dir = tmp_path / "nodes" / "n1"
    (node_dir / "scratch").mkdir(parents=True)
    install.install(node_dir, 8, "NVIDIA_H200_141GB")
    config = json.loads((node_dir / "agent.json").read_text())
    config.update({"speed_seconds": 0.05, "speed_size": 32})
    (node_dir / "agent.json").write_text(json.dumps(config))
    return node_dir


def configure(node_dir: Path, **changes) -> Path:
    path = node_dir / "agent.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return path


def run_agent(node_dir: Path, env: dict, *args: str, python: str = sys.executable):
    proc = subprocess.run(
        [python, "-S", str(AGENT), "--node", "n1", "--config", str(node_dir / "agent.json")]
        + ["--once", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def findings(report: dict) -> dict:
    """code -> [finding, ...]"""
    out: dict = {}
    for check in report["checks"]:
        for f in check["findings"]:
            out.setdefault(f["code"], []).append(f)
    return out


def statuses(report: dict) -> dict:
    return {c["name"]: c["status"] for c in report["checks"]}


def assert_schema(report: dict) -> None:
    assert set(report) == {"node", "time", "agent_version", "checks"}
    assert report["agent_version"] == 1 and isinstance(report["time"], float)
    for check in report["checks"]:
        assert set(check) == {"name", "status", "duration_s", "budget_s", "details", "findings"}
        assert check["status"] in {"pass", "warn", "fail", "skip", "error"}
        assert isinstance(check["details"], dict)
        assert 0 <= check["duration_s"] <= check["budget_s"] + 1.5
        for f in check["findings"]:
            assert set(f) == {"code", "message", "severity", "gpu"}
            assert f["severity"] in {"critical", "warning"}
            assert f["gpu"] is None or isinstance(f["gpu"], int)


def test_healthy_emulated_node_passes(node, env, tmp_path):
    out = tmp_path / "out" / "report.json"
    rc, report, _ = run_agent(node, env, "--output", str(out))
    assert rc == 0, report
    assert_schema(report)
    assert report["node"] == "n1"
    assert [c["name"] for c in report["checks"]] == CHECKS
    assert set(statuses(report).values()) == {"pass"}, statuses(report)
    assert json.loads(out.read_text()) == report
    by_name = {c["name"]: c for c in report["checks"]}
    gpu = by_name["gpu"]["details"]
    assert gpu["count"] == 8 and gpu["gpus"][0]["name"] == "NVIDIA H200"
    assert gpu["telemetry"][0]["memory_total_mib"] == 143771
    assert gpu["telemetry"][0]["temperature_c"] == 30
    speed = by_name["speed"]["details"]
    assert speed["gflops"] > 0 and speed["iterations"] >= 1
    assert speed["gpu_tool"]["emulated"] is True
    correctness = by_name["correctness"]["details"]
    assert len(correctness["gpu_tool"]["results"]) == 8
    assert by_name["dcgm"]["details"]["diag"]["tests"][0]["name"] == "software"


def test_ecc_fault(node, env):
    inject.inject(node, "ecc", gpu=3)
    rc, report, _ = run_agent(node, env)
    assert rc == 1
    found = findings(report)
    (ecc,) = found["GPU_ECC_UNCORRECTABLE"]
    assert ecc["gpu"] == 3 and ecc["severity"] == "critical"
    assert found["GPU_ROW_REMAP_PENDING"][0]["severity"] == "warning"
    assert found["DCGM_HEALTH_FAILURE"][0]["gpu"] == 3
    assert statuses(report)["ecc"] == "fail"

    inject.inject(node, "ecc", gpu=1, remap="failure")
    _, report, _ = run_agent(node, env, "--checks", "ecc")
    assert [f["gpu"] for f in findings(report)["GPU_ROW_REMAP_FAILURE"]] == [1]


def test_xid_79_is_reported_once(node, env):
    inject.inject(node, "xid", code=79, gpu=2)
    assert "NVRM: Xid (PCI:0000:3a:00): 79," in (node / "kmsg.log").read_text()
    rc, report, _ = run_agent(node, env)
    assert rc == 1
    found = findings(report)
    (xid,) = found["XID_79"]
    assert xid["gpu"] == 2 and xid["severity"] == "critical"
    assert found["GPU_FELL_OFF_BUS"][0]["gpu"] == 2  # the shim also reports the GPU lost

    _, again, _ = run_agent(node, env)
    assert "XID_79" not in findings(again)
    assert statuses(again)["xid"] == "pass"

    inject.inject(node, "xid", code=48, gpu=5)
    _, third, _ = run_agent(node, env, "--checks", "xid")
    assert list(findings(third)) == ["XID_48"]

    inject.clear(node)
    rc, cleared, _ = run_agent(node, env)
    assert rc == 0 and findings(cleared) == {}


def test_dcgm_fault(node, env):
    inject.inject(node, "dcgm")
    rc, report, _ = run_agent(node, env, "--checks", "gpu,dcgm")
    assert rc == 1
    (diag,) = findings(report)["DCGM_DIAG_FAILED"]
    assert diag["gpu"] == 0 and "software" in diag["message"]
    configure(node, dcgm_level=2)
    inject.inject(node, "dcgm", gpu=4)
    _, report, _ = run_agent(node, env, "--checks", "dcgm")
    (diag,) = findings(report)["DCGM_DIAG_FAILED"]
    assert diag["gpu"] == 4 and "software, memory" in diag["message"]


def test_silent_data_corruption(node, env):
    inject.inject(node, "sdc", gpu=6)
    rc, report, _ = run_agent(node, env, "--checks", "correctness")
    assert rc == 1
    (sdc,) = findings(report)["SILENT_DATA_CORRUPTION"]
    assert sdc["gpu"] == 6 and sdc["severity"] == "critical"


def test_gpu_missing(node, env):
    inject.inject(node, "gpu-missing", gpu=5)
    rc, report, _ = run_agent(node, env)
    assert rc == 1
    assert list(findings(report)) == ["GPU_MISSING"]
    gpu = next(c for c in report["checks"] if c["name"] == "gpu")
    assert gpu["details"]["count"] == 7 and "7 of 8" in gpu["findings"][0]["message"]


def test_clear_restores_a_passing_node(node, env):
    for kind, params in (
        ("ecc", {"gpu": 1}),
        ("dcgm", {}),
        ("sdc", {}),
        ("gpu-missing", {"gpu": 0}),
    ):
        inject.inject(node, kind, **params)
    rc, _, _ = run_agent(node, env)
    assert rc == 1
    inject.clear(node, "ecc")
    assert inject.faults(node)["ecc"] is None and inject.faults(node)["sdc"] is True
    inject.clear(node)
    rc, report, _ = run_agent(node, env)
    assert rc == 0 and findings(report) == {}


def test_disk_full(node, env):
    configure(node, disk_min_free_pct=101)
    rc, report, _ = run_agent(node, env, "--checks", "disk")
    assert rc == 1
    (full,) = findings(report)["DISK_FULL"]
    assert str(node / "scratch") in full["message"]
    details = report["checks"][0]["details"]["paths"][str(node / "scratch")]
    assert details["free_gb"] > 0 and 0 < details["free_pct"] <= 100


def test_slurm_drain_on_critical_finding(node, env, tmp_path):
    calls = tmp_path / "scontrol-calls.jsonl"
    fake = node / "bin" / "scontrol"
    fake.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    fake.chmod(0o755)
    rc, _, _ = run_agent(node, env, "--checks", "ecc", "--slurm-drain")
    assert rc == 0 and not calls.exists()  # healthy: no drain
    inject.inject(node, "ecc", gpu=2)
    rc, _, stderr = run_agent(node, env, "--checks", "ecc", "--slurm-drain")
    assert rc == 1
    args = json.loads(calls.read_text().splitlines()[-1])
    assert args == ["update", "NodeName=n1", "State=DRAIN", "Reason=mtc: GPU_ECC_UNCORRECTABLE"]
    assert "drained n1" in stderr


def test_check_budget_timeout(node, env):
    slow = node / "slow-bin"
    slow.mkdir()
    # A hung tool whose child keeps the output pipe open: the whole group must be killed.
    (slow / "nvidia-smi").write_text("#!/bin/sh\nsleep 30 &\nsleep 30\n")
    (slow / "nvidia-smi").chmod(0o755)
    configure(node, path_prepend=str(slow), budgets={"gpu": 0.5})
    started = time.monotonic()
    rc, report, _ = run_agent(node, env, "--checks", "gpu,disk")
    assert time.monotonic() - started < 10
    assert rc == 2
    gpu = report["checks"][0]
    assert gpu["status"] == "error" and gpu["details"]["timeout"] is True
    assert [f["code"] for f in gpu["findings"]] == ["CHECK_TIMEOUT"]
    assert report["checks"][1]["status"] == "pass"


def test_nvml_failure_is_kept_in_gpu_missing(node, env):
    broken = node / "broken-bin"
    broken.mkdir()
    (broken / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n"
    )
    (broken / "nvidia-smi").chmod(0o755)
    configure(node, path_prepend=str(broken))
    rc, report, _ = run_agent(node, env, "--checks", "gpu")
    assert rc == 1
    (missing,) = findings(report)["GPU_MISSING"]
    assert missing["message"] == (
        "0 of 8 expected GPUs visible to nvidia-smi: "
        "Failed to initialize NVML: Driver/library version mismatch"
    )


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="this machine has a real nvidia-smi")
def test_node_without_gpu_tools(node, env):
    configure(node, path_prepend=None, expected_gpus=None)
    rc, report, _ = run_agent(node, env, "--checks", "gpu,ecc,dcgm,correctness")
    assert rc == 0
    assert statuses(report) == {"gpu": "skip", "ecc": "skip", "dcgm": "skip", "correctness": "pass"}
    configure(node, expected_gpus=8)
    rc, report, _ = run_agent(node, env, "--checks", "gpu")
    assert rc == 1 and list(findings(report)) == ["GPU_MISSING"]


def test_usage_errors(node, env):
    proc = subprocess.run(
        [sys.executable, "-S", str(AGENT), "--node", "n1", "--checks", "disk,bogus", "--once"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert proc.returncode == 2 and "bogus" in proc.stderr


@pytest.mark.parametrize(
    "changes",
    [
        {"budgets": "not-a-dict"},
        {"budgets": {"nope": 1}},
        {"expected_gpus": "8"},
        {"dcgm_level": -1},
    ],
)
def test_bad_config_exits_2(node, env, changes):
    configure(node, **changes)
    proc = subprocess.run(
        [sys.executable, "-S", str(AGENT), "--node", "n1", "--once"]
        + ["--config", str(node / "agent.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert proc.returncode == 2 and proc.stdout == "" and "config" in proc.stderr


def test_interval_mode_runs_until_sigterm(node, env):
    proc = subprocess.Popen(
        [sys.executable, "-S", str(AGENT), "--node", "n1", "--config", str(node / "agent.json")]
        + ["--interval", "0.2", "--checks", "disk,xid"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = json.loads(proc.stdout.readline())
        inject.inject(node, "xid", code=79, gpu=1)
        second = json.loads(proc.stdout.readline())
        while "XID_79" not in findings(second):  # the injection may land mid-round
            second = json.loads(proc.stdout.readline())
        assert findings(first) == {}
        assert second["time"] > first["time"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_shim_tools_directly(node, env):
    def run(*args):
        return subprocess.run(
            [str(node / "bin" / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )

    csv = run(
        "nvidia-smi",
        "--query-gpu=index,name,utilization.gpu,memory.used,memory.total,temperature.gpu,"
        "power.draw,ecc.errors.uncorrected.volatile.total",
        "--format=csv,noheader,nounits",
    )
    assert csv.stdout.splitlines()[0] == "0, NVIDIA H200, 0, 0, 143771, 30, 0.00, 0"
    with_header = run("nvidia-smi", "--query-gpu=index,memory.used", "--format=csv")
    assert with_header.stdout.splitlines()[:2] == ["index, memory.used [MiB]", "0, 0 MiB"]
    assert run("nvidia-smi", "--query-gpu=bogus", "--format=csv").returncode == 2
    assert "NVIDIA-SMI 550" in run("nvidia-smi").stdout
    inject.inject(node, "xid", code=79, gpu=2)
    listing = run("nvidia-smi", "-L")
    assert listing.returncode == 15
    assert "Unable to determine the device handle for GPU 0000:3A:00.0: GPU is lost" in (
        listing.stdout
    )
    health = json.loads(run("dcgmi", "health", "-c", "-j").stdout)
    assert health["body"]["Overall Health"]["value"] == "Healthy"
    gpu_check = json.loads(run("mtc-gpu-check", "--size", "16", "--seed", "3").stdout)
    assert gpu_check["emulated"] is True and len(gpu_check["results"]) == 7  # one lost


def test_install_links_and_type_names(tmp_path, env):
    node_dir = tmp_path / "linked"
    bin_dir = install.install(node_dir, 2, "NVIDIA H100 80GB HBM3", link=True)
    assert os.path.islink(os.path.join(bin_dir, "nvidia-smi"))
    gpus = json.loads((node_dir / "gpus.json").read_text())
    assert gpus == {
        "count": 2,
        "type": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81559,
        "emulated": True,
    }
    listing = subprocess.run(
        [os.path.join(bin_dir, "nvidia-smi"), "-L"], capture_output=True, text=True, env=env
    )
    assert listing.stdout.count("NVIDIA H100 80GB HBM3") == 2
    with pytest.raises(ValueError):
        inject.inject(node_dir, "ecc", gpu=2)
    with pytest.raises(ValueError):
        inject.inject(node_dir, "meteor")


@pytest.mark.skipif(PYTHON38 is None, reason="no python3.8 here")
def test_agent_runs_on_python38(node, env):
    rc, report, stderr = run_agent(node, env, python=PYTHON38)
    assert rc == 0, stderr
    assert set(statuses(report).values()) == {"pass"}


def test_the_shims_tools_name_their_interpreter_and_need_no_path(node):
    """The agent runs the tools several times a round on every node: each starts the
    interpreter mtc runs on directly (isolated, no site), not whatever `python3` PATH
    finds first (pyenv's shim is a bash script that costs ~0.13 s of CPU a call)."""
    tool = node / "bin" / "nvidia-smi"
    assert tool.read_text().splitlines()[0] == f"#!{sys.executable} -IS"
    proc = subprocess.run(
        [str(tool), "-L"],
        env={"PATH": "/nonexistent", "MTC_NODE_DIR": str(node)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert len([line for line in proc.stdout.splitlines() if line.startswith("GPU ")]) == 8
