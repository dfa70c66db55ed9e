"""The audit hook over the whole suite (tests/fsaudit.py) sees what it is there for: a
path-based touch of a user's tree from mtc's code. (No services.)"""

from __future__ import annotations

import os

import pytest

from mtc import userfs

from .. import fsaudit

pytestmark = pytest.mark.security


def run_as_app_code(source: str, **names) -> None:
    """Run ``source`` as if it were a line of jobs/ (the hook judges by the frame)."""
    exec(compile(source, str(fsaudit.REPO / "jobs" / "probe.py"), "exec"), dict(names))


def test_a_path_based_open_in_a_users_tree_from_mtcs_code_is_a_finding(tmp_path):
    home = tmp_path / "users" / "u"
    home.mkdir(parents=True)
    (home / "f").write_text("x")  # the test's own setup: not a finding
    fsaudit.take()
    run_as_app_code("open(p).close()\nos.chmod(p, 0o600)\n", p=str(home / "f"), os=os)
    found = fsaudit.take()
    assert len(found) == 2 and all("jobs/probe.py" in f for f in found), found
    assert found[0].startswith(f"open {home / 'f'}")


def test_the_same_through_userfs_or_outside_users_trees_is_not(tmp_path):
    home = tmp_path / "users" / "u"
    home.mkdir(parents=True)
    (home / "f").write_text("x")
    (tmp_path / "mtcs").write_text("y")
    fsaudit.take()
    run_as_app_code("userfs.read_bytes(p, limit=1)\n", userfs=userfs, p=home / "f")
    run_as_app_code("open(p).close()\n", p=str(tmp_path / "mtcs"))
    assert fsaudit.take() == []
