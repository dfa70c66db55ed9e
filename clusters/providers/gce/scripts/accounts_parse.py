"""Reads the mtc-accounts metadata value (JSON) on stdin and prints name:uid:gid:home
lines for the startup script's useradd loop. A node checks again what mtc rendered:
anything that is not a plain POSIX account (root, a system uid, a name or home a
shell or /etc/passwd could misread) fails the boot instead of being created."""

import json
import re
import sys

NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
HOME = re.compile(r"^/[A-Za-z0-9._/-]*$")
accounts = json.load(sys.stdin)
for a in accounts:
    name, uid, gid, home = a["name"], a["uid"], a["gid"], a["home"]
    ids_ok = all(type(v) is int and 1000 <= v <= 2**31 - 2 for v in (uid, gid))
    if not (NAME.fullmatch(name) and ids_ok and HOME.fullmatch(home) and "/../" not in home + "/"):
        sys.exit(f"mtc: refusing account {a!r}")
    print(f"{name}:{uid}:{gid}:{home}")
