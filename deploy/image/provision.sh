#!/bin/bash
# Makes a Debian 12 machine (a builder VM, or a chroot) into an mtc node image: Slurm
# 22.05 from Debian with munge, mtc's node runtime in /opt/mtc (the contract is
# clusters/providers/gce/image.py; docs/gce.md, "Building the image"). Runs as root;
# safe to run again. No secrets are baked in: the munge key Debian's package makes at
# install is removed (the startup script writes the cluster's own at every boot).
#
# Environment (all optional):
#   MTC_SOURCE      the mtc checkout whose node/ is copied (default: this script's repo)
#   MTC_PIP_ARGS    extra pip options, e.g. "--no-index --find-links /wheels"
#   MTC_APT_CACHE   a directory apt keeps its .debs in (not cleaned; for repeated builds)
set -euo pipefail
umask 022
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8

SLURM_SERIES=22.05 # image.py SLURM_SERIES: the startup scripts check it at boot
PREFIX=/opt/mtc    # image.py NODE_ROOT
VENV=$PREFIX/venv  # image.py NODE_PYTHON is $VENV/bin/python
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOURCE=${MTC_SOURCE:-$(cd "$HERE/../.." && pwd)}
read -r -a PIP_ARGS <<<"${MTC_PIP_ARGS:-}"

# Debian's packages for what the startup scripts call (common.sh, worker.sh,
# controller.sh, block.sh): Slurm's daemons and clients, munge, slurmdbd over MariaDB on
# the controller, curl for the metadata server, iptables for its block, python3 for the
# accounts list and the venv, nfs-common for Filestore.
PACKAGES=(
  systemd-sysv ca-certificates curl iptables procps util-linux passwd
  munge slurmd slurmctld slurm-client slurmdbd mariadb-server mariadb-client
  python3 python3-venv nfs-common
)
# Units Debian enables at install; the startup scripts start each one itself, in order
# (munge once the cluster's key is written, slurmd after the metadata block).
UNITS=(munge slurmd slurmctld slurmdbd mariadb)

log() { printf '%s mtc-image: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() {
  log "FAILED: $*"
  exit 1
}
trap 'log "FAILED at line $LINENO: $BASH_COMMAND"' ERR

[[ $(id -u) -eq 0 ]] || die "run as root"
. /etc/os-release
[[ ${ID:-} == debian && ${VERSION_ID:-} == 12 ]] ||
  die "needs Debian 12 (bookworm): its Slurm is $SLURM_SERIES; this is ${PRETTY_NAME:-unknown}"
[[ -d $SOURCE/node ]] || die "no node/ package in $SOURCE (set MTC_SOURCE)"
log "provisioning from $SOURCE (pip options: ${MTC_PIP_ARGS:-none})"

# --- Debian packages -------------------------------------------------------------------
# Package scripts must not start daemons on a builder (or in a chroot): nothing is
# configured yet. A policy-rc.d we add is removed on exit; one already there is kept.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod 0755 /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
APT_OPTS=(-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
if [[ -n ${MTC_APT_CACHE:-} ]]; then
  mkdir -p "$MTC_APT_CACHE/partial"
  APT_OPTS+=(-o "Dir::Cache::Archives=$MTC_APT_CACHE")
fi
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$pkg")
done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get "${APT_OPTS[@]}" update -qq
  apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [[ -n ${MTC_APT_CACHE:-} ]] || apt-get clean
else
  log "Debian packages: all present"
fi

version=$(slurmd -V | awk '{print $2}')
[[ $version == "$SLURM_SERIES".* ]] ||
  die "slurmd is $version, not $SLURM_SERIES.x: mtc's clients speak $SLURM_SERIES"
log "slurmd $version, $(munge --version 2>&1 | head -n 1)"

# --- no secrets, nothing running at boot that the startup script should start -----------
rm -f /etc/munge/munge.key /etc/slurm/slurmdbd.pass /etc/slurm/slurmdbd.conf
for unit in "${UNITS[@]}"; do
  systemctl disable "$unit" >/dev/null 2>&1 || true
done
log "removed the install-time munge key; disabled ${UNITS[*]} (the startup script starts them)"

# --- users and directories the startup scripts expect -----------------------------------
getent passwd slurm >/dev/null || die "no slurm account (Debian's slurm packages make it)"
getent passwd munge >/dev/null || die "no munge account (Debian's munge package makes it)"
install -d -m 0755 /etc/slurm /var/spool/slurmd /etc/systemd/system/slurmd.service.d
install -d -m 0755 -o slurm -g slurm /var/spool/slurmctld /var/log/slurm
install -d -m 0700 -o munge -g munge /etc/munge
install -d -m 0755 /home "$PREFIX"

# --- the node runtime: a venv and node/ -------------------------------------------------
if ! "$VENV/bin/python" -c "" 2>/dev/null; then
  log "making the venv $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
fi
log "pip install -r requirements-node.txt"
"$VENV/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check \
  "${PIP_ARGS[@]}" -r "$HERE/requirements-node.txt"
# Replaced whole, so a file removed from node/ does not linger in the image.
rm -rf "$PREFIX/node.new"
cp -r "$SOURCE/node" "$PREFIX/node.new"
find "$PREFIX/node.new" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$PREFIX/node"
mv "$PREFIX/node.new" "$PREFIX/node"
# `import node` from the venv's python anywhere, with no PYTHONPATH.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$PREFIX" >"$site/mtc-node.pth"
"$VENV/bin/python" -m compileall -q "$PREFIX/node" >/dev/null
# Jobs run as their owners: everything here is readable (and the venv runnable) by all.
chmod -R a+rX "$PREFIX"
torch=$("$VENV/bin/python" -c 'import node.train, torch; print(torch.__version__)')
log "node runtime in $PREFIX (torch $torch)"

revision=$(git -C "$SOURCE" rev-parse --short HEAD 2>/dev/null || echo unknown)
cat >"$PREFIX/image-release" <<EOF
slurm=$version
torch=$torch
mtc=$revision
built=$(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF

# Left to a GCE builder with GPUs (docs/gce.md, "Building the image"): this script does
# not install them, and a node without them runs CPU jobs only.
log "not installed here: NVIDIA driver with fabricmanager and persistenced, DCGM," \
  "the Ops Agent, gcsfuse, the Lustre client, the NCCL network plugin"
# The image's identity: systemd makes a new machine id at each instance's first boot.
: >/etc/machine-id
log "done"
