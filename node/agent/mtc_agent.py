#!/usr/bin/env python3
"""mtc node health agent: runs health checks on a node and reports them as JSON.

Stdlib only, one file, any python3 >= 3.8, so it can be copied onto any node.

    python3 mtc_agent.py --node NAME [--config FILE.json] [--once | --interval SECONDS]
        [--checks disk,gpu,ecc,xid,dcgm,speed,correctness]
        [--report-url URL (--token TOKEN | --token-file FILE | $MTC_AGENT_TOKEN)]
        [--output FILE] [--state-file FILE] [--slurm-drain]
        [--dcgm-level 0-4] [--trigger periodic|healthcheck|prolog|suspicion|post-repair|...]

Each check runs under a time budget and yields
``{"name", "status", "duration_s", "budget_s", "details", "findings"}`` where status is one of
pass/warn/fail/skip/error and each finding is ``{"code", "message", "severity", "gpu"}``
(severity critical|warning, gpu an index or null). The report is
``{"node", "time", "agent_version", "checks"}``; it goes to stdout as one JSON line per round,
to ``--output`` (written atomically), and to ``--report-url`` (POST, bearer token).

Exit status (``--once``): 0 when every check passed, warned or was skipped, 1 when any check
failed (a critical finding), 2 when a check could not run (error/timeout) or on a usage error.
Reporting problems are logged to stderr and do not change the exit status.

As Slurm's HealthCheckProgram or in a prolog/epilog, ``--slurm-drain`` drains the node on a
critical finding: ``scontrol update NodeName=<node> State=DRAIN Reason="mtc: <codes>"`` (a node
already drained, by mtc or by a person, keeps its reason).

The DCGM level follows the trigger (``--dcgm-level``, else the config's ``dcgm_level``): level 1
is light enough to run beside jobs (HealthCheckProgram, prolog, periodic rounds); levels 2-3 are
for a node under suspicion or one about to return to service. In ``--interval`` mode the server
may ask for one deeper round in its answer to a report: ``{"next_round": {"dcgm_level": 2,
"reason": "..."}}``. ``--trigger`` names why a round ran; it is kept in the dcgm check's details.
"""

from __future__ import annotations

import argparse
import csv
import json
import operator
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse

# hashlib and urllib.request load OpenSSL (~10 ms): the builtin digests, and urllib.request
# where a report is sent, so a HealthCheckProgram round (slurmd waits for it before the
# node registers) starts in a few ms.
try:
    from _sha1 import sha1
    from _sha256 import sha256
except ImportError:  # Pythons that name them otherwise (3.12: _sha2)
    from hashlib import sha1, sha256

AGENT_VERSION = 1
CHECK_NAMES = ("disk", "gpu", "ecc", "xid", "dcgm", "speed", "correctness", "host")

DEFAULT_CONFIG = {
    "node": None,
    "expected_gpus": None,  # None: unknown (no GPU_MISSING unless nvidia-smi says so)
    "disk_paths": ["/"],
    "disk_min_free_pct": 5.0,
    "disk_min_free_gb": 1.0,  # GiB (2**30 bytes)
    "kernel_log": None,  # a file; else `dmesg --ctime`, else `journalctl -k`
    "path_prepend": None,  # a directory (or list) put first on PATH for tool lookups
    "dcgm_level": 1,
    "speed_size": 96,
    "speed_seconds": 0.3,  # how long the timed matmul repeats
    "correctness_size": 64,
    "correctness_seed": 1,
    "budgets": {},
    "state_file": None,
    "report_url": None,
    "token": None,
    "report_retries": 5,
    "report_backoff_s": 1.0,
    "report_timeout_s": 10.0,
}
DEFAULT_BUDGETS = {
    "disk": 10.0,
    "gpu": 30.0,
    "ecc": 30.0,
    "xid": 20.0,
    "speed": 10.0,
    "correctness": 60.0,
    "host": 5.0,
}
# dcgmi diag -r 1 takes seconds, -r 2 a few minutes, -r 3 tens of minutes.
DCGM_BUDGET_BY_LEVEL = {1: 120.0, 2: 900.0, 3: 3600.0, 4: 7200.0}

# Finding codes.
DISK_FULL = "DISK_FULL"
GPU_MISSING = "GPU_MISSING"
GPU_FELL_OFF_BUS = "GPU_FELL_OFF_BUS"
GPU_ECC_UNCORRECTABLE = "GPU_ECC_UNCORRECTABLE"
GPU_ROW_REMAP_FAILURE = "GPU_ROW_REMAP_FAILURE"
GPU_ROW_REMAP_PENDING = "GPU_ROW_REMAP_PENDING"
DCGM_DIAG_FAILED = "DCGM_DIAG_FAILED"
DCGM_HEALTH_WARNING = "DCGM_HEALTH_WARNING"
DCGM_HEALTH_FAILURE = "DCGM_HEALTH_FAILURE"
SILENT_DATA_CORRUPTION = "SILENT_DATA_CORRUPTION"
CHECK_TIMEOUT = "CHECK_TIMEOUT"
# XID findings are "XID_<n>".

CRITICAL = "critical"
WARNING = "warning"

# XID meanings and severities, judged from NVIDIA's "XID Errors" documentation.
# critical: the GPU needs a reset/reboot or service; drain the node.
# warning: usually the application's own fault (13, 31, 43, 45) or a recoverable event to watch.
#   code  meaning                                                   severity
#   13    Graphics engine exception (usually an application error)  warning
#   31    GPU memory page fault (usually an application error)      warning
#   43    GPU stopped processing (application fault)                warning
#   45    Preemptive cleanup after a previous error                 warning
#   48    Double-bit ECC error (DBE)                                critical
#   61    Internal micro-controller breakpoint/warning              critical
#   62    Internal micro-controller halt                            critical
#   63    ECC page retirement / row remapping recorded              warning  (reset to apply)
#   64    ECC page retirement / row remapping recording failure     critical
#   74    NVLink error                                              critical
#   79    GPU has fallen off the bus                                critical
#   92    High single-bit ECC error rate                            warning  (correctable)
#   94    Contained ECC error (the GPU needs a reset)               critical
#   95    Uncontained ECC error                                     critical
#   119   GSP RPC timeout                                           critical
#   120   GSP error                                                 critical
#   140   Unrecovered ECC error                                     critical
# Any other XID is reported as a warning with "unlisted XID".
XID_TABLE = {
    13: ("graphics engine exception (usually an application error)", WARNING),
    31: ("GPU memory page fault (usually an application error)", WARNING),
    43: ("GPU stopped processing (application fault)", WARNING),
    45: ("preemptive cleanup after a previous error", WARNING),
    48: ("double-bit ECC error", CRITICAL),
    61: ("internal micro-controller breakpoint/warning", CRITICAL),
    62: ("internal micro-controller halt", CRITICAL),
    63: ("row remapping / page retirement recorded; reset the GPU to apply", WARNING),
    64: ("row remapping / page retirement recording failure", CRITICAL),
    74: ("NVLink error", CRITICAL),
    79: ("GPU has fallen off the bus", CRITICAL),
    92: ("high single-bit ECC error rate", WARNING),
    94: ("contained ECC error; the GPU needs a reset", CRITICAL),
    95: ("uncontained ECC error", CRITICAL),
    119: ("GSP RPC timeout", CRITICAL),
    120: ("GSP error", CRITICAL),
    140: ("unrecovered ECC error", CRITICAL),
}

KERNEL_LOG_TAIL_BYTES = 8 * 1024 * 1024
MAX_LISTED = 20  # lines/items kept in details


def log(message: str) -> None:
    sys.stderr.write(f"mtc-agent: {message}\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------------------------
# Deterministic computations (speed and correctness; mtc-gpu-check imports these)
# --------------------------------------------------------------------------------------------

# Changes whenever deterministic_product or checksum_matrix changes, so a stale tool copy
# shows up as a mismatched algorithm instead of as silent data corruption.
ALGORITHM = "xorshift32-int8-matmul-sha256/1"
# Known-good checksums, recorded once from exact integer arithmetic (and checked against
# matmul_ikj by the tests): "size:seed" -> sha256 of the product.
REFERENCE_CHECKSUMS = {
    "64:1": "6eb39595e4702d0d96e398cd8df5521da5b74e4086ee7ca18b709cd05d9f6806",
}


def _xorshift32(seed: int):
    x = (seed * 2654435761 + 0x9E3779B9) & 0xFFFFFFFF or 1
    while True:
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        yield x


def deterministic_matrices(size: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Two size x size matrices of int8 values from a seeded xorshift32 stream."""
    gen = _xorshift32(seed)
    a = [[(next(gen) & 0xFF) - 128 for _ in range(size)] for _ in range(size)]
    b = [[(next(gen) & 0xFF) - 128 for _ in range(size)] for _ in range(size)]
    return a, b


def transpose(m: list[list]) -> list[list]:
    return [[row[j] for row in m] for j in range(len(m[0]))] if m else []


def matmul(a: list[list], b: list[list]) -> list[list]:
    """Row-by-column product (exact for ints)."""
    bt = transpose(b)
    return [[sum(map(operator.mul, row, col)) for col in bt] for row in a]


def matmul_ikj(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    """The same product by another loop order: an independent reference."""
    cols = len(b[0]) if b else 0
    out = [[0] * cols for _ in a]
    for i, row in enumerate(a):
        acc = out[i]
        for k, aik in enumerate(row):
            if aik:
                bk = b[k]
                for j in range(cols):
                    acc[j] += aik * bk[j]
    return out


def checksum_matrix(c: list[list[int]]) -> str:
    h = sha256()
    for row in c:
        h.update((",".join(map(str, row)) + "\n").encode("ascii"))
    return h.hexdigest()


def deterministic_product(size: int = 64, seed: int = 1) -> list[list[int]]:
    a, b = deterministic_matrices(size, seed)
    return matmul(a, b)


def deterministic_checksum(size: int = 64, seed: int = 1) -> str:
    """The correctness check's computation; mtc-gpu-check prints the same per GPU."""
    return checksum_matrix(deterministic_product(size, seed))


def flip_one_bit(c: list[list[int]]) -> list[list[int]]:
    """Silent data corruption, for the shim: one bit of one element flipped."""
    out = [list(row) for row in c]
    mid = len(out) // 2
    out[mid][mid] ^= 1 << 7
    return out


def reference_checksum(size: int, seed: int) -> tuple[str, str]:
    """(checksum, source): the recorded value, else a recomputation by another loop order."""
    known = REFERENCE_CHECKSUMS.get(f"{size}:{seed}")
    if known:
        return known, "recorded"
    a, b = deterministic_matrices(size, seed)
    return checksum_matrix(matmul_ikj(a, b)), "recomputed (ikj loop order)"


# --------------------------------------------------------------------------------------------
# Parsers (pure functions over tool output text)
# --------------------------------------------------------------------------------------------

_GPU_LIST_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")
_LOST_RE = re.compile(
    r"Unable to determine the device handle for (?:GPU|gpu)\s*"
    r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*:\s*(.+?)\s*$"
)
_NO_DEVICES = "No devices were found"
_DRIVER_FAILED = "NVIDIA-SMI has failed"


def parse_nvidia_smi_list(text: str) -> dict:
    """``nvidia-smi -L``: GPUs (index, name, uuid), lost GPUs, and tool-level errors.

    A lost GPU keeps its place in NVML's enumeration, so its index is its position.
    """
    gpus, lost, errors = [], [], []
    position = 0
    no_devices = False
    driver_error = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _GPU_LIST_RE.match(line)
        if m:
            index = int(m.group(1))
            gpus.append({"index": index, "name": m.group(2), "uuid": m.group(3)})
            position = index + 1
            continue
        m = _LOST_RE.search(line)
        if m:
            lost.append({"index": position, "bus_id": m.group(1), "error": m.group(2)})
            position += 1
            continue
        if line.startswith("MIG ") or line.startswith("Device "):
            continue
        if _NO_DEVICES in line:
            no_devices = True
        elif _DRIVER_FAILED in line:
            driver_error = line
        errors.append(line)
    return {
        "gpus": gpus,
        "lost": lost,
        "no_devices": no_devices,
        "driver_error": driver_error,
        "other_lines": errors[:MAX_LISTED],
    }


_KV_RE = re.compile(r"^(\s*)(\S.*?)\s+:\s?(.*)$")
_GPU_SECTION_RE = re.compile(
    r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$"
)


def parse_smi_query_tree(text: str) -> tuple[dict, list[dict], list[dict]]:
    """``nvidia-smi -q`` text -> (header, [GPU section trees], [lost GPUs]).

    Each tree is nested dicts following the indentation; leaves are the value strings. The
    GPU sections are in NVML index order.
    """
    header: dict = {}
    gpus: list[dict] = []
    lost: list[dict] = []
    stack: list[tuple[int, dict]] = [(-1, header)]
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("====="):
            continue
        stripped = raw.strip()
        m = _LOST_RE.search(stripped)
        if m:
            lost.append({"bus_id": m.group(1), "error": m.group(2), "position": len(gpus)})
            continue
        indent = len(raw) - len(raw.lstrip())
        m = _GPU_SECTION_RE.match(stripped)
        if m and indent == 0:
            section = {"_bus_id": m.group(1)}
            gpus.append(section)
            stack = [(-1, section)]
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        kv = _KV_RE.match(raw)
        if kv:
            parent[kv.group(2).strip()] = kv.group(3).strip()
        else:
            child: dict = {}
            parent[stripped] = child
            stack.append((indent, child))
    return header, gpus, lost


def _int_or_none(value) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _sum_fields(section: dict, want) -> int | None:
    """Sum the integer leaves of ``section`` whose key satisfies ``want``; None if none."""
    total, seen = 0, False
    for key, value in section.items():
        if isinstance(value, dict) or not want(key):
            continue
        n = _int_or_none(value)
        if n is not None:
            total += n
            seen = True
    return total if seen else None


def _ecc_counts(block) -> tuple[int | None, int | None]:
    """(uncorrectable, correctable) from an "ECC Errors" Volatile/Aggregate block.

    Newer drivers: "SRAM Correctable", "SRAM Uncorrectable" (or its "Parity" and "SEC-DED"
    halves), "DRAM Correctable", "DRAM Uncorrectable". Older: "Single Bit"/"Double Bit"
    sub-sections, each with a "Total".
    """
    if not isinstance(block, dict):
        return None, None
    if "Double Bit" in block or "Single Bit" in block:
        dbe = block.get("Double Bit")
        sbe = block.get("Single Bit")
        unc = _int_or_none(dbe.get("Total")) if isinstance(dbe, dict) else None
        cor = _int_or_none(sbe.get("Total")) if isinstance(sbe, dict) else None
        return unc, cor
    unc = _sum_fields(block, lambda k: "Uncorrectable" in k)
    cor = _sum_fields(block, lambda k: "Correctable" in k and "Uncorrectable" not in k)
    return unc, cor


def _yes(value) -> bool | None:
    if not isinstance(value, str):
        return None
    v = value.strip().lower()
    if v in ("yes", "true"):
        return True
    if v in ("no", "false"):
        return False
    return None


def parse_ecc(text: str) -> dict:
    """``nvidia-smi -q -d ECC,ROW_REMAPPER`` -> {"gpus": [...], "lost": [...]}.

    Per GPU: bus_id, position, ecc_mode, volatile/aggregate (un)correctable counts (None when
    N/A) and remapped_rows ({correctable, uncorrectable, pending, failure} or None when N/A).
    """
    _header, sections, lost = parse_smi_query_tree(text)
    gpus = []
    for position, section in enumerate(sections):
        ecc = section.get("ECC Errors") if isinstance(section.get("ECC Errors"), dict) else {}
        vol_unc, vol_cor = _ecc_counts(ecc.get("Volatile"))
        agg_unc, agg_cor = _ecc_counts(ecc.get("Aggregate"))
        mode = section.get("ECC Mode")
        remap = section.get("Remapped Rows")
        remapped = None
        if isinstance(remap, dict):
            remapped = {
                "correctable": _int_or_none(remap.get("Correctable Error")),
                "uncorrectable": _int_or_none(remap.get("Uncorrectable Error")),
                "pending": _yes(remap.get("Pending")),
                "failure": _yes(remap.get("Remapping Failure Occurred")),
            }
        gpus.append(
            {
                "bus_id": section["_bus_id"],
                "position": position,
                "ecc_mode": mode.get("Current") if isinstance(mode, dict) else None,
                "volatile_uncorrectable": vol_unc,
                "volatile_correctable": vol_cor,
                "aggregate_uncorrectable": agg_unc,
                "aggregate_correctable": agg_cor,
                "remapped_rows": remapped,
            }
        )
    return {"gpus": gpus, "lost": lost}


_NA_VALUES = {"n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", ""}


def _csv_value(value: str):
    v = value.strip()
    if v.lower() in _NA_VALUES:
        return None
    for unit in (" MiB", " %", " W", " MHz", " C"):
        if v.endswith(unit):
            v = v[: -len(unit)]
            break
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return value.strip()


def parse_query_gpu_csv(text: str, fields: list[str]) -> list[dict]:
    """``nvidia-smi --query-gpu=... --format=csv,noheader[,nounits]`` -> one dict per GPU.

    Lines that are not rows (e.g. "Unable to determine the device handle ...") are skipped.
    """
    rows = []
    for record in csv.reader(text.splitlines(), skipinitialspace=True):
        if len(record) != len(fields):
            continue
        row = {f: _csv_value(v) for f, v in zip(fields, record)}  # noqa: B905 (py3.8)
        if "index" in row and not isinstance(row["index"], int):
            continue
        rows.append(row)
    return rows


def parse_query_gpu_lost(text: str) -> list[dict]:
    """GPUs that ``nvidia-smi --query-gpu`` could not reach, with their index (position)."""
    lost, position = [], 0
    for line in text.splitlines():
        m = _LOST_RE.search(line)
        if m:
            lost.append({"index": position, "bus_id": m.group(1), "error": m.group(2)})
            position += 1
            continue
        first = line.split(",", 1)[0].strip()
        if first.isdigit():
            position = int(first) + 1
    return lost


def bus_key(bus_id: str) -> tuple[int, int, int] | None:
    """'00000000:3B:00.0', '0000:3b:00', 'PCI:0000:3b:00' -> (domain, bus, device)."""
    s = bus_id.strip()
    if s.upper().startswith("PCI:"):
        s = s[4:]
    parts = s.split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except ValueError:
        return None


_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):"
    r"\s*(?P<code>\d+)(?:,\s*(?P<rest>.*))?$"
)


def parse_xid_lines(text: str) -> list[dict]:
    """Kernel log lines ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., <text>``."""
    events = []
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _XID_RE.search(line)
        if not m:
            continue
        rest = m.group("rest") or ""
        rest = re.sub(r"^pid=[^,]*,\s*", "", rest)
        rest = re.sub(r"^name=[^,]*,\s*", "", rest)
        events.append(
            {"line": line, "pci": m.group("pci"), "code": int(m.group("code")), "text": rest}
        )
    return events


def _json_object(text: str) -> dict:
    """The JSON object in a tool's output (tolerates text before/after it)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in the output")
    value = json.loads(text[start : end + 1])
    if not isinstance(value, dict):
        raise ValueError("the JSON output is not an object")
    return value


def _gpu_ids(result: dict) -> list[int]:
    """GPU ids of one diag result: DCGM 4 entity_id (GPU group), DCGM 3 "gpu_ids"."""
    if "entity_id" in result:
        group = str(result.get("entity_group", "GPU")).upper()
        if group == "GPU" or result.get("entity_group_id") == 1:
            n = _int_or_none(result["entity_id"])
            return [n] if n is not None else []
        return []
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if ids is None:
        return []
    if isinstance(ids, list):
        return [n for n in (_int_or_none(i) for i in ids) if n is not None]
    return [n for n in (_int_or_none(i) for i in str(ids).split(",")) if n is not None]


def _warning_texts(result: dict) -> list[str]:
    out = []
    for w in result.get("warnings") or []:
        if isinstance(w, dict) and w.get("warning"):
            out.append(str(w["warning"]).strip())
        elif isinstance(w, str):
            out.append(w.strip())
    if isinstance(result.get("info"), str) and result.get("status", "").lower() == "fail":
        out.append(result["info"].strip())
    return out


def parse_dcgm_diag(text: str) -> dict:
    """``dcgmi diag -r N -j`` (DCGM 3 "DCGM GPU Diagnostic" and DCGM 4 "DCGM Diagnostic").

    -> {"tests": [{"name", "category", "status"}], "failed": [{"test", "category", "gpus",
    "messages"}], "runtime_error", "version"}. A test fails when any of its results (or its
    test_summary) has status "Fail".
    """
    data = _json_object(text)
    root = data.get("DCGM Diagnostic") or data.get("DCGM GPU Diagnostic")
    if not isinstance(root, dict):
        raise ValueError("no 'DCGM Diagnostic' object in the dcgmi diag output")
    tests, failed = [], []
    for category in root.get("test_categories") or []:
        cat_name = category.get("category")
        for test in category.get("tests") or []:
            name = test.get("name") or test.get("test_name") or "?"
            results = test.get("results") or []
            if isinstance(results, dict):
                results = [results]
            statuses = [str(r.get("status", "")).lower() for r in results if isinstance(r, dict)]
            summary = test.get("test_summary")
            summary_status = str(summary.get("status", "")).lower() if summary else ""
            failing = [
                r
                for r in results
                if isinstance(r, dict) and str(r.get("status", "")).lower() == "fail"
            ]
            if failing or summary_status == "fail":
                status = "Fail"
            elif "warn" in statuses or summary_status == "warn":
                status = "Warn"
            elif statuses and all(s == "skip" for s in statuses):
                status = "Skip"
            else:
                status = "Pass"
            tests.append({"name": name, "category": cat_name, "status": status})
            if status == "Fail":
                gpus, messages = [], []
                for r in failing:
                    gpus.extend(_gpu_ids(r))
                    messages.extend(_warning_texts(r))
                failed.append(
                    {
                        "test": name,
                        "category": cat_name,
                        "gpus": sorted(set(gpus)),
                        "messages": messages[:MAX_LISTED],
                    }
                )
    metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    return {
        "tests": tests,
        "failed": failed,
        "runtime_error": root.get("runtime_error") or data.get("runtime_error"),
        "version": metadata.get("version") or root.get("version"),
    }


_HEALTH_DISABLED = "Health watches not enabled"


def parse_dcgm_health(text: str) -> dict:
    """``dcgmi health -c -j`` -> {"overall", "entities": [{"group", "id", "health",
    "systems": [{"system", "health", "messages"}]}], "watches_disabled"}.

    dcgmi's JSON is its output tree: {"body": {"Overall Health": {"value": ...}, "GPU":
    {"children": {"<id>": {"value": ..., "children": {"Errors": {"children": {"<system>":
    {"value": ..., "overflow": [messages]}}}}}}}}, "header": ["Health Monitor Report"]}.
    """
    if _HEALTH_DISABLED in text and "{" not in text:
        return {"overall": None, "entities": [], "watches_disabled": True}
    data = _json_object(text)
    body = data.get("body") if isinstance(data.get("body"), dict) else data
    overall = body.get("Overall Health")
    overall = overall.get("value") if isinstance(overall, dict) else overall
    entities = []
    for group, node in body.items():
        if group == "Overall Health" or not isinstance(node, dict):
            continue
        for ent_id, ent in (node.get("children") or {}).items():
            if not isinstance(ent, dict):
                continue
            systems = []
            errors = (ent.get("children") or {}).get("Errors") or {}
            for system, sysnode in (errors.get("children") or {}).items():
                if isinstance(sysnode, dict):
                    systems.append(
                        {
                            "system": system,
                            "health": sysnode.get("value"),
                            "messages": [str(m) for m in sysnode.get("overflow") or []],
                        }
                    )
            entities.append(
                {
                    "group": group,
                    "id": _int_or_none(ent_id),
                    "health": ent.get("value"),
                    "systems": systems,
                }
            )
    return {"overall": overall, "entities": entities, "watches_disabled": False}


# --------------------------------------------------------------------------------------------
# Check machinery
# --------------------------------------------------------------------------------------------


class CheckTimeout(Exception):
    pass


class Check:
    """The running state of one check; ``result()`` is its report entry."""

    def __init__(self, name: str, budget: float) -> None:
        self.name = name
        self.budget = float(budget)
        self.start = time.monotonic()
        self.details: dict = {}
        self.findings: list[dict] = []
        self.forced: str | None = None  # "skip" or "error"
        self.duration: float | None = None

    def remaining(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def finding(self, code: str, message: str, severity: str = CRITICAL, gpu=None) -> None:
        self.findings.append({"code": code, "message": message, "severity": severity, "gpu": gpu})

    def skip(self, reason: str) -> None:
        self.forced = "skip"
        self.details["reason"] = reason

    def error(self, reason: str) -> None:
        self.forced = "error"
        self.details["error"] = reason

    def status(self) -> str:
        if any(f["severity"] == CRITICAL for f in self.findings):
            return "fail"
        if self.forced:
            return self.forced
        if self.findings:
            return "warn"
        return "pass"

    def result(self) -> dict:
        duration = self.duration
        if duration is None:
            duration = time.monotonic() - self.start
        return {
            "name": self.name,
            "status": self.status(),
            "duration_s": round(duration, 3),
            "budget_s": self.budget,
            "details": self.details,
            "findings": self.findings,
        }


def _tail(text: str, limit: int = 500) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else "..." + text[-limit:]


class Agent:
    """Configuration, tool lookup and per-round caches shared by the checks."""

    def __init__(self, config: dict) -> None:
        self.config = config
        prepend = config.get("path_prepend")
        if isinstance(prepend, str):
            prepend = [prepend]
        parts = [str(p) for p in (prepend or [])]
        self.path = os.pathsep.join(parts + [os.environ.get("PATH", os.defpath)])
        self.env = dict(os.environ, PATH=self.path)
        self.state = load_state(config.get("state_file"))
        self.pending_state: dict = {}
        # Per round: the DCGM diag level and why this round ran (see main()).
        self.dcgm_level = int(config.get("dcgm_level") or 0)
        self.trigger = str(config.get("trigger") or "periodic")
        self._gpu_rows: list[dict] | None = None
        self._lost_rows: list[dict] = []

    def begin_round(self) -> None:
        self._gpu_rows = None
        self._lost_rows = []
        self.pending_state = json.loads(json.dumps(self.state))

    def commit_state(self) -> None:
        self.state = self.pending_state
        path = self.config.get("state_file")
        if path:
            try:
                write_atomic(path, json.dumps(self.state, indent=1, sort_keys=True) + "\n")
            except OSError as exc:
                log(f"cannot write state file {path}: {exc}")

    def budget(self, name: str) -> float:
        budgets = self.config.get("budgets") or {}
        if name in budgets:
            return float(budgets[name])
        if name == "dcgm":
            level = self.dcgm_level or 1
            return DCGM_BUDGET_BY_LEVEL.get(level, DCGM_BUDGET_BY_LEVEL[4])
        return DEFAULT_BUDGETS[name]

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.path)

    def run(self, check: Check, args: list[str]) -> subprocess.CompletedProcess:
        """Run a command (argument list) within what is left of the check's budget.

        The command gets its own process group, killed as a whole on timeout, so that a hung
        tool's children cannot keep its output pipes (and the agent) waiting.
        """
        timeout = check.remaining()
        if timeout <= 0:
            raise CheckTimeout(f"no budget left to run {os.path.basename(args[0])}")
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=self.env,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                proc.communicate(timeout=2)
            except subprocess.TimeoutExpired:
                pass  # e.g. stuck in the kernel on a dead GPU; leave it behind
            raise CheckTimeout(
                f"{' '.join(args)} did not finish within the {check.budget:.1f}s budget"
            ) from None
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    # nvidia-smi --query-gpu field -> key in the report's gpu telemetry
    QUERY_FIELDS = {
        "index": "index",
        "pci.bus_id": "bus_id",
        "uuid": "uuid",
        "name": "name",
        "utilization.gpu": "utilization_pct",
        "memory.used": "memory_used_mib",
        "memory.total": "memory_total_mib",
        "temperature.gpu": "temperature_c",
        "power.draw": "power_w",
        "ecc.errors.uncorrected.volatile.total": "ecc_uncorrected_volatile",
    }
    # A figure nvidia-smi cannot give (e.g. "[GPU requires reset]") is reported as null: mtc
    # takes a number or null there.
    NUMERIC_FIELDS = frozenset(list(QUERY_FIELDS)[4:])

    def gpu_rows(self, check: Check) -> list[dict]:
        """One ``nvidia-smi --query-gpu`` per round: index, bus id, uuid and telemetry."""
        if self._gpu_rows is None:
            rows: list[dict] = []
            smi = self.which("nvidia-smi")
            if smi:
                proc = self.run(
                    check,
                    [
                        smi,
                        "--query-gpu=" + ",".join(self.QUERY_FIELDS),
                        "--format=csv,noheader,nounits",
                    ],
                )
                fields = list(self.QUERY_FIELDS)
                rows = [
                    {
                        self.QUERY_FIELDS[f]: (
                            None if f in self.NUMERIC_FIELDS and isinstance(v, str) else v
                        )
                        for f, v in row.items()
                    }
                    for row in parse_query_gpu_csv(proc.stdout, fields)
                ]
                self._lost_rows = parse_query_gpu_lost(proc.stdout)
            self._gpu_rows = rows
        return self._gpu_rows

    def bus_index_map(self, check: Check) -> dict:
        out = {}
        for row in self.gpu_rows(check) + self._lost_rows:
            key = bus_key(str(row.get("bus_id") or ""))
            if key is not None:
                out[key] = row["index"]
        return out


# --------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------

GIB = float(2**30)


def _tree_size(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def check_disk(agent: Agent, chk: Check) -> None:
    cfg = agent.config
    min_pct = float(cfg.get("disk_min_free_pct", 5.0))
    min_gb = float(cfg.get("disk_min_free_gb", 1.0))
    paths = cfg.get("disk_paths") or ["/"]
    chk.details["min_free_pct"] = min_pct
    chk.details["min_free_gb"] = min_gb
    chk.details["paths"] = per_path = {}
    failures = []
    # Emulated nodes share the host's disk; a path with a configured capacity is measured
    # by what its files take up against that capacity instead.
    capacities = cfg.get("disk_capacity_gb") or {}
    for path in paths:
        try:
            if path in capacities:
                total = float(capacities[path]) * GIB
                free = max(0.0, total - _tree_size(path))
            else:
                st = os.statvfs(path)
                total = st.f_blocks * st.f_frsize
                free = st.f_bavail * st.f_frsize
        except OSError as exc:
            per_path[path] = {"error": str(exc)}
            failures.append(f"{path}: {exc}")
            continue
        free_gb = free / GIB
        free_pct = 100.0 * free / total if total else 0.0
        per_path[path] = {
            "free_gb": round(free_gb, 3),
            "free_pct": round(free_pct, 2),
            "total_gb": round(total / GIB, 3),
        }
        if path in capacities:
            per_path[path]["emulated_capacity"] = True
        if free_pct < min_pct or free_gb < min_gb:
            chk.finding(
                DISK_FULL,
                f"{path}: {free_gb:.2f} GiB free ({free_pct:.1f}%), "
                f"below the {min_gb:.2f} GiB / {min_pct:.1f}% minimum",
            )
    if failures:
        chk.error("; ".join(failures))


def check_gpu(agent: Agent, chk: Check) -> None:
    expected = agent.config.get("expected_gpus")
    expected = int(expected) if expected is not None else None
    chk.details["expected"] = expected
    smi = agent.which("nvidia-smi")
    if not smi:
        if expected:
            chk.details["count"] = 0
            chk.finding(GPU_MISSING, f"nvidia-smi not found; {expected} GPUs expected")
        else:
            chk.skip("nvidia-smi not found and no GPUs expected")
        return
    proc = agent.run(chk, [smi, "-L"])
    parsed = parse_nvidia_smi_list(proc.stdout + "\n" + proc.stderr)
    gpus, lost = parsed["gpus"], parsed["lost"]
    chk.details.update(
        {"count": len(gpus), "gpus": gpus, "lost": lost, "nvidia_smi": smi, "rc": proc.returncode}
    )
    for item in lost:
        chk.finding(
            GPU_FELL_OFF_BUS,
            f"GPU {item['index']} ({item['bus_id']}) is unreachable: {item['error']}",
            gpu=item["index"],
        )
    if parsed["no_devices"] and expected:
        chk.finding(
            GPU_FELL_OFF_BUS, f"nvidia-smi: No devices were found ({expected} GPUs expected)"
        )
    elif expected is not None and len(gpus) + len(lost) < expected:
        # e.g. "NVIDIA-SMI has failed ...", "Failed to initialize NVML: Driver/library version
        # mismatch": keep nvidia-smi's own words when it lists nothing.
        said = parsed["driver_error"] or (parsed["other_lines"] or [""])[0]
        chk.finding(
            GPU_MISSING,
            f"{len(gpus) + len(lost)} of {expected} expected GPUs visible to nvidia-smi"
            + (f": {said}" if said and not gpus else ""),
        )
    elif proc.returncode != 0 and not gpus and not lost:
        chk.error(f"nvidia-smi -L exited {proc.returncode}: {_tail(proc.stderr or proc.stdout)}")
    if gpus:
        chk.details["telemetry"] = agent.gpu_rows(chk)


def check_ecc(agent: Agent, chk: Check) -> None:
    smi = agent.which("nvidia-smi")
    if not smi:
        chk.skip("nvidia-smi not found")
        return
    proc = agent.run(chk, [smi, "-q", "-d", "ECC,ROW_REMAPPER"])
    parsed = parse_ecc(proc.stdout)
    if not parsed["gpus"]:
        if proc.returncode != 0 and not parsed["lost"]:
            chk.error(f"nvidia-smi -q exited {proc.returncode}: {_tail(proc.stderr)}")
        else:
            chk.skip("no GPUs in the nvidia-smi -q output")
        chk.details["unreachable"] = parsed["lost"]
        return
    busmap = agent.bus_index_map(chk)
    out = []
    for g in parsed["gpus"]:
        key = bus_key(g["bus_id"])
        index = busmap.get(key, g["position"]) if key else g["position"]
        entry = dict(g, index=index)
        entry.pop("position", None)
        out.append(entry)
        unc = g["volatile_uncorrectable"]
        if unc:
            chk.finding(
                GPU_ECC_UNCORRECTABLE,
                f"GPU {index} ({g['bus_id']}): {unc} volatile uncorrectable ECC error(s)",
                gpu=index,
            )
        remap = g["remapped_rows"] or {}
        if remap.get("failure"):
            chk.finding(
                GPU_ROW_REMAP_FAILURE,
                f"GPU {index} ({g['bus_id']}): row remapping failure occurred",
                gpu=index,
            )
        if remap.get("pending"):
            chk.finding(
                GPU_ROW_REMAP_PENDING,
                f"GPU {index} ({g['bus_id']}): row remapping pending; reset the GPU to apply",
                WARNING,
                gpu=index,
            )
    chk.details["gpus"] = out
    if parsed["lost"]:
        chk.details["unreachable"] = parsed["lost"]


def _read_kernel_log(agent: Agent, chk: Check) -> tuple[str | None, str]:
    """(text, source); text None when no kernel log is readable (source says why)."""
    path = agent.config.get("kernel_log")
    if path:
        try:
            with open(path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - KERNEL_LOG_TAIL_BYTES))
                return fh.read().decode("utf-8", "replace"), path
        except FileNotFoundError:
            chk.details["missing"] = True
            return "", path  # an emulated node's log exists once something is written to it
        except OSError as exc:
            return None, f"{path}: {exc}"
    dmesg = agent.which("dmesg")
    if dmesg:
        # Not --ctime: those wall-clock stamps are recomputed on every call and can shift by a
        # second, which would make an old line look new. Seconds since boot are stable.
        proc = agent.run(chk, [dmesg])
        if proc.returncode == 0:
            return proc.stdout, "dmesg"
    journalctl = agent.which("journalctl")
    if journalctl:
        proc = agent.run(
            chk, [journalctl, "-k", "-b", "--no-pager", "-o", "short-iso", "-n", "50000"]
        )
        denied = any(
            marker in proc.stderr
            for marker in ("insufficient permissions", "No journal files", "not seeing messages")
        )
        if proc.returncode == 0 and not denied:
            return proc.stdout, "journalctl -k"
    return None, "no readable kernel log (dmesg needs privileges; no kernel_log configured)"


def _line_key(line: str) -> str:
    return sha1(line.encode("utf-8", "replace")).hexdigest()[:20]


def check_xid(agent: Agent, chk: Check) -> None:
    text, source = _read_kernel_log(agent, chk)
    chk.details["source"] = source
    if text is None:
        chk.skip(source)
        return
    events = parse_xid_lines(text)
    counts: dict = {}
    for ev in events:
        key = _line_key(ev["line"])
        counts[key] = counts.get(key, 0) + 1
    seen = agent.state.get("xid_seen") or {}
    # A line seen c times now and p times before has max(0, c - p) new occurrences. Lines
    # no longer in the log (rotation, reboot) are forgotten.
    budget = {k: max(0, c - int(seen.get(k, 0))) for k, c in counts.items()}
    new = []
    for ev in reversed(events):  # the newest occurrences of a line are the new ones
        key = _line_key(ev["line"])
        if budget[key] > 0:
            budget[key] -= 1
            new.append(ev)
    new.reverse()
    agent.pending_state["xid_seen"] = counts
    chk.details["xid_lines_total"] = len(events)
    chk.details["new"] = [ev["line"] for ev in new[-MAX_LISTED:]]
    chk.details["new_count"] = len(new)
    if not new:
        return
    busmap = agent.bus_index_map(chk) if agent.which("nvidia-smi") else {}
    groups: dict = {}
    for ev in new:
        groups.setdefault((ev["code"], ev["pci"]), []).append(ev)
    by_code: dict = {}
    for (code, pci), evs in sorted(groups.items()):
        by_code[str(code)] = by_code.get(str(code), 0) + len(evs)
        meaning, severity = XID_TABLE.get(code, ("unlisted XID", WARNING))
        key = bus_key(pci)
        gpu = busmap.get(key) if key else None
        where = f"GPU {gpu} (PCI:{pci})" if gpu is not None else f"PCI:{pci}"
        times = f" x{len(evs)}" if len(evs) > 1 else ""
        last = evs[-1]["text"]
        if last.rstrip(".").lower() == meaning.lower():
            last = ""
        chk.finding(
            f"XID_{code}",
            f"Xid {code} on {where}{times}: {meaning}" + (f" ({last})" if last else ""),
            severity,
            gpu=gpu,
        )
    chk.details["new_by_code"] = by_code


def check_dcgm(agent: Agent, chk: Check) -> None:
    level = agent.dcgm_level
    chk.details["level"] = level
    chk.details["trigger"] = agent.trigger
    dcgmi = agent.which("dcgmi")
    if not dcgmi:
        chk.skip("dcgmi not found")
        return
    if level <= 0:
        chk.skip("dcgm_level is 0")
        return
    proc = agent.run(chk, [dcgmi, "diag", "-r", str(level), "-j"])
    output = proc.stdout + proc.stderr
    if "{" not in proc.stdout and (
        "host engine" in output.lower() or "unable to establish a connection" in output.lower()
    ):
        chk.skip(f"DCGM host engine not reachable: {_tail(output, 200)}")
        return
    try:
        diag = parse_dcgm_diag(proc.stdout)
    except ValueError as exc:
        chk.error(f"dcgmi diag -r {level}: {exc} (exit {proc.returncode}): {_tail(output)}")
        return
    chk.details["diag"] = {
        "version": diag["version"],
        "tests": diag["tests"],
        "failed": diag["failed"],
    }
    if diag["runtime_error"]:
        chk.error(f"dcgmi diag: {diag['runtime_error']}")
    by_gpu: dict = {}
    for f in diag["failed"]:
        for gpu in f["gpus"] or [None]:
            by_gpu.setdefault(gpu, []).append(f)
    for gpu, fails in sorted(by_gpu.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        names = ", ".join(f["test"] for f in fails)
        messages = "; ".join(m for f in fails for m in f["messages"])[:400]
        where = f"GPU {gpu}" if gpu is not None else "node"
        chk.finding(
            DCGM_DIAG_FAILED,
            f"dcgmi diag -r {level} failed on {where}: {names}"
            + (f" ({messages})" if messages else ""),
            gpu=gpu,
        )

    proc = agent.run(chk, [dcgmi, "health", "-c", "-j"])
    try:
        health = parse_dcgm_health(proc.stdout + proc.stderr)
    except ValueError as exc:
        chk.details["health_error"] = f"{exc}: {_tail(proc.stdout + proc.stderr, 200)}"
        return
    if health["watches_disabled"]:
        # Health watches are per host engine; enable them so the next round has data.
        agent.run(chk, [dcgmi, "health", "-s", "a"])
        chk.details["health"] = {"overall": None, "note": "health watches were off; enabled now"}
        return
    chk.details["health"] = {"overall": health["overall"], "entities": health["entities"]}
    reported = False
    for ent in health["entities"]:
        value = str(ent["health"] or "")
        if value in ("Healthy", ""):
            continue
        code, severity = _health_code(value)
        systems = "; ".join(_system_summary(s) for s in ent["systems"])
        chk.finding(
            code,
            f"dcgmi health: {ent['group']} {ent['id']} is {value}"
            + (f" ({systems})" if systems else ""),
            severity,
            gpu=ent["id"] if ent["group"] == "GPU" else None,
        )
        reported = True
    overall = str(health["overall"] or "Healthy")
    if overall != "Healthy" and not reported:
        code, severity = _health_code(overall)
        chk.finding(code, f"dcgmi health: overall health is {overall}", severity)


def _health_code(value: str) -> tuple[str, str]:
    if value == "Warning":
        return DCGM_HEALTH_WARNING, WARNING
    return DCGM_HEALTH_FAILURE, CRITICAL


def _system_summary(system: dict) -> str:
    text = f"{system['system']}: {system['health']}"
    return text + (" - " + " ".join(system["messages"]) if system["messages"] else "")


def _float_matrices(size: int) -> tuple[list[list[float]], list[list[float]]]:
    a, b = deterministic_matrices(size, 7)
    return [[x / 128.0 for x in row] for row in a], [[x / 128.0 for x in row] for row in b]


# SIGCONTs this process received: each means it had been stopped (SIGSTOP), as the local
# provider's `slow` fault does to a node's processes on a duty cycle. Counted by a handler
# main() sets (only the main thread can); the checks' threads block the signal, so it
# wakes the main thread from its wait at once.
_continued = [0]


def _count_continue(signum, frame) -> None:
    _continued[0] += 1


def check_speed(agent: Agent, chk: Check) -> None:
    """A matrix multiply's rate per second of this thread's CPU time, not of wall time: a
    busy host (other processes taking the cores, as the emulated nodes and the control
    plane do on one machine) preempts the loop and stretches wall time alone, and read as
    a slow node it had healthy nodes rebooted. Time the process spent stopped counts in
    full (wall time), as a slower machine's would."""
    size = int(agent.config.get("speed_size") or 96)
    target = float(agent.config.get("speed_seconds") or 0.3)
    a, b = _float_matrices(size)
    iterations = 0
    stops = _continued[0]
    start, cpu_start = time.perf_counter(), time.thread_time()
    while True:
        matmul(a, b)
        iterations += 1
        elapsed = time.perf_counter() - start
        if elapsed >= target or elapsed >= chk.remaining() / 2:
            break
    cpu = time.thread_time() - cpu_start
    time.sleep(0.01)  # the GIL to the main thread, for a SIGCONT that ended the loop
    stopped = _continued[0] != stops
    measured = elapsed if stopped else max(cpu, 1e-6)
    flops = 2.0 * size**3 * iterations
    chk.details.update(
        {
            "method": f"pure-python matmul (float), per {'wall' if stopped else 'CPU'} second",
            "size": size,
            "iterations": iterations,
            "elapsed_s": round(elapsed, 4),
            "cpu_s": round(cpu, 4),
            "stopped": stopped,
            "gflops": round(flops / measured / 1e9, 6),
        }
    )
    tool = agent.which("mtc-gpu-check")
    if tool:
        started = time.perf_counter()
        proc = agent.run(chk, [tool, "--bench", "--size", str(size)])
        wall = time.perf_counter() - started
        try:
            out = _json_object(proc.stdout)
            chk.details["gpu_tool"] = {
                "tool": tool,
                "wall_s": round(wall, 4),
                "gflops": out.get("gflops"),
                "emulated": out.get("emulated"),
                "gpus": out.get("gpus"),
            }
        except ValueError as exc:
            chk.details["gpu_tool"] = {"tool": tool, "error": f"{exc}: {_tail(proc.stderr, 200)}"}


def check_correctness(agent: Agent, chk: Check) -> None:
    size = int(agent.config.get("correctness_size") or 64)
    seed = int(agent.config.get("correctness_seed") or 1)
    reference, source = reference_checksum(size, seed)
    cpu = deterministic_checksum(size, seed)
    chk.details.update(
        {
            "algorithm": ALGORITHM,
            "size": size,
            "seed": seed,
            "reference": reference,
            "reference_source": source,
            "cpu": cpu,
        }
    )
    if cpu != reference:
        chk.finding(
            SILENT_DATA_CORRUPTION,
            f"CPU result of the {size}x{size} check differs from the reference",
        )
    tool = agent.which("mtc-gpu-check")
    if not tool:
        chk.details["gpu_tool"] = None
        return
    proc = agent.run(chk, [tool, "--size", str(size), "--seed", str(seed)])
    try:
        out = _json_object(proc.stdout)
    except ValueError as exc:
        chk.error(f"mtc-gpu-check exited {proc.returncode}: {exc} {_tail(proc.stderr, 200)}")
        return
    if out.get("algorithm") != ALGORITHM:
        chk.error("mtc-gpu-check runs {!r}, the agent {!r}".format(out.get("algorithm"), ALGORITHM))
        return
    results = out.get("results") or []
    chk.details["gpu_tool"] = {"tool": tool, "emulated": out.get("emulated"), "results": results}
    for r in results:
        if r.get("checksum") != reference:
            gpu = r.get("gpu")
            chk.finding(
                SILENT_DATA_CORRUPTION,
                f"GPU {gpu}: checksum of the {size}x{size} check differs from the reference",
                gpu=gpu,
            )


def _proc_cpu() -> tuple[int, int]:
    """(busy, total) jiffies from the first line of /proc/stat."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def check_host(agent: Agent, chk: Check) -> None:
    """Host figures for the metrics charts (CPU, memory, load, network); no findings."""
    busy0, total0 = _proc_cpu()
    time.sleep(0.2)
    busy1, total1 = _proc_cpu()
    chk.details["cpu_util_pct"] = (
        round(100.0 * (busy1 - busy0) / (total1 - total0), 1) if total1 > total0 else 0.0
    )
    chk.details["cpu_count"] = os.cpu_count()
    with open("/proc/loadavg") as fh:
        chk.details["load1"] = float(fh.read().split()[0])
    meminfo = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            meminfo[key] = int(rest.split()[0]) if rest.split() else 0
    chk.details["mem_total_mib"] = meminfo.get("MemTotal", 0) // 1024
    chk.details["mem_available_mib"] = meminfo.get("MemAvailable", 0) // 1024
    rx = tx = 0
    with open("/proc/net/dev") as fh:
        for line in fh.readlines()[2:]:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                continue
            fields = rest.split()
            rx, tx = rx + int(fields[0]), tx + int(fields[8])
    chk.details["net_rx_bytes"], chk.details["net_tx_bytes"] = rx, tx


CHECKS = {
    "disk": check_disk,
    "gpu": check_gpu,
    "ecc": check_ecc,
    "xid": check_xid,
    "dcgm": check_dcgm,
    "speed": check_speed,
    "correctness": check_correctness,
    "host": check_host,
}


def run_check(agent: Agent, name: str) -> dict:
    """Run one check in a thread under its budget; a check that overruns is reported as an
    error with a CHECK_TIMEOUT finding (its external commands are killed by their timeouts)."""
    chk = Check(name, agent.budget(name))
    outcome: dict = {}

    def target() -> None:
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCONT})
        try:
            CHECKS[name](agent, chk)
        except CheckTimeout as exc:
            outcome["timeout"] = str(exc)
        except Exception as exc:  # a check's bug must not take the agent down
            outcome["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=target, name="check-" + name, daemon=True)
    thread.start()
    thread.join(chk.budget + 1.0)
    if thread.is_alive():
        outcome["timeout"] = f"the {name} check did not finish within its {chk.budget:.1f}s budget"
        # The thread may still touch chk; report from a snapshot.
        late = Check(name, chk.budget)
        late.start = chk.start
        late.details = dict(chk.details)
        late.findings = list(chk.findings)
        chk = late
    chk.duration = time.monotonic() - chk.start
    if "timeout" in outcome:
        chk.details["timeout"] = True
        chk.error(outcome["timeout"])
        chk.finding(CHECK_TIMEOUT, outcome["timeout"], WARNING)
    elif "error" in outcome:
        chk.error(outcome["error"])
    return chk.result()


def run_round(agent: Agent, node: str, names) -> dict:
    agent.begin_round()
    started = time.time()
    checks = [run_check(agent, name) for name in names]
    return {"node": node, "time": started, "agent_version": AGENT_VERSION, "checks": checks}


def exit_code(report: dict) -> int:
    statuses = [c["status"] for c in report["checks"]]
    if "fail" in statuses:
        return 1
    if "error" in statuses:
        return 2
    return 0


def critical_codes(report: dict) -> list[str]:
    codes = []
    for c in report["checks"]:
        for f in c["findings"]:
            if f["severity"] == CRITICAL and f["code"] not in codes:
                codes.append(f["code"])
    return codes


# --------------------------------------------------------------------------------------------
# Output, reporting, Slurm
# --------------------------------------------------------------------------------------------


def sign_report(report: dict, token: str) -> dict:
    """The report as written to ``--output`` when the agent has a token: with ``signature``,
    HMAC-SHA256 of its canonical JSON keyed by the SHA-256 of the token (what mtc stores), so
    that mtc reads a health.json file only when it was written with the node's token."""
    key = sha256(token.encode()).hexdigest().encode().ljust(64, b"\0")  # one block
    body = json.dumps(report, sort_keys=True, separators=(",", ":")).encode()
    # HMAC (RFC 2104) by hand: the node side keeps to the few stdlib modules it allows.
    inner = sha256(bytes(b ^ 0x36 for b in key) + body).digest()
    mac = sha256(bytes(b ^ 0x5C for b in key) + inner).hexdigest()
    return dict(report, signature="hmac-sha256:" + mac)


def write_atomic(path: str, text: str) -> None:
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_state(path: str | None) -> dict:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
        return state if isinstance(state, dict) else {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log(f"ignoring unreadable state file {path}: {exc}")
        return {}


_OPENER = None


def _opener():
    """An opener that never follows redirects: a redirected POST would be resent (with the
    token) elsewhere."""
    global _OPENER
    if _OPENER is None:
        import urllib.request

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, req, fp, code, msg, headers, newurl):
                return None

        _OPENER = urllib.request.build_opener(NoRedirect)
    return _OPENER


def post_report(
    url: str,
    token: str | None,
    report: dict,
    retries: int = 5,
    backoff: float = 1.0,
    timeout: float = 10.0,
    sleep=time.sleep,
) -> str:
    """POST the report; "ok", "permanent" (a 4xx other than 429, a redirect) or "failed".

    Connection errors, timeouts, 429 and 5xx are retried ``retries`` times with exponential
    backoff (a numeric Retry-After is honoured, capped at 60 s).
    """
    return deliver(url, token, report, retries, backoff, timeout, sleep)[0]


def deliver(
    url: str,
    token: str | None,
    report: dict,
    retries: int = 5,
    backoff: float = 1.0,
    timeout: float = 10.0,
    sleep=time.sleep,
) -> tuple[str, dict]:
    """post_report(), and the server's answer (its JSON object, or {})."""
    import urllib.error
    import urllib.request

    body = json.dumps(report).encode("utf-8")
    headers = {"Content-Type": "application/json", "User-Agent": f"mtc-agent/{AGENT_VERSION}"}
    if token:
        headers["Authorization"] = "Bearer " + token
    last = ""
    for attempt in range(int(retries) + 1):
        wait = min(backoff * (2**attempt), 60.0)
        try:
            req = urllib.request.Request(url, data=body, headers=headers, method="POST")
            with _opener().open(req, timeout=timeout) as resp:
                text = resp.read(65536)
            try:
                answer = json.loads(text.decode("utf-8")) if text else {}
            except ValueError:
                answer = {}
            return "ok", answer if isinstance(answer, dict) else {}
        except urllib.error.HTTPError as exc:
            detail = ""
            try:
                detail = exc.read(300).decode("utf-8", "replace")
            except Exception:
                pass
            last = f"HTTP {exc.code} {detail.strip()}"
            if exc.code != 429 and exc.code < 500:
                log(f"report rejected (permanent, not retried): {last}")
                return "permanent", {}
            retry_after = exc.headers.get("Retry-After") if exc.headers else None
            if retry_after and retry_after.strip().isdigit():
                wait = min(float(retry_after.strip()), 60.0)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            last = "{}: {}".format(type(exc).__name__, getattr(exc, "reason", exc))
        except Exception as exc:  # http.client.HTTPException and friends
            last = f"{type(exc).__name__}: {exc}"
        if attempt < retries:
            log(f"report attempt {attempt + 1} failed ({last}); retrying in {wait:.1f}s")
            sleep(wait)
    log(f"report not delivered after {int(retries) + 1} attempts: {last}")
    return "failed", {}


def requested_dcgm_level(answer: dict) -> tuple[int, str] | None:
    """(level, reason) when the server's answer asks for a deeper next round."""
    wanted = answer.get("next_round") if isinstance(answer, dict) else None
    if not isinstance(wanted, dict):
        return None
    level = wanted.get("dcgm_level")
    if not isinstance(level, int) or isinstance(level, bool) or not 1 <= level <= 4:
        return None
    return level, str(wanted.get("reason") or "requested by the server")[:200]


def slurm_drain(agent: Agent, node: str, codes: list[str]) -> int | None:
    """Drain the node in Slurm (argument list, never a shell); the scontrol exit status."""
    scontrol = agent.which("scontrol")
    if not scontrol:
        log(f"cannot drain {node}: scontrol not found")
        return None
    reason = ("mtc: " + ",".join(codes))[:200]
    held = _drained_by(agent, scontrol, node)
    if held is not None:
        # Out of service already: keep the reason of whoever drained it (a person's, or
        # mtc's repair), so that this round does not overwrite it.
        log(f"{node} is already drained ({held or 'no reason'}); not draining again")
        return 0
    args = [scontrol, "update", "NodeName=" + node, "State=DRAIN", "Reason=" + reason]
    try:
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=30,
            env=agent.env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log(f"scontrol update failed: {exc}")
        return None
    if proc.returncode != 0:
        log(f"scontrol update exited {proc.returncode}: {_tail(proc.stderr or proc.stdout)}")
    else:
        log(f"drained {node}: {reason}")
    return proc.returncode


_NODE_STATE_RE = re.compile(r"\bState=(\S+)")
_NODE_REASON_RE = re.compile(r"\bReason=(.*?)(?:\s+\[[^\]]*\])?\s*$")


def _drained_by(agent: Agent, scontrol: str, node: str) -> str | None:
    """The drain reason when Slurm has the node drained already ("" if none given); None when
    it is not drained or Slurm cannot say."""
    try:
        proc = subprocess.run(
            [scontrol, "show", "node", "-o", node],
            capture_output=True,
            text=True,
            timeout=30,
            env=agent.env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    state = _NODE_STATE_RE.search(proc.stdout or "")
    if proc.returncode != 0 or not state or "DRAIN" not in state.group(1):
        return None
    reason = _NODE_REASON_RE.search(proc.stdout.strip())
    return reason.group(1).strip() if reason else ""


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


class UsageError(Exception):
    pass


def load_config(path: str | None) -> dict:
    config = json.loads(json.dumps(DEFAULT_CONFIG))
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                loaded = json.load(fh)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read config {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise UsageError(f"config {path} is not a JSON object")
        config.update(loaded)
    _validate(config)
    return config


def _validate(config: dict) -> None:
    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    budgets = config.get("budgets") or {}
    if not isinstance(budgets, dict) or not all(number(v) and v > 0 for v in budgets.values()):
        raise UsageError('config "budgets" must map check names to positive seconds')
    unknown = sorted(set(budgets) - set(CHECK_NAMES))
    if unknown:
        raise UsageError(f"config budgets for unknown checks: {', '.join(unknown)}")
    paths = config.get("disk_paths")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise UsageError('config "disk_paths" must be a list of paths')
    expected = config.get("expected_gpus")
    if expected is not None and (not isinstance(expected, int) or expected < 0):
        raise UsageError('config "expected_gpus" must be a non-negative integer or null')
    for key in ("disk_min_free_pct", "disk_min_free_gb", "speed_seconds", "report_backoff_s"):
        if not number(config.get(key)):
            raise UsageError(f'config "{key}" must be a number')
    for key in ("dcgm_level", "speed_size", "correctness_size", "correctness_seed"):
        if not isinstance(config.get(key), int) or config.get(key) < 0:
            raise UsageError(f'config "{key}" must be a non-negative integer')


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mtc_agent.py", description="mtc node health agent (stdlib only)."
    )
    p.add_argument(
        "--node", metavar="NAME", help="node name (default: config, $SLURMD_NODENAME, hostname)"
    )
    p.add_argument("--config", metavar="FILE", help="JSON config file")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="run the checks once (default)")
    mode.add_argument(
        "--interval", type=float, metavar="SECONDS", help="run every SECONDS, forever"
    )
    p.add_argument(
        "--checks", metavar="LIST", help="comma-separated subset of: " + ",".join(CHECK_NAMES)
    )
    p.add_argument("--report-url", metavar="URL", help="POST each report here")
    p.add_argument(
        "--token", metavar="TOKEN", help="bearer token (visible in ps; prefer --token-file)"
    )
    p.add_argument("--token-file", metavar="FILE", help="file holding the bearer token")
    p.add_argument("--output", metavar="FILE", help="also write the report to FILE (atomically)")
    p.add_argument(
        "--state-file",
        metavar="FILE",
        help="what earlier rounds saw (XID lines); default: the config's state_file",
    )
    p.add_argument(
        "--dcgm-level",
        type=int,
        choices=range(0, 5),
        metavar="0-4",
        help="dcgmi diag -r level for this run (0: no diag); default: the config's dcgm_level",
    )
    p.add_argument(
        "--trigger",
        metavar="NAME",
        help="why this run happens (periodic, healthcheck, prolog, suspicion, post-repair, ...)",
    )
    p.add_argument(
        "--slurm-drain",
        action="store_true",
        help="on a critical finding: scontrol update NodeName=<node> State=DRAIN",
    )
    return p


def _settings(args, config: dict) -> dict:
    names = args.checks.split(",") if args.checks else list(config.get("checks") or CHECK_NAMES)
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise UsageError(
            "unknown check(s): {} (known: {})".format(",".join(unknown), ",".join(CHECK_NAMES))
        )
    if args.interval is not None and args.interval <= 0:
        raise UsageError("--interval must be positive")
    node = (
        args.node
        or config.get("node")
        or os.environ.get("SLURMD_NODENAME")
        or socket.gethostname().split(".")[0]
    )
    token = args.token
    if not token and args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as fh:
                token = fh.read().strip()
        except OSError as exc:
            raise UsageError(f"cannot read token file: {exc}") from exc
    token = token or os.environ.get("MTC_AGENT_TOKEN") or config.get("token")
    url = args.report_url or config.get("report_url")
    if url and urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise UsageError("--report-url must be an http(s) URL")
    return {"names": names, "node": node, "token": token, "url": url}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
        settings = _settings(args, config)
    except UsageError as exc:
        log(str(exc))
        return 2
    if args.state_file:
        config["state_file"] = args.state_file
    if args.dcgm_level is not None:
        config["dcgm_level"] = args.dcgm_level
    if args.trigger:
        config["trigger"] = args.trigger[:40]
    agent = Agent(config)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCONT, _count_continue)
    deeper: tuple[int, str] | None = None  # one deeper round the server asked for
    if args.interval is not None:

        def _stop(signum, frame):
            stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)

    while True:
        started = time.monotonic()
        agent.dcgm_level = int(config.get("dcgm_level") or 0)
        agent.trigger = str(config.get("trigger") or ("periodic" if args.interval else "on-demand"))
        if deeper:
            agent.dcgm_level, agent.trigger = deeper[0], "requested: " + deeper[1]
            deeper = None
        report = run_round(agent, settings["node"], settings["names"])
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
        codes = critical_codes(report)
        if args.slurm_drain and codes:  # before reporting, which may retry for a while
            slurm_drain(agent, settings["node"], codes)
        delivered = True
        if (settings["url"] or args.output) and args.token_file and not args.token:
            # Read again each round: a node given a new token keeps reporting.
            try:
                with open(args.token_file, encoding="utf-8") as fh:
                    settings["token"] = fh.read().strip() or settings["token"]
            except OSError as exc:
                log(f"cannot read token file (keeping the last token): {exc}")
        if args.output:
            written = sign_report(report, settings["token"]) if settings["token"] else report
            try:
                write_atomic(args.output, json.dumps(written, indent=2) + "\n")
            except OSError as exc:
                log(f"cannot write {args.output}: {exc}")
        if settings["url"]:
            outcome, answer = deliver(
                settings["url"],
                settings["token"],
                report,
                retries=int(config.get("report_retries", 5)),
                backoff=float(config.get("report_backoff_s", 1.0)),
                timeout=float(config.get("report_timeout_s", 10.0)),
            )
            # Undelivered XID lines stay "new" so that the next round reports them again.
            delivered = outcome != "failed"
            deeper = requested_dcgm_level(answer)
        if delivered:
            agent.commit_state()
        if args.interval is None:
            return exit_code(report)
        if stop.wait(max(0.0, args.interval - (time.monotonic() - started))):
            return 0


def entry() -> int:
    """main() with the agent's own failures mapped to exit status 2 (Python would say 1,
    which reads as "a check failed")."""
    try:
        return main()
    except KeyboardInterrupt:
        return 130
    except Exception:
        traceback.print_exc()
        log("agent error (exit 2)")
        return 2


if __name__ == "__main__":
    sys.exit(entry())
