"""bench/gpu_check.py's CPU mode runs every stage (so the GPU check cannot rot unseen)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_gpu_check_small_on_cpu(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--device", "cpu", "--small", "--json", str(out)],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # ~20 s on an idle 2-core machine
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["stage"]: r for r in json.loads(out.read_text())}
    assert list(rows) == ["versions", "eager", "compiled", "runtime", "checkpoint", "resume"]
    assert all(r["result"] != "FAILED" for r in rows.values()), rows
    assert "tokens/s, MFU" in rows["eager"]["result"] and "compile" in rows["compiled"]["detail"]
    assert "FSDP2 1 rank (gloo)" in rows["runtime"]["detail"]
    assert rows["resume"]["result"] == "losses equal"  # fp32 on CPU: exactly
    assert "stage" in proc.stdout.splitlines()[0]  # the table
