"""What a recipe launch asks of a GPU pool, and the NCCL environment per machine type.

One table (``NCCL_ENV``), each entry with the Google Cloud page it follows. The batch
script sources the machine image's own profile script where it is there (it tracks
the plugin version on the node) and sets the documented values only on a node
without it. Django-free: it reads the cluster spec only.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB_ENV = (
    ("NCCL_NET", "gIB"),
    ("LD_LIBRARY_PATH", "/usr/local/gib/lib64:${LD_LIBRARY_PATH:-}"),
    ("NCCL_CROSS_NIC", "0"),
    ("NCCL_NET_GDR_LEVEL", "PIX"),
    ("NCCL_P2P_NET_CHUNKSIZE", "131072"),
    ("NCCL_NVLS_CHUNKSIZE", "524288"),
    ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
    ("NCCL_IB_QPS_PER_CONNECTION", "4"),
    ("NCCL_IB_TC", "52"),
    ("NCCL_IB_FIFO_TC", "84"),
)
TCPXO_ENV = (
    ("LD_LIBRARY_PATH", "/var/lib/tcpxo/lib64:${LD_LIBRARY_PATH:-}"),
    ("NCCL_FASTRAK_CTRL_DEV", "enp0s12"),
    (
        "NCCL_FASTRAK_IFNAME",
        "enp6s0,enp7s0,enp13s0,enp14s0,enp134s0,enp135s0,enp141s0,enp142s0",
    ),
    ("NCCL_SOCKET_IFNAME", "enp0s12"),
    ("NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY", "/dev/aperture_devices"),
)


@dataclass(frozen=True)
class NcclEnv:
    name: str  # the transport, as Google names it
    source: str  # the page these values come from
    profile: str  # the image's script that sets them, sourced when present
    env: tuple[tuple[str, str], ...]


# machine type -> its NCCL environment.
NCCL_ENV: dict[str, NcclEnv] = {
    # A3 Ultra (H200) and A4 (B200): RDMA over the gIB NCCL plugin.
    "a3-ultragpu-8g": NcclEnv(
        "gIB",
        "https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-rdma",
        "/usr/local/gib/scripts/set_nccl_env.sh",
        (*GIB_ENV, ("NCCL_TUNER_CONFIG_PATH", "/usr/local/gib/configs/tuner_config_a3u.txtpb")),
    ),
    "a4-highgpu-8g": NcclEnv(
        "gIB",
        "https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-rdma",
        "/usr/local/gib/scripts/set_nccl_env.sh",
        (*GIB_ENV, ("NCCL_TUNER_CONFIG_PATH", "/usr/local/gib/configs/tuner_config_a4.txtpb")),
    ),
    # A3 Mega (H100 Mega): GPUDirect-TCPXO; the cluster's prolog installs the plugin.
    "a3-megagpu-8g": NcclEnv(
        "TCPXO",
        "https://cloud.google.com/cluster-toolkit/docs/machine-learning/a3-mega-enable-gpudirect-tcpxo",
        "/var/lib/tcpxo/lib64/nccl-env-profile.sh",
        TCPXO_ENV,
    ),
}
# Always: fewer out-of-memory failures from fragmentation (PyTorch's CUDA allocator).
ALLOC_ENV = (("PYTORCH_ALLOC_CONF", "expandable_segments:True"),)


@dataclass(frozen=True)
class PoolShape:
    pool_id: str
    machine_type: str
    gpus: int
    cpus: int  # cores Slurm knows for the node; 0 when mtc does not know them
    accelerator: str = ""  # the spec's accelerator_type (emulated GPUs state theirs too)


def partition_pool(spec: dict, partition: str = "") -> PoolShape | None:
    """The first compute pool of ``partition`` (the default partition when empty)."""
    slurm = spec["orchestrator_spec"]["slurm_spec"]
    parts = slurm["partitions"]
    part = next((p for p in parts if p["id"] == partition), None) if partition else None
    part = part or next((p for p in parts if p.get("default")), None) or (parts or [None])[0]
    if part is None:
        return None
    pools = {p["id"]: p for p in spec["node_pools"]}
    for pool_id in part["node_pool_ids"]:
        pool = pools.get(pool_id)
        if pool is None or pool_id == slurm["login_node_pool_id"]:
            continue
        machine = pool["machine_spec"]
        machine_type = machine["machine_type"]
        cpus = int(machine_type.split("-", 1)[1]) if machine_type.startswith("local-") else 0
        gpus = machine.get("accelerator_count", 0) or 0
        accelerator = machine.get("accelerator_type", "") or ""
        return PoolShape(pool_id, machine_type, gpus, cpus, accelerator)
    return None


def env_block(machine_type: str, *, gpus: bool) -> str:
    """The batch script's environment lines for a node of ``machine_type``."""
    lines = [f"export {k}={v}" for k, v in ALLOC_ENV]
    nccl = NCCL_ENV.get(machine_type) if gpus else None
    if nccl is not None:
        lines.append(f"# NCCL over {nccl.name} on {machine_type}, as {nccl.source}")
        # The image's own profile tracks its plugin version: it wins where it is there
        # (set +u: it is written without `set -u` in mind); the table is the fallback.
        lines.append(f"if [ -f {nccl.profile} ]; then")
        lines.append(f"  set +u; source {nccl.profile}; set -u")
        lines.append("else")
        lines += [f'  export {k}="{v}"' for k, v in nccl.env]
        lines.append("fi")
    return "\n".join(lines)
