"""The mtc device shim: per-node stand-ins for ``nvidia-smi``, ``dcgmi`` and ``mtc-gpu-check``.

Used on machines without GPUs (the local provider's emulated GPUs) and to inject GPU faults.
One file past 400 lines on purpose: it is copied into each node's bin/ beside the tools.
Each tool is a small executable script next to this module; all of them read two files from
the node directory (``$MTC_NODE_DIR``, else the parent of the directory holding the script,
i.e. ``<node_dir>/bin/..``):

- ``gpus.json``: ``{"count": 8, "type": "NVIDIA H200", "memory_mib": 143771, "emulated": true}``
- ``faults.json``: ``{"ecc": {"gpu": 3} | null, "xid": {"code": 79, "gpu": 2} | null,
  "dcgm": true | false | {"gpu": n}, "sdc": true | false | {"gpu": n},
  "gpu-missing": {"gpu": 5} | null}``

and print what the real tools print (the documented text/CSV/JSON formats). Fault effects:

- ecc: the GPU shows volatile/aggregate DRAM uncorrectable errors (``count``, default 1) and
  remapped rows (``remap``: "pending" (default) | "failure" | "none"); ``dcgmi health``
  reports its memory system as failed.
- xid: the kernel log line is written by ``inject.py``; code 79 (fallen off the bus) also
  makes the GPU unreachable: nvidia-smi prints "Unable to determine the device handle for
  GPU ...: GPU is lost" for it and exits 15, as the real one does.
- dcgm: ``dcgmi diag`` fails on the GPU (true means GPU 0).
- sdc: ``mtc-gpu-check`` returns a checksum with one bit flipped for the GPU (true: GPU 0).
- gpu-missing: the GPU is gone from the bus: every tool lists one GPU fewer (renumbered).

Fault GPU numbers are physical slots (the index the GPU had with every GPU present).
Stdlib only, python3 >= 3.8.
"""

from __future__ import annotations

import json
import os
import sys
import time

try:  # the builtin digest: hashlib loads OpenSSL, ~10 ms of every tool's start
    from _sha1 import sha1 as _sha1
except ImportError:
    from hashlib import sha1 as _sha1

DRIVER_VERSION = "550.127.05"
CUDA_VERSION = "12.4"
DCGM_VERSION = "4.1.1"
EMULATED_TEMPERATURE_C = 30

EMPTY_FAULTS = {"ecc": None, "xid": None, "dcgm": False, "sdc": False, "gpu-missing": None}

# Accelerator types (the cluster spec's names) -> (the name nvidia-smi prints, memory MiB,
# PCI device id, architecture).
GPU_TYPES = {
    "NVIDIA_H200_141GB": ("NVIDIA H200", 143771, "2335", "Hopper"),
    "NVIDIA_B200": ("NVIDIA B200", 183359, "2901", "Blackwell"),
    "NVIDIA_H100_MEGA_80GB": ("NVIDIA H100 80GB HBM3", 81559, "2330", "Hopper"),
    "NVIDIA_H100_80GB": ("NVIDIA H100 80GB HBM3", 81559, "2330", "Hopper"),
    "NVIDIA_A100_80GB": ("NVIDIA A100-SXM4-80GB", 81920, "20B2", "Ampere"),
    "NVIDIA_TESLA_A100": ("NVIDIA A100-SXM4-40GB", 40960, "20B0", "Ampere"),
    "NVIDIA_L4": ("NVIDIA L4", 23034, "27B8", "Ada Lovelace"),
}
_BY_DISPLAY_NAME = {v[0]: v for v in GPU_TYPES.values()}

# PCI buses of the eight GPUs of an HGX baseboard; more GPUs get made-up buses.
_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]

# Kernel log text of the XIDs inject.py writes (after "NVRM: Xid (PCI:...): <code>, ").
XID_TEXT = {
    13: "pid=4242, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): "
    "Out Of Range Address",
    31: "pid=4242, name=python, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS "
    "GPCCLIENT_T1_0 faulted @ 0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    43: "pid=4242, name=python, Ch 00000008",
    48: "pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been "
    "detected on GPU in the framebuffer at partition 0, subpartition 0.",
    63: "pid='<unknown>', name=<unknown>, Row Remapper: New row marked for remapping, reset "
    "gpu to activate.",
    64: "pid='<unknown>', name=<unknown>, Row Remapper: row remapping failed.",
    74: "pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 3(0x0, 0x0, "
    "0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    92: "pid='<unknown>', name=<unknown>, High single-bit ECC error rate.",
    94: "pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No",
    95: "pid='<unknown>', name=<unknown>, Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "pid='<unknown>', name=<unknown>, Timeout after 6s of waiting for RPC response from "
    "GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).",
    120: "pid='<unknown>', name=<unknown>, GSP task exception: (reason 0x0).",
}


# --- node files ------------------------------------------------------------------------------


def node_dir_for(script: str) -> str:
    env = os.environ.get("MTC_NODE_DIR")
    if env:
        return os.path.abspath(env)
    # Not resolving links: <node_dir>/bin/nvidia-smi may link to the shim in the repository.
    return os.path.dirname(os.path.dirname(os.path.abspath(script)))


def read_json(path: str, default):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def write_json_atomic(path: str, value) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(value, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def load_faults(node_dir: str) -> dict:
    faults = dict(EMPTY_FAULTS)
    loaded = read_json(os.path.join(node_dir, "faults.json"), {})
    if isinstance(loaded, dict):
        faults.update(loaded)
    if "gpu_missing" in faults and not faults.get("gpu-missing"):
        faults["gpu-missing"] = faults.pop("gpu_missing")
    return faults


def fault_slot(value, default: int = 0):
    """The GPU slot a fault names: true -> default, {"gpu": n} -> n, falsy -> None."""
    if not value:
        return None
    if isinstance(value, dict):
        gpu = value.get("gpu", default)
        return int(gpu) if gpu is not None else default
    return default


def gpu_type_info(name: str) -> tuple[str, int, str, str]:
    """(display name, memory MiB, PCI device id, architecture) of a type or display name."""
    if name in GPU_TYPES:
        return GPU_TYPES[name]
    if name in _BY_DISPLAY_NAME:
        return _BY_DISPLAY_NAME[name]
    return (name, 81920, "2330", "Hopper")


def bus_hex(slot: int) -> str:
    return _BUSES[slot] if slot < len(_BUSES) else "%02X" % ((0xE0 + slot) & 0xFF)


def bus_id(slot: int) -> str:
    """nvidia-smi's form: 00000000:18:00.0"""
    return f"00000000:{bus_hex(slot)}:00.0"


def xid_pci(slot: int) -> str:
    """The kernel log's form: 0000:18:00"""
    return f"0000:{bus_hex(slot).lower()}:00"


class Node:
    """A node's GPUs as the tools see them, faults applied."""

    def __init__(self, node_dir: str) -> None:
        self.dir = node_dir
        spec = read_json(os.path.join(node_dir, "gpus.json"), {})
        if not isinstance(spec, dict):
            spec = {}
        self.count = int(spec.get("count", 0) or 0)
        name, memory, device_id, arch = gpu_type_info(str(spec.get("type") or "NVIDIA H200"))
        self.name = name
        self.memory_mib = int(spec.get("memory_mib") or memory)
        self.device_id = device_id
        self.arch = arch
        self.emulated = bool(spec.get("emulated", True))
        self.faults = load_faults(node_dir)
        missing = fault_slot(self.faults.get("gpu-missing"))
        xid = self.faults.get("xid") if isinstance(self.faults.get("xid"), dict) else None
        lost = fault_slot(xid) if xid and int(xid.get("code", 0)) == 79 else None
        label = os.path.basename(os.path.abspath(node_dir))
        self.gpus = []
        for slot in range(self.count):
            if slot == missing:
                continue
            digest = _sha1(f"{label}/{slot}".encode()).hexdigest()
            self.gpus.append(
                {
                    "index": len(self.gpus),
                    "slot": slot,
                    "bus_id": bus_id(slot),
                    "uuid": "GPU-"
                    + "-".join(
                        (digest[:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32])
                    ),
                    "serial": str(int(digest[:10], 16) % 10**13).zfill(13),
                    "lost": slot == lost,
                }
            )

    def fault_on(self, kind: str, gpu: dict) -> bool:
        return fault_slot(self.faults.get(kind)) == gpu["slot"]

    def ecc(self, gpu: dict) -> dict:
        fault = self.faults.get("ecc") if self.fault_on("ecc", gpu) else None
        if not fault:
            return {"uncorrectable": 0, "pending": False, "failure": False}
        count = int(fault.get("count", 1)) if isinstance(fault, dict) else 1
        remap = fault.get("remap", "pending") if isinstance(fault, dict) else "pending"
        return {
            "uncorrectable": count,
            "pending": remap == "pending",
            "failure": remap == "failure",
        }


def lost_line(gpu: dict) -> str:
    return (
        "Unable to determine the device handle for GPU {}: GPU is lost.  Reboot the system "
        "to recover this GPU".format(gpu["bus_id"][4:])
    )


# --- nvidia-smi ------------------------------------------------------------------------------

NVSMI_EXIT_GPU_LOST = 15  # nvidia-smi(1): "GPU has fallen off the bus or ... inaccessible"


def _kv(indent: int, key: str, value) -> str:
    return (" " * indent + key).ljust(42) + ": " + str(value)


def _query_log_header(node: Node) -> list[str]:
    return [
        "",
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", time.strftime("%a %b %d %H:%M:%S %Y")),
        _kv(0, "Driver Version", DRIVER_VERSION),
        _kv(0, "CUDA Version", CUDA_VERSION),
        "",
        _kv(0, "Attached GPUs", len(node.gpus)),
    ]


def _ecc_section(node: Node, gpu: dict) -> list[str]:
    e = node.ecc(gpu)
    unc = e["uncorrectable"]
    lines = ["    ECC Mode", _kv(8, "Current", "Enabled"), _kv(8, "Pending", "Enabled")]
    lines.append("    ECC Errors")
    for block in ("Volatile", "Aggregate"):
        lines.append("        " + block)
        lines += [
            _kv(12, "SRAM Correctable", 0),
            _kv(12, "SRAM Uncorrectable Parity", 0),
            _kv(12, "SRAM Uncorrectable SEC-DED", 0),
            _kv(12, "DRAM Correctable", 0),
            _kv(12, "DRAM Uncorrectable", unc),
        ]
    lines.append(_kv(12, "SRAM Threshold Exceeded", "No"))
    lines.append("        Aggregate Uncorrectable SRAM Sources")
    for src in ("SRAM L2", "SRAM SM", "SRAM Microcontroller", "SRAM PCIE", "SRAM Other"):
        lines.append(_kv(12, src, 0))
    return lines


def _remap_section(node: Node, gpu: dict) -> list[str]:
    e = node.ecc(gpu)
    return [
        "    Remapped Rows",
        _kv(8, "Correctable Error", 0),
        _kv(8, "Uncorrectable Error", e["uncorrectable"]),
        _kv(8, "Pending", "Yes" if e["pending"] else "No"),
        _kv(8, "Remapping Failure Occurred", "Yes" if e["failure"] else "No"),
        "        Bank Remap Availability Histogram",
        _kv(12, "Max", f"{2560 - e['uncorrectable']} bank(s)"),
        _kv(12, "High", f"{e['uncorrectable']} bank(s)"),
        _kv(12, "Partial", "0 bank(s)"),
        _kv(12, "Low", "0 bank(s)"),
        _kv(12, "None", "0 bank(s)"),
    ]


def _identity_section(node: Node, gpu: dict) -> list[str]:
    return [
        _kv(4, "Product Name", node.name),
        _kv(4, "Product Brand", "NVIDIA"),
        _kv(4, "Product Architecture", node.arch),
        _kv(4, "Serial Number", gpu["serial"]),
        _kv(4, "GPU UUID", gpu["uuid"]),
        _kv(4, "Minor Number", gpu["index"]),
        "    PCI",
        _kv(8, "Bus", "0x" + gpu["bus_id"][9:11]),
        _kv(8, "Device", "0x00"),
        _kv(8, "Domain", "0x0000"),
        _kv(8, "Device Id", f"0x{node.device_id}10DE"),
        _kv(8, "Bus Id", gpu["bus_id"]),
    ]


def _memory_section(node: Node, gpu: dict) -> list[str]:
    return [
        "    FB Memory Usage",
        _kv(8, "Total", f"{node.memory_mib} MiB"),
        _kv(8, "Reserved", "0 MiB"),
        _kv(8, "Used", "0 MiB"),
        _kv(8, "Free", f"{node.memory_mib} MiB"),
    ]


def _temperature_section(node: Node, gpu: dict) -> list[str]:
    return ["    Temperature", _kv(8, "GPU Current Temp", f"{EMULATED_TEMPERATURE_C} C")]


def _power_section(node: Node, gpu: dict) -> list[str]:
    return ["    GPU Power Readings", _kv(8, "Power Draw", "0.00 W")]


_DISPLAYS = {
    "MEMORY": _memory_section,
    "ECC": _ecc_section,
    "TEMPERATURE": _temperature_section,
    "POWER": _power_section,
    "ROW_REMAPPER": _remap_section,
}


def _select(node: Node, ids) -> list[dict]:
    if ids is None:
        return node.gpus
    wanted = set()
    for item in ids.split(","):
        item = item.strip()
        for gpu in node.gpus:
            if item in (str(gpu["index"]), gpu["uuid"], gpu["bus_id"], gpu["bus_id"][4:]):
                wanted.add(gpu["index"])
    return [g for g in node.gpus if g["index"] in wanted]


def smi_query(node: Node, displays, ids=None) -> tuple[str, int]:
    """``nvidia-smi -q [-d ECC,ROW_REMAPPER,...]``"""
    gpus = _select(node, ids)
    errors = [lost_line(g) for g in gpus if g["lost"]]
    lines = list(errors) + _query_log_header(node)
    wanted = [d.strip().upper() for d in displays.split(",")] if displays else None
    for gpu in gpus:
        if gpu["lost"]:
            continue
        lines.append("GPU " + gpu["bus_id"])
        if wanted is None:
            lines += _identity_section(node, gpu)
            for fn in _DISPLAYS.values():
                lines += fn(node, gpu)
        else:
            for name in wanted:
                if name in _DISPLAYS:
                    lines += _DISPLAYS[name](node, gpu)
        lines.append("")
    return "\n".join(lines) + "\n", NVSMI_EXIT_GPU_LOST if errors else 0


def smi_list(node: Node) -> tuple[str, int]:
    """``nvidia-smi -L``"""
    if not node.gpus:
        return "No devices were found\n", 6
    lines, rc = [], 0
    for gpu in node.gpus:
        if gpu["lost"]:
            lines.append(lost_line(gpu))
            rc = NVSMI_EXIT_GPU_LOST
        else:
            lines.append(f"GPU {gpu['index']}: {node.name} (UUID: {gpu['uuid']})")
    return "\n".join(lines) + "\n", rc


# field -> (unit shown in the header and values, value function)
def _query_fields(node: Node):
    mem = node.memory_mib

    def ecc_unc(g):
        return node.ecc(g)["uncorrectable"]

    return {
        "index": ("", lambda g: g["index"]),
        "count": ("", lambda g: len(node.gpus)),
        "name": ("", lambda g: node.name),
        "gpu_name": ("", lambda g: node.name),
        "uuid": ("", lambda g: g["uuid"]),
        "gpu_uuid": ("", lambda g: g["uuid"]),
        "serial": ("", lambda g: g["serial"]),
        "pci.bus_id": ("", lambda g: g["bus_id"]),
        "gpu_bus_id": ("", lambda g: g["bus_id"]),
        "driver_version": ("", lambda g: DRIVER_VERSION),
        "utilization.gpu": ("%", lambda g: 0),
        "utilization.memory": ("%", lambda g: 0),
        "memory.total": ("MiB", lambda g: mem),
        "memory.used": ("MiB", lambda g: 0),
        "memory.free": ("MiB", lambda g: mem),
        "temperature.gpu": ("", lambda g: EMULATED_TEMPERATURE_C),
        "power.draw": ("W", lambda g: "0.00"),
        "power.limit": ("W", lambda g: "700.00"),
        "ecc.mode.current": ("", lambda g: "Enabled"),
        "ecc.errors.uncorrected.volatile.total": ("", ecc_unc),
        "ecc.errors.uncorrected.aggregate.total": ("", ecc_unc),
        "ecc.errors.corrected.volatile.total": ("", lambda g: 0),
        "ecc.errors.corrected.aggregate.total": ("", lambda g: 0),
        "retired_pages.pending": ("", lambda g: "No"),
        "clocks.sm": ("MHz", lambda g: 1980),
        "clocks.max.sm": ("MHz", lambda g: 1980),
        "pstate": ("", lambda g: "P0"),
    }


def smi_query_gpu(node: Node, fields: str, fmt: str, ids=None) -> tuple[str, int]:
    """``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``"""
    table = _query_fields(node)
    names = [f.strip() for f in fields.split(",") if f.strip()]
    for name in names:
        if name not in table:
            return f'Field "{name}" is not a valid field to query.\n\n', 2
    opts = {o.strip() for o in fmt.split(",")}
    if "csv" not in opts:
        return f'"{fmt}" is not a valid format.\n', 2
    lines, rc = [], 0
    if "noheader" not in opts:
        lines.append(
            ", ".join(name + (f" [{table[name][0]}]" if table[name][0] else "") for name in names)
        )
    for gpu in _select(node, ids):
        if gpu["lost"]:
            lines.append(lost_line(gpu))
            rc = NVSMI_EXIT_GPU_LOST
            continue
        values = []
        for name in names:
            unit, fn = table[name]
            value = str(fn(gpu))
            values.append(value if not unit or "nounits" in opts else f"{value} {unit}")
        lines.append(", ".join(values))
    return "\n".join(lines) + "\n", rc


def smi_table(node: Node) -> tuple[str, int]:
    """Plain ``nvidia-smi``: the summary table."""
    lost = [g for g in node.gpus if g["lost"]]
    if lost:
        return lost_line(lost[0]) + "\n", NVSMI_EXIT_GPU_LOST
    if not node.gpus:
        return "No devices were found\n", 6

    def row(*cells: str) -> str:
        return "|" + "|".join(cells) + "|"

    full = "+" + "-" * 89 + "+"
    bar = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    banner = (
        f"NVIDIA-SMI {DRIVER_VERSION}             "
        f"Driver Version: {DRIVER_VERSION}     CUDA Version: {CUDA_VERSION}"
    )
    out = [
        time.strftime("%a %b %d %H:%M:%S %Y"),
        full,
        "| " + banner.ljust(87) + " |",
        "|" + bar[1:],
        row(
            " GPU  Name                 Persistence-M ",
            " Bus-Id          Disp.A ",
            " Volatile Uncorr. ECC ",
        ),
        row(
            " Fan  Temp   Perf          Pwr:Usage/Cap ",
            "           Memory-Usage ",
            " GPU-Util  Compute M. ",
        ),
        row(" " * 41, " " * 24, "               MIG M. "),
        "|" + "+".join(("=" * 41, "=" * 24, "=" * 22)) + "|",
    ]
    for gpu in node.gpus:
        unc = node.ecc(gpu)["uncorrectable"]
        memory = f"0MiB /{node.memory_mib:>7}MiB"
        out += [
            row(
                f"{gpu['index']:>4}  {node.name[:31]:<31}On  ",
                "   {} Off ".format(gpu["bus_id"]),
                f"{unc:>21} ",
            ),
            row(
                f" N/A   {EMULATED_TEMPERATURE_C:>2}C    P0              0W /  700W ",
                memory.rjust(23) + " ",
                "      0%      Default ",
            ),
            row(" " * 41, " " * 24, "Disabled".rjust(21) + " "),
            bar,
        ]
    out += [
        "",
        full,
        "| " + "Processes:".ljust(87) + " |",
        "| " + " GPU   GI   CI        PID   Type   Process name".ljust(76) + "GPU Memory |",
        "| " + "       ID   ID".ljust(76) + "Usage      |",
        "|" + "=" * 89 + "|",
        "| " + " No running processes found".ljust(87) + " |",
        full,
    ]
    return "\n".join(out) + "\n", 0


def _arg_value(argv: list[str], i: int, flag: str) -> tuple[str | None, int]:
    """The value of ``--flag=value`` or ``--flag value`` / ``-f value`` at argv[i]."""
    arg = argv[i]
    if "=" in arg:
        return arg.split("=", 1)[1], i
    if i + 1 < len(argv):
        return argv[i + 1], i + 1
    return None, i


def main_nvidia_smi(argv: list[str], script: str) -> int:
    node = Node(node_dir_for(script))
    mode, displays, ids, fields, fmt = "table", None, None, None, None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-L", "--list-gpus"):
            mode = "list"
        elif arg in ("-q", "--query"):
            mode = "query"
        elif arg in ("-d", "--display") or arg.startswith("--display="):
            displays, i = _arg_value(argv, i, arg)
        elif arg in ("-i", "--id") or arg.startswith("--id="):
            ids, i = _arg_value(argv, i, arg)
        elif arg.startswith("--query-gpu"):
            mode = "query-gpu"
            fields, i = _arg_value(argv, i, arg)
        elif arg.startswith("--format"):
            fmt, i = _arg_value(argv, i, arg)
        elif arg in ("-h", "--help"):
            sys.stdout.write("NVIDIA System Management Interface -- mtc device shim\n")
            return 0
        else:
            sys.stdout.write(
                "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n"
            )
            return 2
        i += 1
    if mode == "list":
        text, rc = smi_list(node)
    elif mode == "query":
        text, rc = smi_query(node, displays, ids)
    elif mode == "query-gpu":
        if not fields or not fmt:
            sys.stdout.write("Missing --format. Please run 'nvidia-smi -h' for help.\n")
            return 2
        text, rc = smi_query_gpu(node, fields, fmt, ids)
    else:
        text, rc = smi_table(node)
    sys.stdout.write(text)
    return rc


def _cells(left: str, right: str, lw: int, rw: int) -> str:
    return "| " + str(left).ljust(lw) + " | " + str(right).ljust(rw) + " |"


# --- dcgmi -----------------------------------------------------------------------------------

# level -> [(category, test)] added at that level (DCGM 4 plugin names).
_DIAG_TESTS = {
    1: [("Deployment", "software")],
    2: [("Integration", "pcie"), ("Hardware", "memory")],
    3: [
        ("Hardware", "diagnostic"),
        ("Stress", "targeted_stress"),
        ("Stress", "targeted_power"),
        ("Stress", "memory_bandwidth"),
    ],
    4: [("Hardware", "memtest"), ("Stress", "pulse_test")],
}
# The test a dcgm fault fails at each level, and its message (DCGM error texts).
_DIAG_FAILURES = {
    "software": (22, "A corrupt InfoROM has been detected in GPU %d."),
    "memory": (34, "GPU %d: Memory test failed: miscompares detected in the framebuffer."),
    "diagnostic": (
        88,
        "GPU %d: Diagnostic test failed: detected miscompares in the compute results.",
    ),
}


def dcgm_diag(node: Node, level: int) -> dict:
    tests = []
    for lvl in range(1, min(max(level, 1), 4) + 1):
        tests.extend(_DIAG_TESTS[lvl])
    categories: list = []
    by_cat: dict = {}
    for cat, name in tests:
        results, worst = [], "Pass"
        for gpu in node.gpus:
            if gpu["lost"]:
                continue
            result = {
                "entity_group": "GPU",
                "entity_group_id": 1,
                "entity_id": gpu["index"],
                "status": "Pass",
            }
            if node.fault_on("dcgm", gpu) and name in _DIAG_FAILURES:
                error_id, text = _DIAG_FAILURES[name]
                result["status"] = "Fail"
                result["warnings"] = [
                    {
                        "error_category": 2,
                        "error_id": error_id,
                        "error_severity": 2,
                        "warning": text % gpu["index"],
                    }
                ]
                worst = "Fail"
            results.append(result)
        test = {"name": name, "results": results, "test_summary": {"status": worst}}
        if cat not in by_cat:
            by_cat[cat] = {"category": cat, "tests": []}
            categories.append(by_cat[cat])
        by_cat[cat]["tests"].append(test)
    return {
        "DCGM Diagnostic": {"test_categories": categories},
        "entity_groups": [
            {
                "entity_group": "GPU",
                "entity_group_id": 1,
                "entities": [
                    {
                        "entity_id": g["index"],
                        "device_id": node.device_id,
                        "serial_num": g["serial"],
                    }
                    for g in node.gpus
                    if not g["lost"]
                ],
            }
        ],
        "metadata": {"version": DCGM_VERSION, "Driver Version Detected": DRIVER_VERSION},
    }


def _diag_text(diag: dict) -> str:
    rows = ["+---------------------------+------------------------------------------------+"]
    rows.append("| Diagnostic                | Result                                         |")
    rows.append("+===========================+================================================+")
    meta = diag["metadata"]
    rows.append("|-----  Metadata  ----------+------------------------------------------------|")
    rows.append(_cells("DCGM Version", meta["version"], 25, 46))
    rows.append(_cells("Driver Version Detected", meta["Driver Version Detected"], 25, 46))
    for cat in diag["DCGM Diagnostic"]["test_categories"]:
        rows.append(("+-----  {}  ".format(cat["category"])).ljust(28, "-") + "+" + "-" * 48 + "+")
        for test in cat["tests"]:
            rows.append(_cells(test["name"], test["test_summary"]["status"], 25, 46))
            for r in test["results"]:
                rows.append(_cells("", f"GPU{r['entity_id']}: {r['status']}", 25, 46))
                for w in r.get("warnings", []):
                    rows.append(_cells("", "Warning: " + w["warning"][:37], 25, 46))
    rows.append("+---------------------------+------------------------------------------------+")
    return "\n".join(rows) + "\n"


def dcgm_health(node: Node) -> dict:
    body: dict = {}
    overall = "Healthy"
    for gpu in node.gpus:
        e = node.ecc(gpu)
        if not e["uncorrectable"]:
            continue
        message = (
            f"Detected {e['uncorrectable']} volatile double-bit ECC error(s) in GPU {gpu['index']}."
        )
        gpus = body.setdefault("GPU", {"children": {}})
        gpus["children"][str(gpu["index"])] = {
            "children": {
                "Errors": {
                    "children": {"Memory system": {"overflow": [message], "value": "Failure"}}
                }
            },
            "value": "Failure",
        }
        overall = "Failure"
    body["Overall Health"] = {"value": overall}
    return {"body": body, "header": ["Health Monitor Report"]}


def _health_text(health: dict) -> str:
    rows = [
        "+----------------------------+---------------------------------------------------------+"
    ]
    rows.append("| Health Monitor Report" + " " * 66 + "|")
    rows.append(
        "+============================+=========================================================+"
    )
    body = health["body"]
    rows.append(_cells("Overall Health", body["Overall Health"]["value"], 26, 55))
    for ent_id, ent in body.get("GPU", {}).get("children", {}).items():
        rows.append(_cells("GPU", "", 26, 55))
        rows.append(_cells("-> " + ent_id, ent["value"], 26, 55))
        for system, node in ent["children"]["Errors"]["children"].items():
            rows.append(_cells("   -> " + system, node["value"], 26, 55))
            for line in node["overflow"]:
                rows.append(_cells("", line[:55], 26, 55))
    rows.append(
        "+----------------------------+---------------------------------------------------------+"
    )
    return "\n".join(rows) + "\n"


def main_dcgmi(argv: list[str], script: str) -> int:
    node = Node(node_dir_for(script))
    as_json = "-j" in argv or "--json" in argv
    args = [a for a in argv if a not in ("-j", "--json")]
    if not args:
        sys.stdout.write("Usage: dcgmi <subsystem> [options]\n")
        return 2
    sub = args[0]
    if sub == "diag":
        level = 1
        for i, a in enumerate(args):
            if a in ("-r", "--run") and i + 1 < len(args):
                try:
                    level = int(args[i + 1])
                except ValueError:
                    sys.stdout.write("Error: only run levels 1-4 are supported by the shim.\n")
                    return 2
        diag = dcgm_diag(node, level)
        sys.stdout.write(
            json.dumps(diag, indent=3, sort_keys=True) + "\n" if as_json else _diag_text(diag)
        )
        failed = any(
            t["test_summary"]["status"] == "Fail"
            for c in diag["DCGM Diagnostic"]["test_categories"]
            for t in c["tests"]
        )
        return 1 if failed else 0
    if sub == "health":
        if "-s" in args:
            sys.stdout.write("Health monitor systems set successfully.\n")
            return 0
        if "-c" in args or "--check" in args:
            health = dcgm_health(node)
            sys.stdout.write(
                json.dumps(health, indent=3, sort_keys=True) + "\n"
                if as_json
                else _health_text(health)
            )
            return 0
    if sub == "discovery" and ("-l" in args or "--list" in args):
        lines = [f"{len(node.gpus)} GPU{'' if len(node.gpus) == 1 else 's'} found."]
        sep = "+--------+" + "-" * 70 + "+"
        lines += [sep, "| GPU ID | Device Information" + " " * 51 + "|", sep]
        for g in node.gpus:
            lines.append(_cells(str(g["index"]), "Name: " + node.name, 6, 68))
            lines.append(_cells("", "PCI Bus ID: " + g["bus_id"], 6, 68))
            lines.append(_cells("", "Device UUID: " + g["uuid"], 6, 68))
            lines.append(sep)
        sys.stdout.write("\n".join(lines) + "\n")
        return 0
    if sub in ("-v", "--version"):
        sys.stdout.write(f"Version : {DCGM_VERSION}\n")
        return 0
    sys.stdout.write(
        "Error: the mtc device shim does not emulate 'dcgmi {}'.\n".format(" ".join(args))
    )
    return 2


# --- mtc-gpu-check ---------------------------------------------------------------------------


def load_agent():
    """Import mtc_agent.py by path: $MTC_AGENT_PATH, next to this file, or one level up."""
    import importlib.util

    here = os.path.dirname(os.path.realpath(__file__))
    candidates = [
        os.environ.get("MTC_AGENT_PATH") or "",
        os.path.join(here, "mtc_agent.py"),
        os.path.join(os.path.dirname(here), "mtc_agent.py"),
        os.path.join(os.path.dirname(here), "agent", "mtc_agent.py"),  # node/shim -> node/agent
    ]
    for path in candidates:
        if path and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("mtc_agent", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise RuntimeError(
        "mtc_agent.py not found (looked in: {})".format(", ".join(c for c in candidates if c))
    )


def main_gpu_check(argv: list[str], script: str) -> int:
    """``mtc-gpu-check [--size N] [--seed S] [--bench]``: per GPU, the checksum of the agent's
    deterministic computation (or, with --bench, its speed), as one JSON object."""
    size, seed, bench = 64, 1, False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--size", "--seed") and i + 1 < len(argv):
            if arg == "--size":
                size = int(argv[i + 1])
            else:
                seed = int(argv[i + 1])
            i += 1
        elif arg == "--bench":
            bench = True
        else:
            sys.stderr.write("usage: mtc-gpu-check [--size N] [--seed S] [--bench]\n")
            return 2
        i += 1
    node = Node(node_dir_for(script))
    agent = load_agent()
    gpus = [g for g in node.gpus if not g["lost"]]
    out = {"tool": "mtc-gpu-check", "emulated": node.emulated, "size": size, "gpus": len(gpus)}
    if bench:
        a, b = agent.deterministic_matrices(size, 7)
        start = time.perf_counter()
        agent.matmul(a, b)
        elapsed = max(time.perf_counter() - start, 1e-9)
        out.update(
            {"elapsed_s": round(elapsed, 6), "gflops": round(2.0 * size**3 / elapsed / 1e9, 6)}
        )
    else:
        product = agent.deterministic_product(size, seed)
        good = agent.checksum_matrix(product)
        results = []
        for gpu in gpus:
            checksum = good
            if node.fault_on("sdc", gpu):
                checksum = agent.checksum_matrix(agent.flip_one_bit(product))
            results.append({"gpu": gpu["index"], "uuid": gpu["uuid"], "checksum": checksum})
        out.update({"algorithm": agent.ALGORITHM, "seed": seed, "results": results})
    sys.stdout.write(json.dumps(out) + "\n")
    return 0
