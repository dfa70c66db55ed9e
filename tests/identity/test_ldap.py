"""The `ldap` identity source and sign-in, against the real slapd of tests/ldap_server.py."""

from __future__ import annotations

import pwd

import pytest
from django.contrib.auth import get_user_model

from identity.sources import ldap as source
from identity.sources.base import AccountData, IdentityMissing


def test_entry_with_posix_account_is_the_identity(db, ldap_mode):
    alice = get_user_model().objects.create_user(ldap_mode.username("alice"))
    assert source.account_data(alice) == AccountData(
        name=ldap_mode.username("alice"),
        uid=ldap_mode.uid("alice"),
        gid=ldap_mode.gid,
        home=str(ldap_mode.home_root / ldap_mode.username("alice")),
    )


def test_person_without_posix_account_is_told_what_is_missing(db, ldap_mode):
    carol = get_user_model().objects.create_user(ldap_mode.username("carol"))
    with pytest.raises(IdentityMissing) as err:
        source.account_data(carol)
    assert str(err.value) == (
        "no posixAccount (uidNumber, gidNumber, homeDirectory) for "
        f"uid={ldap_mode.username('carol')} in ou=people,dc=mtc,dc=test"
    )


def test_unknown_person_is_missing(db, ldap_mode):
    nobody = get_user_model().objects.create_user(ldap_mode.username("zed"))
    with pytest.raises(IdentityMissing, match="no directory entry"):
        source.account_data(nobody)


def test_materialise_makes_the_directory_account_locally(db, ldap_mode):
    bob = get_user_model().objects.create_user(ldap_mode.username("bob"))
    data = source.account_data(bob)
    source.account_materialise(data)
    source.account_materialise(data)  # a second call finds it and changes nothing
    entry = pwd.getpwnam(data.name)
    assert (entry.pw_uid, entry.pw_gid, entry.pw_dir) == (data.uid, data.gid, data.home)


def test_login_form_takes_the_directory_password(db, client, ldap_mode):
    name = ldap_mode.username("alice")
    page = client.post("/accounts/login/", {"username": name, "password": "wrong"})
    assert page.status_code == 200 and "_auth_user_id" not in client.session
    page = client.post(
        "/accounts/login/", {"username": name, "password": ldap_mode.passwords["alice"]}
    )
    assert page.status_code == 302
    user = get_user_model().objects.get(username=name)
    assert int(client.session["_auth_user_id"]) == user.pk
    assert (user.first_name, user.email) == ("Alice", "alice@mtc.test")
