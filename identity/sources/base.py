from dataclasses import dataclass


@dataclass(frozen=True)
class AccountData:
    name: str  # POSIX user name
    uid: int
    gid: int
    home: str


class IdentityMissing(Exception):
    """The user has no POSIX identity in the configured source
    (HTTP 403, message names what is missing)."""
