"""mtc.userfs, the one way mtc (root) touches a user's tree, against what a user can
plant there: links, FIFOs, files of root's or of another user's, swaps mid-walk."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from mtc import userfs
from mtc.userfs import UnsafePath

from ..unix import spare_uids

pytestmark = [
    pytest.mark.security,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: it plays mtc"),
]


@pytest.fixture
def tree(tmp_path):
    """users/<u>/ as mtc lays it out (users/ root's 0711, the home the user's 0700), and
    a folder of root's alone with a secret in it, which no call may change or read."""
    uid = spare_uids(2)
    user = userfs.Ids(uid, uid)
    other = userfs.Ids(uid + 1, uid + 1)
    os.chmod(tmp_path, 0o711)
    users = tmp_path / "users"
    users.mkdir(mode=0o711)
    home = users / "u"
    home.mkdir(mode=0o700)
    os.chown(home, uid, uid)
    secret_dir = tmp_path / "rootonly"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "secret").write_text("root's secret\n")
    os.chmod(secret_dir / "secret", 0o600)
    return dict(root=tmp_path, home=home, user=user, other=other, secret_dir=secret_dir)


def as_user(path: Path, ids) -> Path:
    os.lchown(path, ids.uid, ids.gid)
    return path


def untouched(secret_dir: Path) -> None:
    info = secret_dir.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700)
    assert sorted(os.listdir(secret_dir)) == ["secret"]
    assert (secret_dir / "secret").read_text() == "root's secret\n"
    assert (secret_dir / "secret").stat().st_uid == 0


def test_a_link_planted_for_a_folder_is_refused_and_its_target_untouched(tree):
    home, user = tree["home"], tree["user"]
    (home / "work").symlink_to(tree["secret_dir"])
    as_user(home / "work", user)
    with pytest.raises(UnsafePath, match="symbolic link"):
        userfs.dir_own(home / "work", user)
    with pytest.raises(UnsafePath):
        userfs.dir_own(home / "work" / "inside", user)
    untouched(tree["secret_dir"])


def test_a_link_in_the_middle_of_a_path_is_refused(tree):
    home, user = tree["home"], tree["user"]
    (home / "runs").symlink_to(tree["root"])  # runs -> the folder above users/
    with pytest.raises(UnsafePath):
        userfs.dir_own(home / "runs" / "rootonly", user)
    with pytest.raises(UnsafePath):
        userfs.read_bytes(home / "runs" / "rootonly" / "secret", limit=100)
    with pytest.raises(UnsafePath):
        userfs.write(home / "runs" / "rootonly" / "secret", "x", account=user)
    untouched(tree["secret_dir"])


def test_links_in_mtcs_own_folders_are_followed(tree):
    root = tree["root"]
    real = root / "real"
    real.mkdir()
    (real / "f").write_text("mtc's\n")
    (root / "alias").symlink_to("real")  # relative, in a folder only root writes
    (root / "up").symlink_to(f"../{root.name}/real")
    assert userfs.read_text(root / "alias" / "f") == "mtc's\n"
    assert userfs.read_text(root / "up" / "f") == "mtc's\n"
    assert userfs.list_dir(root / "alias") == ["f"]


def test_a_folder_of_another_uid_or_of_roots_inside_a_users_tree_is_refused(tree):
    home, user, other = tree["home"], tree["user"], tree["other"]
    theirs = home / "theirs"
    theirs.mkdir()
    as_user(theirs, other)
    roots = home / "roots"
    roots.mkdir(mode=0o755)  # as if the user had moved a folder of root's in
    with pytest.raises(UnsafePath, match="belongs to uid"):
        userfs.dir_own(theirs, user)
    with pytest.raises(UnsafePath, match="belongs to uid"):
        userfs.dir_own(roots, user)
    with pytest.raises(UnsafePath):
        userfs.dir_own(theirs / "x", user)
    assert theirs.stat().st_uid == other.uid and roots.stat().st_uid == 0


def test_folders_are_made_the_accounts_and_a_leftover_of_mtcs_is_handed_over(tree):
    home, user = tree["home"], tree["user"]
    made = userfs.dir_own(home / "output", user)
    info = made.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (user.uid, 0o700)
    fresh = tree["root"] / "users" / "v"  # users/<v> left root's by a run that stopped
    fresh.mkdir()
    userfs.dir_own(fresh, tree["other"])
    assert fresh.stat().st_uid == tree["other"].uid
    with pytest.raises(UnsafePath, match="would be made in uid"):
        userfs.dir_pass(home / "shared")


def test_reads_refuse_links_fifos_and_files_that_are_not_the_users(tree):
    home, user, other = tree["home"], tree["user"], tree["other"]
    (home / "link").symlink_to(tree["secret_dir"] / "secret")
    os.mkfifo(home / "fifo")
    as_user(home / "fifo", user)
    (home / "roots").write_text("a file of root's in the user's folder\n")
    (home / "others").write_text("another user's\n")
    as_user(home / "others", other)
    (home / "mine").write_text("theirs to read\n")
    as_user(home / "mine", user)
    started = time.monotonic()
    for name in ("link", "fifo", "roots", "others"):
        with pytest.raises(UnsafePath):
            userfs.read_bytes(home / name, limit=1000)
        with pytest.raises(UnsafePath):
            userfs.append(home / name, b"mtc's line\n")
        assert not userfs.is_file(home / name)
    assert time.monotonic() - started < 1.0  # a FIFO never blocks a read
    assert userfs.read_bytes(home / "mine", limit=1000) == b"theirs to read\n"
    with pytest.raises(UnsafePath):
        userfs.read_bytes(home / "mine", limit=1000, owner=other.uid)
    untouched(tree["secret_dir"])


def test_a_write_replaces_a_planted_link_and_never_writes_through_it(tree):
    home, user = tree["home"], tree["user"]
    (home / "token").symlink_to(tree["secret_dir"] / "secret")
    userfs.write(home / "token", "abc\n", account=user)
    info = os.lstat(home / "token")
    assert stat.S_ISREG(info.st_mode) and info.st_uid == user.uid
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert (home / "token").read_text() == "abc\n"
    untouched(tree["secret_dir"])
    with pytest.raises(UnsafePath, match="uid"):
        userfs.write(home / "token", "x", account=tree["other"])  # not the other's folder


def test_remove_takes_links_away_and_never_what_they_point_to(tree):
    home = tree["home"]
    runs = home / "runs"
    runs.mkdir()
    (runs / "link").symlink_to(tree["secret_dir"])
    (runs / "real").mkdir()
    (runs / "real" / "inner").symlink_to(tree["secret_dir"] / "secret")
    for path in (runs, runs / "link", runs / "real", runs / "real" / "inner"):
        as_user(path, tree["user"])
    assert userfs.remove(runs / "link")
    assert userfs.remove(runs)
    assert not runs.exists()
    untouched(tree["secret_dir"])
    assert not userfs.remove(home / "gone")


def test_a_new_folder_is_exclusive_and_filled_through_its_descriptor(tree):
    home, user = tree["home"], tree["user"]
    runs = userfs.dir_own(home / "runs", user)
    (runs / "taken").symlink_to(tree["secret_dir"])
    with pytest.raises(FileExistsError):
        with userfs.dir_new(runs / "taken", user):
            pass
    with userfs.dir_new(runs / "r1", user) as fd:
        os.rename(runs / "r1", runs / "moved")  # the user moves it meanwhile
        (runs / "r1").symlink_to(tree["secret_dir"])
        os.close(userfs.mkdir_at(fd, "checkpoints", user))
        userfs.write_at(fd, "run.json", "{}\n", account=user)
    assert sorted(os.listdir(runs / "moved")) == ["checkpoints", "run.json"]
    assert {p.stat().st_uid for p in (runs / "moved").iterdir()} == {user.uid}
    untouched(tree["secret_dir"])


def test_reads_while_the_user_flips_a_file_for_a_link_and_a_fifo_get_nothing_foreign(tree):
    home, user = tree["home"], tree["user"]
    target = home / "slurm-1.out"
    stop = threading.Event()

    def flip():
        n = 0
        while not stop.is_set():
            tmp = home / f".flip{n % 3}"
            with contextlib.suppress(OSError):
                tmp.unlink()
            if n % 3 == 0:
                tmp.write_text("mine\n")
                as_user(tmp, user)
            elif n % 3 == 1:
                tmp.symlink_to(tree["secret_dir"] / "secret")
            else:
                os.mkfifo(tmp)
            os.replace(tmp, target)
            n += 1

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    seen, slowest = set(), 0.0
    try:
        for _ in range(2000):
            started = time.monotonic()
            try:
                seen.add(userfs.read_at(target, offset=0, limit=100)[0])
            except OSError:
                seen.add(None)
            slowest = max(slowest, time.monotonic() - started)
    finally:
        stop.set()
        flipper.join()
    assert b"mine\n" in seen and None in seen
    assert seen <= {b"mine\n", None, b""}, seen
    assert slowest < 1.0
