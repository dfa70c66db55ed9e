"""Failure modes and the repair policy: what each mode means and which actions, in
order, repair it. A repair that does not fix the node escalates to the next action."""

from __future__ import annotations

from dataclasses import dataclass

from clusters.providers.local_nodes import HEALTHCHECK_DCGM_LEVEL

from .choices import RepairAction, Severity

REBOOT, REIMAGE, REPLACE, DRAIN = (
    RepairAction.REBOOT,
    RepairAction.REIMAGE,
    RepairAction.REPLACE,
    RepairAction.DRAIN,
)


@dataclass(frozen=True)
class Mode:
    code: str
    severity: str
    meaning: str
    ladder: tuple[str, ...]  # actions in escalation order; () = record only


MODES: dict[str, Mode] = {
    m.code: m
    for m in (
        Mode(
            "NODE_UNRESPONSIVE",
            Severity.CRITICAL,
            "slurmd is not answering",
            (REBOOT, REIMAGE, REPLACE),
        ),
        Mode(
            "GPU_ECC_UNCORRECTABLE",
            Severity.CRITICAL,
            "volatile uncorrectable ECC errors",
            (REPLACE,),
        ),
        Mode("GPU_ROW_REMAP_FAILURE", Severity.CRITICAL, "HBM row remapping failed", (REPLACE,)),
        Mode(
            "GPU_ROW_REMAP_PENDING",
            Severity.WARNING,
            "a row remap waits for a GPU reset",
            (REBOOT,),
        ),
        Mode(
            "GPU_MISSING",
            Severity.CRITICAL,
            "fewer GPUs than the node should have",
            (REBOOT, REPLACE),
        ),
        Mode(
            "GPU_FELL_OFF_BUS", Severity.CRITICAL, "a GPU fell off the PCIe bus", (REBOOT, REPLACE)
        ),
        Mode("DCGM_DIAG_FAILED", Severity.CRITICAL, "a DCGM diagnostic failed", (REIMAGE, REPLACE)),
        Mode(
            "DCGM_HEALTH_FAILURE",
            Severity.CRITICAL,
            "DCGM health reports a failure",
            (REBOOT, REPLACE),
        ),
        Mode("DCGM_HEALTH_WARNING", Severity.WARNING, "DCGM health reports a warning", ()),
        Mode(
            "SLOW_NODE", Severity.CRITICAL, "far slower than its pool's median", (REBOOT, REPLACE)
        ),
        Mode(
            "JOB_HANG",
            Severity.CRITICAL,
            "a training rank on it stopped while the others waited in a collective",
            (REBOOT, REPLACE),
        ),
        Mode(
            "SILENT_DATA_CORRUPTION",
            Severity.CRITICAL,
            "wrong results from a known computation",
            (REPLACE,),
        ),
        Mode(
            "FABRIC_DEGRADED",
            Severity.CRITICAL,
            "low all-reduce bandwidth with every partner of the fabric check",
            (REBOOT, REPLACE),
        ),
        Mode(
            "DISK_FULL", Severity.CRITICAL, "the node's disk is (nearly) full", (REIMAGE, REPLACE)
        ),
    )
}

# NVIDIA XID errors (after NVIDIA's XID catalogue): the ones that mean broken or
# wedged hardware go to repair; 13, 31, 43 (usually the application), 63 (a row
# remap was recorded) and 92 (a high single-bit ECC rate) are only recorded.
XID_LADDERS = {
    48: (REPLACE,),
    61: (REBOOT, REPLACE),
    62: (REBOOT, REPLACE),
    64: (REBOOT, REPLACE),
    74: (REBOOT, REPLACE),
    79: (REBOOT, REPLACE),
    94: (REBOOT, REPLACE),
    95: (REBOOT, REPLACE),
    119: (REBOOT, REPLACE),
    120: (REBOOT, REPLACE),
    140: (REBOOT, REPLACE),
}


def mode_for(code: str) -> Mode:
    """The mode for a finding code; unknown XIDs and codes are warnings."""
    if code in MODES:
        return MODES[code]
    if code.startswith("XID_") and code[4:].isdigit():
        ladder = XID_LADDERS.get(int(code[4:]), ())
        return Mode(
            code,
            Severity.CRITICAL if ladder else Severity.WARNING,
            f"NVIDIA XID {code[4:]}",
            ladder,
        )
    return Mode(code, Severity.WARNING, code.replace("_", " ").lower(), ())


def next_action(code: str, attempts_done: int) -> str | None:
    """The action for the next repair of this mode, or None when the ladder is spent."""
    ladder = mode_for(code).ladder
    return ladder[attempts_done] if attempts_done < len(ladder) else None


# Repairs that wipe or swap the machine. One report from a node's agent is a claim (a
# buggy agent, a bad round, a forged report): it may drain the node, or reboot it, but a
# destructive repair needs a second signal on the failure first: a repeat in a later report,
# a check mtc ran or saw itself (controller side), or an operator.
DESTRUCTIVE = frozenset({REIMAGE, REPLACE})


def needs_second_signal(action: str | None, confirmed_by: str) -> bool:
    return action in DESTRUCTIVE and not confirmed_by


# A node far below its pool's median speed (the speed check) is SLOW.
SLOW_FRACTION = 0.6
SLOW_ROUNDS = 2  # consecutive slow reports before a node is SLOW


# DCGM diagnostic level (dcgmi diag -r N) by why the checks run. Level 1 takes seconds and
# runs beside jobs; 2 takes minutes and 3 tens of minutes, on a node under suspicion or one
# about to return to service (3 for a new machine: its burn-in).
DCGM_LEVEL_BY_TRIGGER = {
    "periodic": 1,
    "healthcheck": HEALTHCHECK_DCGM_LEVEL,
    "prolog": 1,
    "on-demand": 1,
    "suspicion": 2,
    "post-repair": 2,
}


def dcgm_level_for(trigger: str, action: str | None = None) -> int:
    if trigger == "post-repair" and action == REPLACE:
        return 3
    return DCGM_LEVEL_BY_TRIGGER.get(trigger, 1)
