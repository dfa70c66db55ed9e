"""Shared by the hostile-tenant tests: a user's own account acting in their folder as
their job would (links and FIFOs planted as that account, never by root), and a folder
of root's alone that no call of mtc's may change."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from identity.runas import run_as


def plant_link(account, link: Path, target: Path) -> None:
    """``link`` -> ``target``, made by the account itself (what its job can do)."""
    run_as(account, ["rm", "-rf", str(link)], check=True)
    run_as(account, ["ln", "-s", str(target), str(link)], check=True)


def make_dirs(account, path: Path) -> None:
    run_as(account, ["mkdir", "-p", str(path)], check=True)


def make_fifo(account, path: Path) -> None:
    run_as(account, ["rm", "-rf", str(path)], check=True)
    run_as(account, ["mkfifo", str(path)], check=True)


class RootOnly:
    """A folder of root's (0700) with a script in it, like a cluster's etc/ whose
    health check every slurmd runs as root: the target a hostile user aims mtc at."""

    CONTENT = "#!/bin/sh\n# ROOT-ONLY-CANARY\n"

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chown(path, 0, 0)  # as root made it, whatever an earlier test did to it
        os.chmod(path, 0o700)
        self.file = path / "healthcheck.sh"
        self.file.write_text(self.CONTENT)
        os.chown(self.file, 0, 0)
        os.chmod(self.file, 0o700)

    def assert_untouched(self) -> None:
        info = self.path.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o700), info
        assert sorted(os.listdir(self.path)) == ["healthcheck.sh"]
        info = self.file.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700), info
        assert self.file.read_text() == self.CONTENT


@pytest.fixture
def root_only(settings):
    return RootOnly(Path(settings.DATA_DIR) / "clusters" / "rc" / "etc")
