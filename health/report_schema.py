"""What a node agent's report may hold, checked at the door (the API and the poller's
health.json path alike): the agent's own output (node/agent/mtc_agent.py), with types,
ranges and sizes bounded, before anything is stored. A report that fails is refused
whole, naming each bad field by its JSON path (``checks[2].name``)."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from datetime import datetime
from typing import Any

from django.utils import timezone

MAX_BODY_BYTES = 256 * 1024  # a real report of an 8-GPU node is ~8 KiB
MAX_PAST_S = 15 * 60  # a report's round began at most this long ago ...
MAX_FUTURE_S = 2 * 60  # ... and not further ahead (the node's clock may run fast)
MAX_ROUND_S = 2 * 3600  # ... plus the round's length, up to a DCGM level 4 diag's budget

CHECK_NAMES = ("disk", "gpu", "ecc", "xid", "dcgm", "speed", "correctness", "host")
STATUSES = ("pass", "warn", "fail", "skip", "error")
SEVERITIES = ("critical", "warning")
TOP_REQUIRED = ("node", "time", "checks")
TOP_OPTIONAL = ("agent_version",)
CHECK_REQUIRED = ("name", "status")
CHECK_OPTIONAL = ("duration_s", "budget_s", "details", "findings")
FINDING_REQUIRED = ("code",)
FINDING_OPTIONAL = ("message", "severity", "gpu")
CODE = re.compile(r"^[A-Z][A-Z0-9_]{0,39}$")  # NodeFailure.mode holds 40

MAX_CHECKS = 16
MAX_FINDINGS = 64  # per check
MAX_MESSAGE = 2000
MAX_NAME = 80
MAX_STRING = 4096  # any string in a check's details
MAX_ITEMS = 512  # entries of any list or object in a check's details
MAX_DEPTH = 8  # nesting of a check's details
MAX_ERRORS = 20  # fields named in one answer
MAX_INT = 2**63

# The figures mtc reads out of details (metrics, the speed median): a number or null, in range.
TELEMETRY_RANGES = {
    "temperature_c": (-100, 250),
    "power_w": (0, 10_000),
    "utilization_pct": (0, 100),
    "memory_used_mib": (0, 2**24),
    "memory_total_mib": (0, 2**24),
    "ecc_uncorrected_volatile": (0, 2**48),
}
DETAIL_RANGES = {
    "host": {
        "cpu_util_pct": (0, 100),
        "load1": (0, 1e6),
        "mem_total_mib": (0, 2**32),
        "mem_available_mib": (0, 2**32),
        "net_rx_bytes": (0, 2**64),
        "net_tx_bytes": (0, 2**64),
    },
    "speed": {"gflops": (0, 1e9)},
}
MAX_GPUS = 1024


class ReportInvalid(Exception):
    """The report is refused; ``fields`` maps JSON paths to what is wrong there."""

    def __init__(self, fields: dict[str, str]):
        self.fields = fields
        super().__init__("Invalid report: " + "; ".join(f"{k}: {v}" for k, v in fields.items()))


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def body_parse(raw: bytes) -> Any:
    """The body as JSON (strict: no NaN/Infinity); ReportInvalid on ``body`` otherwise."""
    if len(raw) > MAX_BODY_BYTES:
        raise ReportInvalid({"body": f"Larger than {MAX_BODY_BYTES} bytes."})
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ReportInvalid({"body": f"Not valid JSON: {str(exc)[:200]}"}) from exc


# --- health.json: signed with the node's token ----------------------------------------------
def _canonical(report: dict) -> bytes:
    body = {k: v for k, v in report.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def file_signature_valid(report: dict, token_hash: str) -> bool:
    """A health.json report carries ``signature``: HMAC-SHA256 of its canonical JSON keyed by
    the SHA-256 of the node's token (what mtc stores); the agent signs when it has a token."""
    signature = report.get("signature")
    if not token_hash or not isinstance(signature, str):
        return False
    want = hmac.new(token_hash.encode(), _canonical(report), hashlib.sha256).hexdigest()
    return hmac.compare_digest("hmac-sha256:" + want, signature)


# --- the report -------------------------------------------------------------------------------
class _Errors:
    def __init__(self) -> None:
        self.fields: dict[str, str] = {}

    def add(self, path: str, message: str) -> None:
        if len(self.fields) < MAX_ERRORS:
            self.fields.setdefault(path, message)


def _is_number(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -MAX_INT <= value <= MAX_INT
    return isinstance(value, float) and math.isfinite(value)


def _number(errors, path, value, low, high, *, null=False, integer=False) -> None:
    if value is None and null:
        return
    if not _is_number(value) or (integer and not isinstance(value, int)):
        errors.add(path, "Must be an integer." if integer else "Must be a number.")
    elif not low <= value <= high:
        errors.add(path, f"Must be between {low:g} and {high:g}.")


def _string(errors, path, value, limit, *, null=False) -> None:
    if value is None and null:
        return
    if not isinstance(value, str):
        errors.add(path, "Must be a string.")
    elif len(value) > limit:
        errors.add(path, f"Longer than {limit} characters.")
    elif "\x00" in value:  # stored as text or JSON, and PostgreSQL holds no NUL in either
        errors.add(path, "Must not hold a NUL character.")


def _keys(errors, path, obj: dict, required, optional) -> None:
    for key in required:
        if key not in obj:
            errors.add(f"{path}.{key}" if path else key, "This field is required.")
    for key in obj:
        if key not in required and key not in optional:
            name = str(key)[:MAX_NAME]
            errors.add(f"{path}.{name}" if path else name, "Unknown field.")


def _free(errors, path: str, value, depth: int = 0) -> None:
    """Any JSON within bounds: finite numbers, short strings, small shallow containers."""
    if depth > MAX_DEPTH:
        errors.add(path, f"Nested deeper than {MAX_DEPTH}.")
    elif isinstance(value, dict):
        if len(value) > MAX_ITEMS:
            errors.add(path, f"More than {MAX_ITEMS} entries.")
            return
        for key, item in value.items():
            if len(key) > MAX_NAME:
                errors.add(f"{path}.{key[:MAX_NAME]}", f"Key longer than {MAX_NAME} characters.")
            elif "\x00" in key:
                errors.add(f"{path}.{key}", "Key holds a NUL character.")
            else:
                _free(errors, f"{path}.{key}", item, depth + 1)
    elif isinstance(value, list):
        if len(value) > MAX_ITEMS:
            errors.add(path, f"More than {MAX_ITEMS} items.")
            return
        for index, item in enumerate(value):
            _free(errors, f"{path}[{index}]", item, depth + 1)
    elif isinstance(value, str):
        _string(errors, path, value, MAX_STRING)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not _is_number(value):
            errors.add(path, "Must be a finite number within range.")
    elif value is not None and not isinstance(value, bool):
        errors.add(path, "Not a JSON value.")


def _details(errors, path: str, name: str, details) -> None:
    if not isinstance(details, dict):
        errors.add(path, "Must be an object.")
        return
    _free(errors, path, details, 1)
    for key, (low, high) in DETAIL_RANGES.get(name, {}).items():
        if key in details:
            _number(errors, f"{path}.{key}", details[key], low, high, null=True)
    if name == "gpu" and "telemetry" in details:
        rows = details["telemetry"]
        if not isinstance(rows, list):
            errors.add(f"{path}.telemetry", "Must be a list.")
            return
        for i, row in enumerate(rows[:MAX_ITEMS]):
            where = f"{path}.telemetry[{i}]"
            if not isinstance(row, dict):
                errors.add(where, "Must be an object.")
                continue
            _number(errors, f"{where}.index", row.get("index"), 0, MAX_GPUS - 1, integer=True)
            for key, (low, high) in TELEMETRY_RANGES.items():
                if key in row:
                    _number(errors, f"{where}.{key}", row[key], low, high, null=True)


def _finding(errors, path: str, finding) -> None:
    if not isinstance(finding, dict):
        errors.add(path, "Must be an object.")
        return
    _keys(errors, path, finding, FINDING_REQUIRED, FINDING_OPTIONAL)
    code = finding.get("code")
    if "code" in finding and not (isinstance(code, str) and CODE.match(code)):
        errors.add(f"{path}.code", "Must match [A-Z][A-Z0-9_]*, at most 40 characters.")
    if "message" in finding:
        _string(errors, f"{path}.message", finding["message"], MAX_MESSAGE, null=True)
    if finding.get("severity") is not None and finding["severity"] not in SEVERITIES:
        errors.add(f"{path}.severity", "Must be critical or warning.")
    if "gpu" in finding:
        _number(errors, f"{path}.gpu", finding["gpu"], 0, MAX_GPUS - 1, null=True, integer=True)


def _check(errors, path: str, check, seen: set) -> None:
    if not isinstance(check, dict):
        errors.add(path, "Must be an object.")
        return
    _keys(errors, path, check, CHECK_REQUIRED, CHECK_OPTIONAL)
    name = check.get("name")
    if "name" in check:
        if name not in CHECK_NAMES:
            errors.add(f"{path}.name", "Unknown check; known: " + ", ".join(CHECK_NAMES) + ".")
        elif name in seen:
            errors.add(f"{path}.name", "This check is already in the report.")
        else:
            seen.add(name)
    if "status" in check and check["status"] not in STATUSES:
        errors.add(f"{path}.status", "Must be one of " + ", ".join(STATUSES) + ".")
    for key in ("duration_s", "budget_s"):
        if key in check:
            _number(errors, f"{path}.{key}", check[key], 0, 86_400)
    if "details" in check:
        _details(errors, f"{path}.details", name if isinstance(name, str) else "", check["details"])
    findings = check.get("findings", [])
    if not isinstance(findings, list):
        errors.add(f"{path}.findings", "Must be a list.")
    elif len(findings) > MAX_FINDINGS:
        errors.add(f"{path}.findings", f"More than {MAX_FINDINGS} findings.")
    else:
        for index, finding in enumerate(findings):
            _finding(errors, f"{path}.findings[{index}]", finding)


def _round_length(report: dict) -> float:
    """How long the round took by its checks' own durations (a deep DCGM round takes
    minutes to an hour, and the report's time is when the round began)."""
    checks = report.get("checks") if isinstance(report.get("checks"), list) else []
    total = sum(
        c["duration_s"]
        for c in checks[:MAX_CHECKS]
        if isinstance(c, dict) and _is_number(c.get("duration_s")) and 0 <= c["duration_s"]
    )
    return min(total, MAX_ROUND_S)


def _time(errors, report: dict, now: datetime) -> None:
    stamp = report["time"]
    if not _is_number(stamp):
        errors.add("time", "Must be a number (seconds since the epoch).")
        return
    now_s = now.timestamp()
    if not now_s - MAX_PAST_S - _round_length(report) <= stamp <= now_s + MAX_FUTURE_S:
        errors.add(
            "time",
            f"Must be within {MAX_PAST_S // 60} minutes (plus the round's own length) before "
            f"mtc's clock and {MAX_FUTURE_S // 60} after it.",
        )


def report_validate(report: Any, *, node: str, now: datetime | None = None) -> dict:
    """The report, unchanged, when all of it is acceptable; ReportInvalid otherwise."""
    errors = _Errors()
    if not isinstance(report, dict):
        raise ReportInvalid({"body": "Must be a JSON object."})
    _keys(errors, "", report, TOP_REQUIRED, TOP_OPTIONAL)
    if "node" in report and report["node"] != node:
        errors.add("node", "Must be this node's name.")
    if "time" in report:
        _time(errors, report, now or timezone.now())
    if "agent_version" in report:
        _number(errors, "agent_version", report["agent_version"], 1, 10_000, integer=True)
    checks = report.get("checks")
    if "checks" in report:
        if not isinstance(checks, list):
            errors.add("checks", "Must be a list.")
        elif len(checks) > MAX_CHECKS:
            errors.add("checks", f"More than {MAX_CHECKS} checks.")
        else:
            seen: set = set()
            for index, check in enumerate(checks):
                _check(errors, f"checks[{index}]", check, seen)
    if errors.fields:
        raise ReportInvalid(errors.fields)
    return report
