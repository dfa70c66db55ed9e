"""Secret files are born private: created with mode 0600 by ``os.open``, never
written first and chmod-ed afterwards (a window in which anyone could read them)."""

from __future__ import annotations

import os
from pathlib import Path


def secret_write(path: Path | str, data: bytes | str, *, mode: int = 0o600) -> None:
    """Write a new secret file (or replace one: a fresh private file renamed over
    it, so the old and new contents are never readable by others)."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def secret_create(path: Path | str, data: bytes | str, *, mode: int = 0o600) -> bool:
    """Write the secret only if the file does not exist yet; False when it did (two
    processes racing to make it keep the first one's)."""
    if isinstance(data, str):
        data = data.encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return True


def private_append(path: Path | str):
    """A log file opened for appending, created 0600 when new."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, "ab")


def private_dir(path: Path | str, mode: int = 0o700) -> Path:
    """A directory only its owner may enter (or with ``mode``, e.g. 0711: others may
    pass through to a subdirectory they own, but not list it)."""
    path = Path(path)
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != mode:
        os.chmod(path, mode)
    return path
