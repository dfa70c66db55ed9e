"""single-user: every job runs as mtc's own user (mtc is not root). Not isolated."""

from __future__ import annotations

import os
import pwd

from .base import AccountData

isolated = False


def account_data() -> AccountData:
    uid = os.geteuid()
    try:
        entry = pwd.getpwuid(uid)
        name, home = entry.pw_name, entry.pw_dir
    except KeyError:  # a uid without a passwd entry (containers)
        name, home = str(uid), os.environ.get("HOME", "/")
    return AccountData(name=name, uid=uid, gid=os.getegid(), home=home)
