"""The only way mtc, as root, touches a user's tree: their folders on a cluster's run
root (``users/<name>/``: output, work, runs, serving), their TensorBoard folder and
home. A user's job can rename, replace and link anything in those folders at any moment,
so nothing here trusts a path: every call walks it from ``/`` one component at a time,
each opened relative to the one above it (``openat``), and acts on descriptors.

- A symbolic link is followed only inside a directory only mtc could have put it in:
  one owned by root (or mtc's own uid) that neither its group nor others may write.
  Anywhere else (a user's folder, ``/tmp``) a link is refused (``UnsafePath``).
- The first directory on the way that belongs to another uid starts that user's tree:
  every directory below it, and the file at the end, must belong to the same uid (a
  file or folder of root's or of another user's found there is refused, never handed
  over or read).
- Files are opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked with ``fstat``: a regular
  file (or a directory where one is asked for), so a FIFO planted where a file is
  expected cannot hang a poller, and a device or socket is never read.
- Directories are made with ``mkdir(dir_fd=)``, and chowned and chmodded through the
  descriptor mtc opened (``fchown``/``fchmod``); files are created ``O_EXCL`` and renamed
  into place within the same directory descriptor; trees are removed by descriptor.

``UnsafePath`` is an ``OSError``: a poller that treats an unreadable file as "nothing
yet" goes on with its other jobs. docs/security.md has the boundary and its tests.

(Past 400 lines by design: this is the one module every root touch of a user's tree goes
through; its walk and its operations share the rules above and are read together.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LOOKUP = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 32  # links followed in one walk (the kernel's own limit is 40)


class Owner(Protocol):
    """A Unix account (identity.runas.Account has these)."""

    uid: int
    gid: int


@dataclass(frozen=True)
class Ids:
    """An owner given by number (a home made before its account row exists)."""

    uid: int
    gid: int


class UnsafePath(OSError):
    """The path leads through a link a user could have made, or to something that is not
    what was asked for (a FIFO, a link, another uid's file)."""

    def __init__(self, path: str | Path, why: str) -> None:
        super().__init__(errno.EPERM, f"{path}: {why}")
        self.path = str(path)
        self.why = why


def _me() -> set[int]:
    return {0, os.geteuid()}


@dataclass
class _Dir:
    """An open directory on the way down, and what the walk knows of it."""

    fd: int
    path: str  # as walked, for messages
    uid: int
    owner: int | None  # the user whose tree this is; None in mtc's (root's) part
    trusted: bool  # links in it may be followed


def _dir_state(fd: int, path: str, above: _Dir | None) -> _Dir:
    info = os.fstat(fd)
    owner = above.owner if above is not None else None
    if owner is None and info.st_uid not in _me():
        owner = info.st_uid  # a user's tree begins here
    elif owner is not None and info.st_uid != owner:
        os.close(fd)
        raise UnsafePath(path, f"belongs to uid {info.st_uid} inside uid {owner}'s folder")
    trusted = owner is None and info.st_uid in _me() and not info.st_mode & 0o022
    return _Dir(fd=fd, path=path, uid=info.st_uid, owner=owner, trusted=trusted)


def _parts(path: str | Path) -> list[str]:
    text = os.fspath(path)
    if not text.startswith("/"):
        raise UnsafePath(text, "not an absolute path")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts:  # mtc builds its paths: one with '..' is nobody's to walk
        raise UnsafePath(text, "holds '..'")
    return parts


class _Walk:
    """The directories from ``/`` down to the current one (so ``..`` in a link mtc made
    goes back to the real parent), each open until ``close``."""

    def __init__(self) -> None:
        fd = os.open("/", _DIR)
        self.stack = [_dir_state(fd, "/", None)]
        self.links = 0

    @property
    def here(self) -> _Dir:
        return self.stack[-1]

    def close(self) -> None:
        for entry in self.stack:
            os.close(entry.fd)
        self.stack = []

    def _name(self, name: str) -> str:
        return os.path.join(self.here.path, name)

    def link_target(self, name: str) -> list[str] | None:
        """The parts a link called ``name`` here stands for (restarting at ``/`` when it
        is absolute), or None when ``name`` is no link. Refused where a user could have
        made it."""
        try:
            info = os.stat(name, dir_fd=self.here.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISLNK(info.st_mode):
            return None
        if not self.here.trusted:
            raise UnsafePath(self._name(name), "is a symbolic link in a folder a user can write")
        self.links += 1
        if self.links > MAX_LINKS:
            raise UnsafePath(self._name(name), "too many levels of symbolic links")
        target = os.readlink(name, dir_fd=self.here.fd)
        if target.startswith("/"):
            while len(self.stack) > 1:
                os.close(self.stack.pop().fd)
        return [p for p in target.split("/") if p not in ("", ".")]

    def down(self, name: str) -> None:
        """Into the directory ``name`` (a link to one where mtc's own folders allow)."""
        pending = [name]
        while pending:
            part = pending.pop(0)
            if part == "..":
                if len(self.stack) > 1:
                    os.close(self.stack.pop().fd)
                continue
            try:
                fd = os.open(part, _DIR, dir_fd=self.here.fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                target = self.link_target(part)
                if target is None:
                    raise UnsafePath(self._name(part), "is not a directory") from exc
                pending[:0] = target
                continue
            self.stack.append(_dir_state(fd, self._name(part), self.here))


def _walk_to_parent(path: str | Path) -> tuple[_Walk, str]:
    """The walk standing in the directory that holds the last component (links there
    resolved where mtc's folders allow), and that component's name."""
    parts = _parts(path)
    if not parts:
        raise UnsafePath(path, "is /")
    walk = _Walk()
    try:
        for part in parts[:-1]:
            walk.down(part)
        name = parts[-1]
        # A link at the end is resolved only in mtc's folders; in a user's, the call acts
        # on the name itself (replaced or removed, or refused by O_NOFOLLOW).
        while walk.here.trusted and (target := walk.link_target(name)) is not None:
            if not target:
                raise UnsafePath(path, "is a link to /")
            for part in target[:-1]:
                walk.down(part)
            name = target[-1]
            if name == "..":
                raise UnsafePath(path, "is a link ending in '..'")
    except BaseException:
        walk.close()
        raise
    return walk, name


@contextlib.contextmanager
def _parent(path: str | Path) -> Iterator[tuple[_Dir, str]]:
    walk, name = _walk_to_parent(path)
    try:
        yield walk.here, name
    finally:
        walk.close()


def _check_owner(info: os.stat_result, where: _Dir, path: str | Path, owner: int | None) -> None:
    expected = owner if owner is not None else where.owner
    if expected is not None and info.st_uid != expected:
        raise UnsafePath(path, f"belongs to uid {info.st_uid}, not {expected}")


def _open_in(where: _Dir, name: str, flags: int, path: str | Path, mode: int = 0o600) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=where.fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_DIRECTORY on a link: ENOTDIR
            try:
                info = os.stat(name, dir_fd=where.fd, follow_symlinks=False)
                link = stat.S_ISLNK(info.st_mode)
            except OSError:
                link = False
            if link:
                raise UnsafePath(path, "is a symbolic link") from exc
            if exc.errno == errno.ENOTDIR:
                raise UnsafePath(path, "is not a directory") from exc
            raise UnsafePath(path, "is a symbolic link") from exc
        if exc.errno == errno.ENXIO:
            raise UnsafePath(path, "is a FIFO or socket") from exc
        raise


def _open_file(path: str | Path, flags: int, owner: int | None) -> int:
    """A descriptor of the regular file at ``path`` (in a user's tree, theirs), blocking
    again once it is known to be one (it was opened O_NONBLOCK: a FIFO never waits)."""
    with _parent(path) as (where, name):
        fd = _open_in(where, name, flags, path)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(path, "is not a regular file")
        _check_owner(info, where, path, owner)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


# --- reading ----------------------------------------------------------------------------
@contextlib.contextmanager
def open_read(path: str | Path, *, owner: int | None = None) -> Iterator[BinaryIO]:
    """A regular file opened for reading. In a user's tree it must be that user's;
    ``owner`` (a uid) asks for it wherever it is."""
    fd = _open_file(path, _READ, owner)
    with os.fdopen(fd, "rb") as fh:
        yield fh


def read_bytes(path: str | Path, *, limit: int, owner: int | None = None) -> bytes:
    """At most ``limit`` bytes from the start of the file."""
    with open_read(path, owner=owner) as fh:
        return fh.read(limit)


def read_text(path: str | Path, *, limit: int = 16 * 2**20, owner: int | None = None) -> str:
    return read_bytes(path, limit=limit, owner=owner).decode("utf-8", errors="replace")


def read_tail(path: str | Path, *, limit: int, owner: int | None = None) -> tuple[bytes, int]:
    """(the last ``limit`` bytes, the file's size)."""
    with open_read(path, owner=owner) as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - limit))
        return fh.read(limit), size


def read_at(
    path: str | Path, *, offset: int, limit: int, owner: int | None = None
) -> tuple[bytes, int]:
    """(at most ``limit`` bytes from ``offset``, the file's size)."""
    with open_read(path, owner=owner) as fh:
        size = fh.seek(0, os.SEEK_END)
        if offset >= size:
            return b"", size
        fh.seek(offset)
        return fh.read(limit), size


def lookup(path: str | Path, *, owner: int | None = None) -> os.stat_result:
    """The file's or directory's status, never through a link a user could have made
    (raises UnsafePath for a link, FileNotFoundError when missing)."""
    with _parent(path) as (where, name):
        fd = _open_in(where, name, _LOOKUP, path)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePath(path, "is a symbolic link")
    _check_owner(info, where, path, owner)
    return info


def is_file(path: str | Path) -> bool:
    """A regular file that may be read here (False for a link, a FIFO, a missing one)."""
    try:
        return stat.S_ISREG(lookup(path).st_mode)
    except OSError:
        return False


def is_dir(path: str | Path) -> bool:
    try:
        return stat.S_ISDIR(lookup(path).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def open_dir(path: str | Path, *, owner: int | None = None) -> Iterator[int]:
    """A descriptor of the directory (never a link a user could have made)."""
    walk = _Walk()
    try:
        for part in _parts(path):
            walk.down(part)
        if owner is not None and walk.here.uid != owner:
            raise UnsafePath(path, f"belongs to uid {walk.here.uid}, not {owner}")
        yield walk.here.fd
    finally:
        walk.close()


def list_dir(path: str | Path, *, owner: int | None = None) -> list[str]:
    """The names in a directory."""
    with open_dir(path, owner=owner) as fd:
        return os.listdir(fd)


# --- writing ----------------------------------------------------------------------------
def _give(fd: int, account: Owner | None, mode: int) -> None:
    if account is not None and os.geteuid() == 0:
        info = os.fstat(fd)
        if (info.st_uid, info.st_gid) != (account.uid, account.gid):
            os.fchown(fd, account.uid, account.gid)
    os.fchmod(fd, mode)


def _given(fd: int, account: Owner | None, mode: int) -> int:
    """``fd`` handed to the account (closed if that fails)."""
    try:
        _give(fd, account, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fill(fd: int, data: bytes, account: Owner | None, mode: int) -> None:
    """Hand a new file to the account, write it whole, close it."""
    try:
        _give(fd, account, mode)
        _write_all(fd, data)
    finally:
        os.close(fd)


def _account_may_write(where: _Dir, path: str | Path, account: Owner | None) -> None:
    """mtc writes for ``account`` only in mtc's folders or in that account's own tree."""
    mine = account.uid if account is not None else None
    if where.owner is not None and where.owner != mine:
        raise UnsafePath(path, f"lies in uid {where.owner}'s folder")


def append(path: str | Path, data: bytes, *, owner: int | None = None) -> None:
    """Add to the end of an existing regular file (a job's stderr, say)."""
    fd = _open_file(path, _APPEND, owner)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def write(path: str | Path, data: bytes | str, *, account: Owner | None, mode: int = 0o600) -> None:
    """Write a file, replacing whatever has the name (a link is replaced, never followed):
    a new file made ``O_EXCL`` beside it, the account's from the start, renamed over it."""
    if isinstance(data, str):
        data = data.encode()
    with _parent(path) as (where, name):
        _account_may_write(where, path, account)
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = _open_in(where, tmp, _CREATE, path, 0o600)
        try:
            _fill(fd, data, account, mode)
            os.rename(tmp, name, src_dir_fd=where.fd, dst_dir_fd=where.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=where.fd)
            raise


def create(path: str | Path, *, account: Owner | None, mode: int = 0o600) -> int:
    """A new empty file at ``path`` (whatever had the name is removed first, a link
    included), the account's; returns its descriptor open for writing."""
    with _parent(path) as (where, name):
        _account_may_write(where, path, account)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=where.fd)
        return _given(_open_in(where, name, _CREATE, path, 0o600), account, mode)


def dir_pass(path: str | Path, *, mode: int = 0o711) -> Path:
    """A folder of mtc's (root's), by default one others may pass through but not list
    (0711): made with any missing parents, each in mtc's part of the tree, never in a
    user's."""
    parts = _parts(path)
    walk = _Walk()
    try:
        for part in parts:
            try:
                walk.down(part)
                continue
            except FileNotFoundError:
                pass
            if walk.here.owner is not None:
                raise UnsafePath(path, f"would be made in uid {walk.here.owner}'s folder")
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o711, dir_fd=walk.here.fd)
            walk.down(part)
        here = walk.here
        if here.owner is None and here.uid == os.geteuid():
            if stat.S_IMODE(os.fstat(here.fd).st_mode) != mode:
                os.fchmod(here.fd, mode)
    finally:
        walk.close()
    return Path(path)


def _dir_make(path: str | Path, account: Owner | None, mode: int, *, new: bool) -> int:
    with _parent(path) as (where, name):
        _account_may_write(where, path, account)
        made = False
        try:
            os.mkdir(name, 0o700, dir_fd=where.fd)
            made = True
        except FileExistsError:
            if new:
                raise
        fd = _open_in(where, name, _DIR, path)
        try:
            info = os.fstat(fd)
            want = account.uid if account is not None else os.geteuid()
            # Handed over only when mtc made it, or found it in mtc's own folder (a run
            # that stopped between its mkdir and its chown): never what a user put there.
            leftover = where.owner is None and where.trusted and info.st_uid in _me()
            if info.st_uid != want and not (made or leftover):
                raise UnsafePath(path, f"belongs to uid {info.st_uid}, not {want}")
            _give(fd, account, mode)
        except BaseException:
            os.close(fd)
            raise
    return fd


def dir_own(path: str | Path, account: Owner | None, *, mode: int = 0o700) -> Path:
    """The account's folder at ``path`` (its parent must exist), made if missing; an
    existing one must already be the account's. ``account`` None: mtc's own."""
    os.close(_dir_make(path, account, mode, new=False))
    return Path(path)


@contextlib.contextmanager
def dir_new(path: str | Path, account: Owner | None, *, mode: int = 0o700) -> Iterator[int]:
    """A folder made now (FileExistsError when the name is taken), the account's; yields
    its descriptor, which stays that folder whatever the account renames meanwhile."""
    fd = _dir_make(path, account, mode, new=True)
    try:
        yield fd
    finally:
        os.close(fd)


def dir_temp(parent: str | Path, account: Owner | None, *, prefix: str) -> tuple[Path, int]:
    """A new uniquely named folder in ``parent``, the account's (0700), and its open
    descriptor (the caller closes it)."""
    for _ in range(100):
        path = Path(parent) / f"{prefix}{secrets.token_hex(6)}"
        try:
            return path, _dir_make(path, account, 0o700, new=True)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(parent))


def mkdir_at(dir_fd: int, name: str, account: Owner | None, *, mode: int = 0o700) -> int:
    """A new folder ``name`` inside a folder mtc holds open, the account's; returns its
    descriptor."""
    if "/" in name or name in ("", ".", ".."):
        raise UnsafePath(name, "is not one name")
    os.mkdir(name, 0o700, dir_fd=dir_fd)
    return _given(os.open(name, _DIR, dir_fd=dir_fd), account, mode)


def write_at(
    dir_fd: int, name: str, data: bytes | str, *, account: Owner | None, mode: int = 0o600
) -> None:
    """A new file ``name`` inside a folder mtc holds open (O_EXCL), the account's."""
    if isinstance(data, str):
        data = data.encode()
    _fill(os.open(name, _CREATE, 0o600, dir_fd=dir_fd), data, account, mode)


def remove(path: str | Path) -> bool:
    """Remove a file, link or whole tree at ``path`` without following a link anywhere in
    it or on the way to it. Returns whether something was there."""
    with _parent(path) as (where, name):
        try:
            info = os.stat(name, dir_fd=where.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=where.fd)
        else:
            os.unlink(name, dir_fd=where.fd)
    return True


def remove_below(root: str | Path, parts: tuple[str, ...] | list[str]) -> bool:
    """Remove ``root/<parts...>`` (a file or a tree) where no component below ``root`` is
    a link, not even one mtc could have made (a purge's rule: what it removes lies in
    the folder it purges). Returns whether something was removed."""
    if not parts or any(p in ("", ".", "..") or "/" in p for p in parts):
        return False
    with open_dir(root) as top:
        fds: list[int] = []
        try:
            here = top
            for part in parts[:-1]:
                try:
                    here = os.open(part, _DIR, dir_fd=here)
                except OSError:  # missing, a link, not a directory
                    return False
                fds.append(here)
            try:
                info = os.stat(parts[-1], dir_fd=here, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if stat.S_ISLNK(info.st_mode):
                return False
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(parts[-1], dir_fd=here)
            else:
                os.unlink(parts[-1], dir_fd=here)
            return True
        finally:
            for fd in fds:
                os.close(fd)
