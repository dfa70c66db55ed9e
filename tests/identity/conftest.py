"""The `slapd` fixture: one private directory per test session, started only when asked."""

from __future__ import annotations

import pytest

from tests.ldap_server import Slapd, env_seed


@pytest.fixture(scope="session")
def slapd(tmp_path_factory):
    server = Slapd(tmp_path_factory.mktemp("ldap"), seed=env_seed()).start()
    yield server
    server.stop()
    server.local_accounts_remove()


@pytest.fixture
def ldap_mode(settings, slapd):
    """mtc configured for the test directory, as MTC_IDENTITY=ldap with MTC_LDAP_* would."""
    settings.MTC_IDENTITY = "ldap"
    for key, value in slapd.settings().items():
        setattr(settings, key, value)
    settings.AUTHENTICATION_BACKENDS = [
        "axes.backends.AxesStandaloneBackend",
        "identity.ldap_backend.DirectoryBackend",
        "django.contrib.auth.backends.ModelBackend",
    ]
    return slapd
