"""Redis with a password of mtc's own: jobs run on this host as other accounts and may
connect to any loopback port, so the Redis mtc starts refuses everyone who does not log
in as its ``mtc`` ACL user (the default user is off). The password lives in
``$MTC_DATA_DIR/redis_password`` (0600, made on first use, like ``secret_key``); the
server reads it from a 0600 config file, never from its command line (which every
account may read in /proc). No Django here: settings and `make run` use it."""

from __future__ import annotations

import secrets
from pathlib import Path
from urllib.parse import quote, urlparse, urlunparse

from .secretfile import secret_create, secret_write

REDIS_USER = "mtc"
PASSWORD_FILE = "redis_password"


def redis_password(data_dir: Path | str) -> str:
    path = Path(data_dir) / PASSWORD_FILE
    secret_create(path, secrets.token_urlsafe(32))
    return path.read_text().strip()


def has_credentials(url: str) -> bool:
    parsed = urlparse(url)
    return bool(parsed.password or parsed.username)


def with_credentials(url: str, password: str, user: str = REDIS_USER) -> str:
    """``url`` logging in as ``user`` (a URL that names credentials keeps its own)."""
    if has_credentials(url):
        return url
    parsed = urlparse(url)
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{parsed.hostname}"
    if parsed.port:
        netloc += f":{parsed.port}"
    return urlunparse(parsed._replace(netloc=netloc))


def without_credentials(url: str) -> str:
    """For messages: the URL with its password left out."""
    parsed = urlparse(url)
    if not has_credentials(url):
        return url
    netloc = f"{parsed.username or ''}:***@{parsed.hostname}"
    if parsed.port:
        netloc += f":{parsed.port}"
    return urlunparse(parsed._replace(netloc=netloc))


def server_config(
    path: Path, *, port: int, password: str, directory: Path, user: str = REDIS_USER
) -> Path:
    """A redis-server config (0600) for loopback ``port``: the default user off, mtc's
    user with every key, channel and command."""
    text = "\n".join(
        [
            f"port {port}",
            "bind 127.0.0.1",
            'save ""',
            "appendonly no",
            f"dir {directory}",
            "daemonize no",
            "user default off",
            f"user {user} on >{password} ~* &* +@all",
            "",
        ]
    )
    secret_write(path, text)
    return path


def main(argv: list[str]) -> int:
    """``python -m mtc.redisauth config PATH PORT DIR``: a config for a Redis of its own
    (a fresh password, kept only in PATH, 0600); prints the URL that logs in to it."""
    if len(argv) != 4 or argv[0] != "config":
        print("usage: python -m mtc.redisauth config PATH PORT DIR")
        return 2
    password = secrets.token_urlsafe(32)
    server_config(Path(argv[1]), port=int(argv[2]), password=password, directory=Path(argv[3]))
    print(with_credentials(f"redis://127.0.0.1:{int(argv[2])}/0", password))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
