#!/bin/bash
# mtc startup script for @@ROLE@@ nodes of cluster @@CLUSTER@@ (rendered by mtc; runs as root
# at every boot). The image provides Slurm, munge, NVIDIA drivers and DCGM.
set -euo pipefail
MD=http://metadata.google.internal/computeMetadata/v1/instance
meta() { curl -sf -H Metadata-Flavor:Google "$MD/attributes/$1"; }
# mtc reads these guest attributes to tell a booting node from a ready one.
report() {
  curl -sf -X PUT --data "$2" -H Metadata-Flavor:Google \
    "$MD/guest-attributes/mtc/$1" >/dev/null || true
}
trap 'report state "failed: line $LINENO"' ERR
report state configuring

# --- shared storage from the spec -------------------------------------------------
mount_once() {  # mount_once <what> <where> <type> <options>
  mkdir -p "$2"
  mountpoint -q "$2" || mount -t "$3" -o "$4" "$1" "$2"
}
@@MOUNTS@@

# --- munge: the key mtc generated for this cluster ----------------------------------
meta mtc-munge-key | base64 -d >/etc/munge/munge.key
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
systemctl restart munge
