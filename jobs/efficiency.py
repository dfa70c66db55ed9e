"""A finished job's efficiency, as Slurm's `seff` prints it, from its accounting record:
CPU efficiency (CPU time over elapsed × allocated CPUs), peak memory against the
allocation, and GPU-hours (allocated GPUs × elapsed)."""

from __future__ import annotations


def _ratio(used: float | None, available: float | None) -> float | None:
    if used is None or not available:
        return None
    return round(used / available, 4)


def job_efficiency(
    *,
    elapsed_s: int | None,
    cpu_time_s: float | None,
    cpus: int | None,
    max_rss_bytes: int | None,
    mem_bytes: int | None,
    gpus: int | None,
) -> dict | None:
    """None until accounting has the job's run time; a figure accounting lacks is None."""
    if elapsed_s is None:
        return None
    return {
        # Fractions (0.5 = 50 %); a job that ran 0 s has no CPU efficiency.
        "cpu_efficiency": _ratio(cpu_time_s, elapsed_s * (cpus or 0)),
        "cpu_hours": round(elapsed_s * (cpus or 0) / 3600, 6),
        "memory_efficiency": _ratio(max_rss_bytes, mem_bytes),
        "max_rss_bytes": max_rss_bytes,
        "mem_allocated_bytes": mem_bytes,
        "gpu_hours": round(elapsed_s * (gpus or 0) / 3600, 6),
    }
