"""An audit hook (``sys.addaudithook``) over the whole test run: a root process that
opens, chowns, chmods, makes, renames, removes or lists a path in a user's tree (a
cluster's ``users/<name>/``, a TensorBoard ``own/`` folder) from mtc's code without
going through mtc/userfs.py is a finding, and the test that caused it fails
(tests/conftest.py). A test's own setup (planting a link, reading what a job wrote) is
not mtc's and is let be, as are descriptor-relative calls (``dir_fd``: userfs's own)."""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path

from .apps import DJANGO_APPS

REPO = Path(__file__).resolve().parent.parent
TESTS = str(REPO / "tests") + os.sep
USERFS = str(REPO / "mtc" / "userfs.py")
NODE = str(REPO / "node") + os.sep
APPS = tuple(str(REPO / app) + os.sep for app in DJANGO_APPS)
# A user's home on a run root, or below it; a TensorBoard instance's own/ folder.
USER_TREE_RE = re.compile(r"/users/[a-z_][a-z0-9_-]{0,31}(?:/|$)|/tensorboard/[^/]+/u[0-9]+/own")
# event -> the positions of its path arguments (sys.audit's documented arguments).
EVENTS = {
    "open": (0,),
    "os.chown": (0,),
    "os.chmod": (0,),
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.link": (0, 1),
    "os.symlink": (1,),
    "os.truncate": (0,),
    "os.utime": (0,),
    "os.listdir": (0,),
    "os.scandir": (0,),
    "shutil.rmtree": (0,),
    "shutil.copyfile": (0, 1),
}
findings: list[str] = []
_lock = threading.Lock()
_installed = False


def _user_path(value) -> str | None:
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    elif isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.startswith("/"):
        # A descriptor, or a name relative to a dir_fd (userfs's calls; an absolute
        # path is resolved as a path whatever dir_fd says, so it is judged).
        return None
    return value if USER_TREE_RE.search(value) else None


def _culprit() -> str | None:
    """The first of mtc's own frames that made the call, or None when userfs or a test
    made it (frames of the standard library, site-packages and node/ are passed by)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name == USERFS or name.startswith(TESTS):
            return None
        if name.startswith(APPS) and not name.startswith(NODE):
            return f"{os.path.relpath(name, REPO)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return None


def _hook(event: str, args: tuple) -> None:
    positions = EVENTS.get(event)
    if positions is None or os.geteuid() != 0:
        return
    for position in positions:
        if position >= len(args) or (path := _user_path(args[position])) is None:
            continue
        culprit = _culprit()
        if culprit is not None:
            with _lock:
                findings.append(f"{event} {path} from {culprit}")
        return


def install() -> None:
    """Once per process (an audit hook cannot be removed)."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


def take() -> list[str]:
    with _lock:
        taken = findings[:]
        findings.clear()
    return taken
