"""bench/gce_smoke.py runs the live-project checklist only where credentials are found;
elsewhere (here, and in CI) it says it skipped and why, and succeeds."""

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gce_smoke.py"


def test_without_credentials_the_smoke_check_says_it_skipped(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GOOGLE_", "CLOUDSDK_", "MTC_GCE_"))
    }
    # No gcloud config, no key file, and no asking a metadata server whether this is a VM.
    env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), NO_GCE_CHECK="true")
    done = subprocess.run(
        [sys.executable, str(BENCH)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("skipped: no Application Default Credentials"), done.stdout
