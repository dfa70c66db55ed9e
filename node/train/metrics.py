"""Metrics out of a run: ``metrics.jsonl`` (the app reads it), TensorBoard event files
under ``tb/``, and progress lines on stdout (the Slurm job's output file). Rank 0 only.

MFU = achieved FLOP/s ÷ peak FLOP/s, achieved = tokens/s × FLOPs per token
(``model.flops_per_token``: 6·N + 12·n_layers·(n_heads·head_dim)·seq_len, PaLM
appendix B). Peak per device below; on CPU it is an *estimate*: ``MTC_PEAK_FLOPS``
(FLOP/s of one process) when set, else 1e11 FLOP/s per core the process uses (about
what one AVX-512 core with two FMA units does in fp32 at ~3 GHz).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch

# Dense BF16 tensor-core peak FLOP/s per GPU (NVIDIA's figures "with sparsity" halved),
# matched in order against torch.cuda.get_device_name: the more specific name first
# ("GB200" before "B200", "H100 NVL" before "H100"). Sources, NVIDIA's pages:
#   H100 SXM/NVL   https://www.nvidia.com/en-us/data-center/h100/  (1,979 / 1,671 TF sparse)
#   H100 PCIe      NVIDIA H100 PCIe product brief PB-11133-001 (756 TF dense)
#   H200 SXM/NVL   https://www.nvidia.com/en-us/data-center/h200/  (1,979 / 1,671 TF sparse)
#   B200, B300     https://www.nvidia.com/en-us/data-center/hgx/   (HGX B200 / B300:
#                  36 PF sparse for 8 GPUs, 2.25 PF dense each)
#   GB200          https://www.nvidia.com/en-us/data-center/gb200-nvl72/  (360 PF sparse for
#                  72 GPUs, 2.5 PF dense each); GB300 NVL72 states the same BF16 figure
#   A100           https://www.nvidia.com/en-us/data-center/a100/  (312 TF dense)
#   L4, L40, L40S  their datasheets (242 / 362 / 733 TF sparse); A10G ~70 TF (AWS G5)
GPU_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB300", 2500e12),
    ("GB200", 2500e12),
    ("B300", 2250e12),
    ("B200", 2250e12),
    ("H200 NVL", 835e12),
    ("H200", 989e12),  # also GH200 (its GPU is an H200 or H100 SXM)
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989.4e12),  # "NVIDIA H100 80GB HBM3": the SXM part
    ("H800", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
)
UNKNOWN_GPU_FLOPS = 989e12  # an H100 SXM's: MFU of an unknown GPU reads low, never high
log = logging.getLogger("mtc.runtime")
CPU_FLOPS_PER_CORE = 1e11  # an estimate, see the module docstring
TB_BATCH, TB_SECONDS = 50, 10.0


def peak_flops(device: torch.device) -> float:
    """Peak FLOP/s of one process's device."""
    env = os.environ.get("MTC_PEAK_FLOPS")
    if env:
        try:
            return float(env)
        except ValueError:
            pass
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak_flops(name)
        if peak is None:
            log.warning(
                "MFU: no peak known for %r; using %.0f TFLOP/s (set MTC_PEAK_FLOPS)",
                name,
                UNKNOWN_GPU_FLOPS / 1e12,
            )
            return UNKNOWN_GPU_FLOPS
        return peak
    return CPU_FLOPS_PER_CORE * torch.get_num_threads()


def gpu_peak_flops(device_name: str) -> float | None:
    """Dense BF16 peak of one GPU, by its CUDA device name; None when not in the table."""
    upper = device_name.upper()
    for key, value in GPU_PEAK_FLOPS:
        if key.upper() in upper:
            return value
    return None


class MetricsLogger:
    def __init__(self, run_dir: Path, *, enabled: bool, purge_step: int | None = None):
        self.enabled = enabled
        self.tb = None
        self.fh = None
        self._tb_buf: list[tuple[int, dict]] = []
        self._tb_last = time.monotonic()
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.fh = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        try:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events a killed attempt wrote after its last checkpoint.
            self.tb = SummaryWriter(log_dir=str(run_dir / "tb"), purge_step=purge_step)
        except ImportError:  # tensorboard not installed: JSONL still works
            self.tb = None

    def _write(self, obj: dict) -> None:
        self.fh.write(json.dumps(obj) + "\n")
        self.fh.flush()

    def event(self, event: str, step: int, **fields) -> None:
        if self.enabled:
            self._write({"event": event, "step": step, "time": time.time(), **fields})
            self._tb_flush()

    def step(self, step: int, values: dict) -> None:
        """One step's line in metrics.jsonl now; its TensorBoard scalars in batches (every
        TB_BATCH steps, TB_SECONDS seconds or event): the event writer costs ~5% of a
        tiny model's step time when called every step."""
        if not self.enabled:
            return
        self._write({"step": step, **values, "time": time.time()})
        if self.tb is not None:
            self._tb_buf.append((step, values))
            if len(self._tb_buf) >= TB_BATCH or time.monotonic() - self._tb_last > TB_SECONDS:
                self._tb_flush()

    def _tb_flush(self) -> None:
        if self.tb is None:
            return
        for step, values in self._tb_buf:
            for key, value in values.items():
                if isinstance(value, (int, float)) and key != "step_time_s":
                    group = "perf" if key in ("tokens_per_s", "mfu") else "train"
                    self.tb.add_scalar(f"{group}/{key}", value, step)
        self._tb_buf.clear()
        self._tb_last = time.monotonic()
        self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self._tb_flush()
            self.tb.close()
        if self.fh is not None:
            self.fh.close()


def progress_line(step: int, steps: int, m: dict) -> str:
    parts = [f"step {step}/{steps}", f"loss {m['loss']:.4f}", f"lr {m['lr']:.1e}"]
    parts.append(f"gnorm {m['grad_norm']:.3f}")
    if "reward" in m:
        parts.append(f"reward {m['reward']:.3f}")
    parts.append(f"tok/s {m['tokens_per_s']:.0f}")
    parts.append(f"mfu {100 * m['mfu']:.2f}%")
    return " ".join(parts)
