#!/bin/bash
# The GPU and Compute Engine pieces of an mtc node image, run on a Debian 12 builder VM
# after provision.sh (`mtc gce image build --gpu` runs it; docs/gce.md, "Building the
# image"). They come from NVIDIA's and Google's apt repositories, so this needs the
# builder's internet access; the chroot test lists the steps (MTC_IMAGE_DRY_RUN=1)
# instead of running them, since neither the repositories nor a GPU are there.
#
# Environment (all optional):
#   MTC_DRIVER_BRANCH      NVIDIA driver branch (default 570: H100/H200/B200 datacenter)
#   MTC_DRIVER_PACKAGES    the driver's packages (default: nvidia-open-<branch>,
#                          nvidia-fabricmanager-<branch>, nvidia-persistenced, as
#                          NVIDIA's CUDA repository for Debian 12 names them)
#   MTC_DCGM_VERSION       DCGM (default 1:3.3.9: the newest the Ops Agent's receiver takes)
#   MTC_LUSTRE_CLIENT_DEBS a folder of Lustre client .debs built for this image's kernel
#   MTC_NCCL_PLUGIN        a .tar.gz of the NCCL network plugin for the machine type
#                          (gIB for A3 Ultra/A4, TCPXO for A3 Mega), unpacked into /usr/local
#   MTC_IMAGE_DRY_RUN=1    print each step's commands, run nothing
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
BRANCH=${MTC_DRIVER_BRANCH:-570}
DCGM=${MTC_DCGM_VERSION:-1:3.3.9}
NVIDIA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64

log() { printf '%s mtc-image: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
step() {  # step <what> <command...>: run it, or only say it under MTC_IMAGE_DRY_RUN
  local what=$1
  shift
  if [[ ${MTC_IMAGE_DRY_RUN:-} == 1 ]]; then
    printf 'step: %s: %s\n' "$what" "$*"
  else
    log "$what"
    "$@"
  fi
}

step "kernel headers for the driver's modules" \
  apt-get install -y -qq "linux-headers-$(uname -r)" dkms curl gnupg
step "NVIDIA's repository (cuda-keyring)" \
  bash -c "curl -fsSL -o /tmp/cuda-keyring.deb $NVIDIA_REPO/cuda-keyring_1.1-1_all.deb \
    && dpkg -i /tmp/cuda-keyring.deb && apt-get update -qq"
# Open kernel modules: NVIDIA's choice for Hopper and Blackwell datacenter GPUs.
read -r -a DRIVER <<<"${MTC_DRIVER_PACKAGES:-nvidia-open-$BRANCH nvidia-fabricmanager-$BRANCH nvidia-persistenced}"
step "NVIDIA driver $BRANCH (open modules), persistenced, fabric manager" \
  apt-get install -y -qq --no-install-recommends "${DRIVER[@]}"
step "DCGM $DCGM" apt-get install -y -qq "datacenter-gpu-manager=$DCGM"
# The Ops Agent's repository script, pinned to major 2 (the DCGM receiver v2 needs 2.51+).
step "the Ops Agent" \
  bash -c "curl -fsSL -o /tmp/add-ops-agent-repo.sh \
    https://dl.google.com/cloudagents/add-google-cloud-ops-agent-repo.sh \
    && REPO_SUFFIX=2 bash /tmp/add-ops-agent-repo.sh --also-install"
step "gcsfuse" \
  bash -c "curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg \
    | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg \
    && echo 'deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt gcsfuse-bookworm main' \
      >/etc/apt/sources.list.d/gcsfuse.list && apt-get update -qq && apt-get install -y -qq gcsfuse"
if [[ -n ${MTC_LUSTRE_CLIENT_DEBS:-} ]]; then
  step "the Lustre client" bash -c "apt-get install -y -qq $MTC_LUSTRE_CLIENT_DEBS/*.deb"
else
  log "not installed: the Lustre client (set MTC_LUSTRE_CLIENT_DEBS to .debs for this kernel)"
fi
if [[ -n ${MTC_NCCL_PLUGIN:-} ]]; then
  step "the NCCL network plugin" tar -xzf "$MTC_NCCL_PLUGIN" -C /usr/local
else
  log "not installed: the NCCL network plugin (set MTC_NCCL_PLUGIN; without it NCCL uses TCP)"
fi
# Started by the startup script on GPU nodes, in order, not at boot by themselves.
step "units left to the startup script" \
  systemctl disable nvidia-persistenced nvidia-fabricmanager nvidia-dcgm google-cloud-ops-agent
log "GPU stack done"
