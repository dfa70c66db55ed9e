"""The node agent's parsers on fixture texts in the tools' documented formats.

The fixtures in tests/fixtures/agent/ are written from NVIDIA's documented output formats,
not recorded on hardware (see the README there).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from node.agent import mtc_agent as agent

FIXTURES = Path(__file__).parent / "fixtures" / "agent"
AGENT_DIR = Path(agent.__file__).parent


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- nvidia-smi -L -----------------------------------------------------------------------


def test_list_gpus():
    parsed = agent.parse_nvidia_smi_list(fixture("nvidia-smi-L.txt"))
    assert [g["index"] for g in parsed["gpus"]] == list(range(8))
    assert parsed["gpus"][0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-2d6c7a3e-1b9f-4c7e-8a41-0f3b5e6d7c81",
    }
    assert parsed["lost"] == [] and not parsed["no_devices"] and parsed["driver_error"] is None


def test_list_with_lost_gpu_keeps_its_index():
    parsed = agent.parse_nvidia_smi_list(fixture("nvidia-smi-L-lost.txt"))
    assert [g["index"] for g in parsed["gpus"]] == [0, 1, 3, 4, 5, 6, 7]
    assert parsed["lost"] == [
        {
            "index": 2,
            "bus_id": "0000:3A:00.0",
            "error": "GPU is lost.  Reboot the system to recover this GPU",
        }
    ]


def test_unknown_error_and_no_devices_and_driver_failure():
    parsed = agent.parse_nvidia_smi_list(fixture("nvidia-smi-unknown-error.txt"))
    assert parsed["lost"] == [{"index": 0, "bus_id": "0000:3B:00.0", "error": "Unknown Error"}]
    assert agent.parse_nvidia_smi_list(fixture("nvidia-smi-no-devices.txt"))["no_devices"]
    failed = agent.parse_nvidia_smi_list(fixture("nvidia-smi-driver-failed.txt"))
    assert failed["driver_error"].startswith("NVIDIA-SMI has failed")
    assert failed["gpus"] == []


# --- nvidia-smi -q -d ECC,ROW_REMAPPER -----------------------------------------------------


def test_ecc_hopper_layout():
    parsed = agent.parse_ecc(fixture("nvidia-smi-q-ecc-hopper.txt"))
    first, second = parsed["gpus"]
    assert first["bus_id"] == "00000000:18:00.0"
    assert first["volatile_uncorrectable"] == 0
    assert first["aggregate_correctable"] == 1
    assert first["remapped_rows"] == {
        "correctable": 0,
        "uncorrectable": 0,
        "pending": False,
        "failure": False,
    }
    assert second["volatile_uncorrectable"] == 2  # DRAM 2 + SRAM parity 0 + SRAM SEC-DED 0
    assert second["volatile_correctable"] == 5
    assert second["remapped_rows"]["pending"] is True
    assert second["ecc_mode"] == "Enabled"


def test_ecc_ampere_layout_remap_failure():
    first, second = agent.parse_ecc(fixture("nvidia-smi-q-ecc-ampere.txt"))["gpus"]
    assert first["volatile_uncorrectable"] == 0
    assert first["aggregate_uncorrectable"] == 1
    assert first["remapped_rows"] == {
        "correctable": 3,
        "uncorrectable": 1,
        "pending": False,
        "failure": True,
    }
    assert second["remapped_rows"]["failure"] is False


def test_ecc_older_single_double_bit_layout():
    first, second = agent.parse_ecc(fixture("nvidia-smi-q-ecc-volta.txt"))["gpus"]
    assert (first["volatile_uncorrectable"], first["volatile_correctable"]) == (0, 0)
    assert first["aggregate_correctable"] == 4
    assert (second["volatile_uncorrectable"], second["volatile_correctable"]) == (1, 2)
    assert second["remapped_rows"] is None  # "Remapped Rows : N/A"


def test_query_gpu_csv_with_a_lost_gpu():
    fields = list(agent.Agent.QUERY_FIELDS)
    text = fixture("nvidia-smi-query-gpu.csv")
    rows = agent.parse_query_gpu_csv(text, fields)
    assert [r["index"] for r in rows] == [0, 1, 3]
    assert rows[0]["power.draw"] == 612.48 and rows[0]["memory.total"] == 81559
    assert rows[2]["ecc.errors.uncorrected.volatile.total"] is None  # [N/A]
    assert agent.parse_query_gpu_lost(text) == [
        {
            "index": 2,
            "bus_id": "0000:3A:00.0",
            "error": "GPU is lost.  Reboot the system to recover this GPU",
        }
    ]


def test_bus_keys_match_across_tools():
    assert agent.bus_key("00000000:3A:00.0") == agent.bus_key("0000:3a:00") == (0, 0x3A, 0)
    assert agent.bus_key("PCI:0000:3a:00") == (0, 0x3A, 0)
    assert agent.bus_key("garbage") is None


# --- kernel log XIDs -----------------------------------------------------------------------


def test_xid_lines():
    events = agent.parse_xid_lines(fixture("kmsg-xid.log"))
    assert [e["code"] for e in events] == [13, 13, 48, 63, 79, 94, 119, 31, 74, 150]
    fell = events[4]
    assert fell["pci"] == "0000:3a:00"
    assert fell["text"] == "GPU has fallen off the bus."
    assert events[7]["pci"] == "0000:ab:00"  # an old driver's line, without "PCI:"
    assert events[7]["text"].startswith("Ch 00000010")


def test_xid_severity_table():
    for code in (48, 64, 74, 79, 94, 95, 119, 120):
        assert agent.XID_TABLE[code][1] == agent.CRITICAL, code
    for code in (13, 31, 43, 63, 92):
        assert agent.XID_TABLE[code][1] == agent.WARNING, code


def _offline_agent(tmp_path, **config) -> agent.Agent:
    """An Agent that finds no tools (PATH is an empty directory)."""
    cfg = agent.load_config(None)
    cfg.update(config)
    a = agent.Agent(cfg)
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    a.path = str(empty)
    a.env["PATH"] = a.path
    return a


def test_xid_check_reports_new_lines_once(tmp_path):
    log = tmp_path / "kmsg.log"
    log.write_text(fixture("kmsg-xid.log"))
    a = _offline_agent(tmp_path, kernel_log=str(log), state_file=str(tmp_path / "state.json"))
    a.begin_round()
    result = agent.run_check(a, "xid")
    assert result["status"] == "fail"
    codes = {f["code"]: f for f in result["findings"]}
    assert set(codes) == {f"XID_{n}" for n in (13, 48, 63, 79, 94, 119, 31, 74, 150)}
    assert codes["XID_79"]["severity"] == "critical" and codes["XID_79"]["gpu"] is None
    assert codes["XID_13"]["severity"] == "warning" and " x2" in codes["XID_13"]["message"]
    assert codes["XID_150"]["severity"] == "warning" and "unlisted" in codes["XID_150"]["message"]
    a.commit_state()

    a.begin_round()
    again = agent.run_check(a, "xid")
    assert again["status"] == "pass" and again["findings"] == []

    with log.open("a") as fh:  # the same XID again, later: a new line
        fh.write(
            "[Tue Nov 26 10:00:00 2024] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, again\n"
        )
    fresh = agent.Agent(a.config)  # a new process reads the state file
    fresh.path, fresh.env = a.path, a.env
    fresh.begin_round()
    third = agent.run_check(fresh, "xid")
    assert [f["code"] for f in third["findings"]] == ["XID_13"]


def test_xid_check_skips_without_a_kernel_log(tmp_path):
    a = _offline_agent(tmp_path)
    a.begin_round()
    result = agent.run_check(a, "xid")
    assert result["status"] == "skip"
    assert "kernel log" in result["details"]["reason"]


# --- dcgmi -------------------------------------------------------------------------------


def test_dcgm4_diag_pass():
    diag = agent.parse_dcgm_diag(fixture("dcgmi-diag-r1-pass-dcgm4.json"))
    assert diag["failed"] == []
    assert diag["tests"] == [{"name": "software", "category": "Deployment", "status": "Pass"}]
    assert diag["version"] == "4.1.1"


def test_dcgm4_diag_failure():
    diag = agent.parse_dcgm_diag(fixture("dcgmi-diag-r2-fail-dcgm4.json"))
    assert [t["name"] for t in diag["tests"]] == ["software", "pcie", "memory"]
    (failed,) = diag["failed"]
    assert failed["test"] == "memory" and failed["category"] == "Hardware"
    assert failed["gpus"] == [1]
    assert "miscompares" in failed["messages"][0]


def test_dcgm3_diag_failure():
    diag = agent.parse_dcgm_diag(fixture("dcgmi-diag-r1-fail-dcgm3.json"))
    assert len(diag["tests"]) == 9
    (failed,) = diag["failed"]
    assert failed["test"] == "Page Retirement/Row Remap"
    assert failed["gpus"] == [1]
    assert diag["version"] == "3.3.5"


def test_dcgm_diag_rejects_non_json():
    with pytest.raises(ValueError):
        agent.parse_dcgm_diag("Error: unable to establish a connection to the host engine")


def test_dcgm_health():
    healthy = agent.parse_dcgm_health(fixture("dcgmi-health-healthy.json"))
    assert healthy == {"overall": "Healthy", "entities": [], "watches_disabled": False}
    failure = agent.parse_dcgm_health(fixture("dcgmi-health-failure.json"))
    assert failure["overall"] == "Failure"
    by_id = {e["id"]: e for e in failure["entities"]}
    assert by_id[0]["health"] == "Warning"
    assert by_id[0]["systems"][0]["system"] == "PCIe system"
    assert by_id[1]["systems"] == [
        {
            "system": "Memory system",
            "health": "Failure",
            "messages": ["Detected 2 volatile double-bit ECC error(s) in GPU 1."],
        }
    ]
    disabled = agent.parse_dcgm_health("Error: Health watches not enabled. Please enable watches.")
    assert disabled["watches_disabled"]


# --- computations, report helpers ------------------------------------------------------------


def test_reference_checksum_is_exact():
    a, b = agent.deterministic_matrices(64, 1)
    ikj = agent.checksum_matrix(agent.matmul_ikj(a, b))
    assert ikj == agent.REFERENCE_CHECKSUMS["64:1"] == agent.deterministic_checksum(64, 1)
    assert agent.reference_checksum(16, 3) == (
        agent.deterministic_checksum(16, 3),
        "recomputed (ikj loop order)",
    )
    corrupted = agent.checksum_matrix(agent.flip_one_bit(agent.deterministic_product(64, 1)))
    assert corrupted != ikj


def test_exit_codes_and_check_status():
    chk = agent.Check("x", 1)
    assert chk.status() == "pass"
    chk.finding("W", "w", agent.WARNING)
    assert chk.status() == "warn"
    chk.error("boom")
    assert chk.status() == "error"
    chk.finding("C", "c")
    assert chk.status() == "fail"

    def report(*statuses):
        return {"checks": [{"status": s, "findings": []} for s in statuses]}

    assert agent.exit_code(report("pass", "skip", "warn")) == 0
    assert agent.exit_code(report("pass", "error")) == 2
    assert agent.exit_code(report("error", "fail")) == 1


def test_a_crashing_check_is_an_error_not_a_crash(tmp_path, monkeypatch):
    def boom(agent_, chk):
        raise RuntimeError("bug")

    monkeypatch.setitem(agent.CHECKS, "disk", boom)
    a = _offline_agent(tmp_path)
    report = agent.run_round(a, "n1", ["disk"])
    assert report["checks"][0]["status"] == "error"
    assert report["checks"][0]["details"]["error"] == "RuntimeError: bug"
    assert agent.exit_code(report) == 2


@pytest.mark.parametrize(
    "path",
    [
        AGENT_DIR / "mtc_agent.py",
        AGENT_DIR.parent / "shim" / "_shimlib.py",
        AGENT_DIR.parent / "shim" / "inject.py",
        AGENT_DIR.parent / "shim" / "install.py",
        AGENT_DIR.parent / "shim" / "nvidia-smi",
        AGENT_DIR.parent / "shim" / "dcgmi",
        AGENT_DIR.parent / "shim" / "mtc-gpu-check",
    ],
    ids=lambda p: p.name,
)
def test_node_side_code_is_python38_stdlib_only(path):
    source = path.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    allowed = {
        "argparse",
        "ast",
        "csv",
        "hashlib",
        "_sha1",  # hashlib's builtin digests, which load no OpenSSL
        "_sha256",
        "importlib",
        "json",
        "operator",
        "os",
        "py_compile",
        "re",
        "shutil",
        "signal",
        "socket",
        "subprocess",
        "sys",
        "threading",
        "time",
        "traceback",
        "urllib",
        "__future__",
        "_shimlib",
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


def test_fixture_readme_says_not_recorded_on_hardware():
    text = (FIXTURES / "README.md").read_text()
    assert "not recorded on" in text and "documented output formats" in text
    for name in FIXTURES.iterdir():
        if name.suffix == ".json":
            json.loads(name.read_text())
