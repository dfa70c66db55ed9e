#!/bin/bash
# mtc startup script for @@ROLE@@ nodes of cluster @@CLUSTER@@ (rendered by mtc; runs as root
# at every boot). The image (deploy/image/provision.sh) provides Slurm, munge and the
# node runtime in /opt/mtc (clusters/providers/gce/image.py).
set -euo pipefail
umask 022
@@BLOCK@@

MD=http://metadata.google.internal/computeMetadata/v1/instance
meta() { curl -sf -H Metadata-Flavor:Google "$MD/attributes/$1"; }
# mtc reads these guest attributes to tell a booting node from a ready one.
report() {
  curl -sf -X PUT --data "$2" -H Metadata-Flavor:Google \
    "$MD/guest-attributes/mtc/$1" >/dev/null || true
}
trap 'report state "failed: line $LINENO"' ERR
# A step that did not happen fails the boot, says why on the serial console and in the
# state attribute mtc shows, never reports ready after a timeout.
fail() {
  echo "mtc: $1" >&2
  report state "failed: ${1:0:200}"
  exit 1
}
# This boot's id first: after a reset mtc waits for a new one, since guest attributes
# outlive a reboot and the last boot's "ready" would otherwise answer for this one.
report boot "$(cat /proc/sys/kernel/random/boot_id)"
report @@READY_KEY@@ booting
report state configuring

@@IMAGE_CHECK@@

# --- shared storage from the spec -------------------------------------------------
# A mount that fails fails the node, and says which mount and why (mtc shows the state).
mount_once() {  # mount_once <what> <where> <type> <options>
  mkdir -p "$2"
  mountpoint -q "$2" && return 0
  local err
  if ! err=$(mount -t "$3" -o "$4" "$1" "$2" 2>&1); then
    echo "mtc: mount $1 on $2 failed: $err" >&2
    report state "failed: mount $1 on $2: ${err:0:200}"
    exit 1
  fi
}
@@MOUNTS@@

# --- munge: the key mtc generated for this cluster ----------------------------------
# mktemp makes the file 0600 for root before a byte of the key is in it.
key=$(mktemp /etc/munge/.munge.key.XXXXXX)
meta mtc-munge-key | base64 -d >"$key"
chown munge:munge "$key"
chmod 0400 "$key"
mv -f "$key" /etc/munge/munge.key
systemctl restart munge

# --- the cluster's users: the same names, uids and gids on every node as in mtc ------
# Made before slurmd starts, so every job's owner exists here; a clash fails the boot.
ensure_account() {  # ensure_account <name> <uid> <gid> <home>
  getent group "$3" >/dev/null || groupadd -g "$3" "$1"
  if ! getent passwd "$1" >/dev/null; then
    useradd --no-create-home --uid "$2" --gid "$3" --home-dir "$4" --shell /bin/bash "$1"
  fi
  if [ "$(id -u "$1"):$(id -g "$1")" != "$2:$3" ]; then
    echo "mtc: account $1 is $(id -u "$1"):$(id -g "$1") here, not $2:$3" >&2
    return 1
  fi
  [ -d "$4" ] || install -d -m 0700 -o "$2" -g "$3" "$4" || echo "mtc: cannot make $4" >&2
}
accounts=$(meta @@ACCOUNTS_KEY@@ | python3 -c @@ACCOUNTS_PARSE@@)
while IFS=: read -r name uid gid home; do
  if [ -n "$name" ]; then ensure_account "$name" "$uid" "$gid" "$home"; fi
done <<<"$accounts"
