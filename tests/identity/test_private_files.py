"""mtc's own files are mtc's alone from the moment they exist (no chmod afterwards)."""

from __future__ import annotations

import stat
from pathlib import Path

from django.conf import settings

from mtc.devstack import Stack


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_celery_beats_schedule_lives_in_a_folder_of_mtcs_alone():
    assert mode(Path(settings.CELERY_BEAT_SCHEDULE_FILENAME).parent) == 0o700


def test_the_stacks_logs_are_mtcs_alone(tmp_path):
    stack = Stack(data_dir=tmp_path)
    stack._start("probe", ["echo", "token=abc"]).wait(timeout=10)
    log = tmp_path / "log" / "probe.log"
    assert "token=abc" in log.read_text()
    assert mode(tmp_path / "log") == 0o700 and mode(log) == 0o600
