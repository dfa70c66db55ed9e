"""Sign-in with the directory password: django-auth-ldap, configured from the same
MTC_LDAP_* settings the `ldap` identity source reads, so one set of variables
describes the directory (no AUTH_LDAP_* settings to keep in step)."""

from __future__ import annotations

import ldap
from django.conf import settings
from django_auth_ldap.backend import LDAPBackend
from django_auth_ldap.config import LDAPSearch


def connection_options() -> dict:
    # A directory that does not answer must not hang a sign-in or a submit.
    return {
        ldap.OPT_NETWORK_TIMEOUT: settings.MTC_LDAP_TIMEOUT_S,
        ldap.OPT_TIMEOUT: settings.MTC_LDAP_TIMEOUT_S,
        ldap.OPT_REFERRALS: 0,
    }


class DirectoryBackend(LDAPBackend):
    """LDAPBackend whose settings are built from MTC_LDAP_* each time it is made
    (Django makes a backend per authenticate call, so test overrides apply)."""

    @property
    def default_settings(self) -> dict:
        return {
            "SERVER_URI": settings.MTC_LDAP_URI,
            "BIND_DN": settings.MTC_LDAP_BIND_DN,
            "BIND_PASSWORD": settings.MTC_LDAP_BIND_PASSWORD,
            "USER_SEARCH": LDAPSearch(
                settings.MTC_LDAP_USER_BASE, ldap.SCOPE_SUBTREE, settings.MTC_LDAP_USER_FILTER
            ),
            "USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
            "CONNECTION_OPTIONS": connection_options(),
        }
