"""A local cluster's JWT key (etc/jwt_hs256.key, 0600) and the tokens mtc mints
with it for slurmrestd, so REST submits can run as the job's owner.

slurmctld checks HS256 tokens with this key (``AuthAltTypes=auth/jwt``). mtc mints
each request's token for the user it acts for (``sun``: the owner's name), as
``scontrol token username=<owner>`` would: slurmctld then authenticates the request as
the owner and judges its options as theirs. (A root token with ``X-SLURM-USER-NAME``
speaks for anyone: one that leaked from a request would be root on the cluster.)"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path

from mtc.secretfile import secret_create

TOKEN_LIFESPAN_S = 600


def key_path(root: Path) -> Path:
    path = root / "etc" / "jwt_hs256.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        secret_create(path, os.urandom(32))
    return path


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(root: Path, *, user: str = "root", lifespan: int = TOKEN_LIFESPAN_S) -> str:
    """An HS256 token for ``user`` (Slurm's claims: ``sun``, ``iat``, ``exp``)."""
    now = int(time.time())
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = _b64(json.dumps({"sun": user, "iat": now, "exp": now + lifespan}).encode())
    signing = f"{header}.{claims}".encode()
    key = key_path(root).read_bytes()
    signature = _b64(hmac.new(key, signing, hashlib.sha256).digest())
    return f"{header}.{claims}.{signature}"


def own_name() -> str:
    """The user mtc runs as, whose token it mints (root: it may speak for anyone)."""
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())
