#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks: Debian packages (apt-get, with
# sudo when not root) and the .venv from pyproject.toml. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# slurmrestd: each local cluster runs one, on a unix socket, for fast job submits.
# slurm-wlm-jwt-plugin: slurmctld's auth/jwt, for submits as their owner through slurmrestd.
# slapd + ldap-utils: the tests' private directory; libldap2-dev libsasl2-dev: python-ldap builds.
# postgresql: `make test` runs the database tests a second time on a private server.
# mariadb-server and slurmdbd: Slurm accounting (mtc/accounting.py runs a private
# MariaDB and slurmdbd; the system-wide service is stopped below, never used).
# debootstrap: tests/test_gce_image.py provisions the gce node image in a Debian 12 chroot.
# nftables: mtc/firewall.py keeps jobs' accounts off mtc's listeners on this host.
PACKAGES=(slurm-wlm slurmrestd slurm-wlm-jwt-plugin munge redis-server postgresql chromium python3-venv procps slapd ldap-utils libldap2-dev libsasl2-dev python3-dev mariadb-server slurmdbd debootstrap nftables)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ " ${missing[*]} " == *" mariadb-server "* ]]; then
    # Debian starts a system-wide MariaDB on install: mtc runs its own, so stop that one.
    $SUDO service mariadb stop >/dev/null 2>&1 || true
    if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
      $SUDO systemctl disable --now mariadb >/dev/null 2>&1 || true
    else
      $SUDO update-rc.d mariadb disable >/dev/null 2>&1 || true
    fi
  fi
fi

# Jobs run as their owners' own accounts and use this .venv (torch, the node runtime):
# its interpreter must be one every account may run, so Debian's /usr/bin/python3 comes
# first (a pyenv or conda python under /root is out of reach of other users).
PY=${PYTHON:-}
if [[ -z $PY ]]; then
  PY=python3
  [[ -x /usr/bin/python3 ]] && PY=/usr/bin/python3
fi
base_home=$(sed -n 's/^home = //p' .venv/pyvenv.cfg 2>/dev/null || true)
want_home=$(dirname "$(command -v "$PY")")
if [[ -x .venv/bin/python && -n $base_home && $base_home != "$want_home" && -z ${PYTHON:-} ]]; then
  echo "setup: .venv was made from $base_home; remaking it from $want_home"
  rm -rf .venv
fi
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.mtc-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  echo "setup: installing Python packages into .venv"
  # pip's notes about unreachable local indexes are noise here.
  .venv/bin/pip install -q -e ".[dev]" 2> >(grep -v "is ignored: it is neither" >&2)
  touch "$stamp"
fi
