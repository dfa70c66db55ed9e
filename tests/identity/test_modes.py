"""Which identity mode mtc is in, and that it says so: local accounts made for new
users, local by default as root, single-user (with its reason) otherwise."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from identity import selectors
from identity.models import PosixAccount
from identity.services import account_ensure
from identity.sources import local


def test_forced_single_user_says_so_in_the_api_and_on_every_page(db, settings, client, user):
    settings.MTC_IDENTITY = "single-user"
    client.force_login(user)
    identity = client.get("/api/v1/me").json()["identity"]
    assert identity["mode"] == "single-user" and identity["isolated"] is False
    assert "MTC_IDENTITY=single-user" in identity["reason"]
    page = client.get("/profile/").content.decode()
    assert "jobs run as one account: not isolated" in page
    assert "MTC_IDENTITY=single-user is configured." in page


def test_local_mode_has_no_banner(db, settings, client, user):
    settings.MTC_IDENTITY = "local"
    client.force_login(user)
    identity = client.get("/api/v1/me").json()["identity"]
    assert identity["mode"] == "local" and identity["isolated"] is True
    assert identity["reason"] == "" and identity["uid"] != 0
    assert "not isolated" not in client.get("/profile/").content.decode()


def test_as_root_the_default_is_local_unless_jobs_cannot_run_mtcs_programs(settings, monkeypatch):
    settings.MTC_IDENTITY = ""
    monkeypatch.setattr(selectors, "job_runtime_problem", lambda: "")
    assert selectors.identity_mode() == "local"
    monkeypatch.setattr(selectors, "job_runtime_problem", lambda: "the .venv is out of reach")
    assert selectors.identity_mode() == "single-user"
    assert selectors.single_user_reason() == "the .venv is out of reach"


def test_an_interpreter_behind_a_closed_directory_is_named(tmp_path, monkeypatch):
    closed = tmp_path / "root-only"
    closed.mkdir(mode=0o700)
    interpreter = closed / "python3"
    interpreter.write_text("")
    interpreter.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(interpreter))
    problem = selectors.job_runtime_problem.__wrapped__()
    assert f"{closed} is not passable" in problem and "mtc's Python" in problem


@pytest.fixture
def open_tmp():
    """A scratch dir other accounts can reach (pytest's own tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="mtc-modes-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_without_root_the_resolver_says_single_user_whatever_is_configured(open_tmp):
    """The resolver itself, in a process that really is not root."""
    if selectors.job_runtime_problem():
        pytest.skip(
            f"this checkout is out of reach of other accounts: {selectors.job_runtime_problem()}"
        )
    nobody = pwd.getpwnam("nobody")
    data = open_tmp / "data"
    data.mkdir()
    os.chown(data, nobody.pw_uid, nobody.pw_gid)
    code = (
        "import django; django.setup();"
        "from identity.selectors import identity_mode, single_user_reason;"
        "print(identity_mode()); print(single_user_reason())"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(django_settings.BASE_DIR),
        "DJANGO_SETTINGS_MODULE": "mtc.settings",
        "MTC_DATA_DIR": str(data),
        "MTC_IDENTITY": "local",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code],
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
        env=env,
        cwd=str(data),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    mode, reason = proc.stdout.splitlines()[-2:]
    assert mode == "single-user"
    assert reason == "mtc is not running as root, so it cannot start jobs as anyone else."


@pytest.mark.django_db(transaction=True)
def test_a_new_user_gets_a_local_account_at_once(settings, django_user_model):
    settings.MTC_IDENTITY = "local"
    low, high = local.uid_range()
    user = django_user_model.objects.create_user("lena", password="pw-lena-123")
    account = PosixAccount.objects.get(user=user)
    entry = pwd.getpwnam(account.name)
    assert low <= account.uid <= high and entry.pw_uid == account.uid == account.gid
    assert account.name in ("lena", local.derived_name("lena", account.uid))
    home = Path(account.home)
    assert home.parent == Path(django_settings.DATA_DIR) / "home"
    assert home.stat().st_uid == account.uid and stat.S_IMODE(home.stat().st_mode) == 0o700

    odd = django_user_model.objects.create_user("Bob.Smith@example.org", password="pw-bob-123")
    odd_account = PosixAccount.objects.get(user=odd)
    assert local.POSIX_NAME_RE.fullmatch(odd_account.name) and odd_account.uid != account.uid

    # The database forgets the account (a restore): the same user gets the same uid back.
    PosixAccount.objects.filter(user=user).delete()
    assert account_ensure(user=user).uid == account.uid
