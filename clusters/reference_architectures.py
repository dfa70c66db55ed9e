"""Reference architectures: complete, valid cluster specs (docs/spec.md) for
common training setups, offered by the create page as starting points."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReferenceArchitecture:
    key: str
    title: str
    summary: str
    description: str
    provider: str
    highlights: tuple[str, ...]
    spec: dict = field(repr=False)
    note: str = ""

    def build_spec(self, cluster_id: str | None = None) -> dict:
        """A fresh copy of the spec, optionally with another cluster id."""
        spec = copy.deepcopy(self.spec)
        if cluster_id:
            spec["cluster_id"] = cluster_id
        return spec

    @property
    def node_count(self) -> int:
        login = self.spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
        return sum(
            p["scaling_spec"]["min_node_count"] for p in self.spec["node_pools"] if p["id"] != login
        )

    @property
    def gpu_count(self) -> int:
        login = self.spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
        return sum(
            p["scaling_spec"]["min_node_count"] * p["machine_spec"].get("accelerator_count", 0)
            for p in self.spec["node_pools"]
            if p["id"] != login
        )


GCE_NOTE = "Needs the gce provider and Google Cloud credentials."


def _gce_spec(
    *,
    cluster_id: str,
    display_name: str,
    labels: dict,
    pool_id: str,
    machine_type: str,
    accelerator_type: str,
    nodes: int,
    reservation: str,
    lustre_tier: int,
    lustre_capacity_gib: int,
    bucket: str,
    overrides: dict,
    epilog: list[str] | None = None,
) -> dict:
    return {
        "cluster_id": cluster_id,
        "display_name": display_name,
        "provider": "gce",
        "labels": labels,
        "zone": "us-central1-a",
        # No network named: nic0 is on mtc's own VPC, so mtc reaches slurmctld; the GPU
        # data networks (RDMA or TCPXO) follow from the machine type.
        "network": {"private_service_access": {"range_prefix_length": 20}},
        "node_pools": [
            {
                "id": "login",
                "machine_spec": {"machine_type": "n2-standard-8"},
                "scaling_spec": {"min_node_count": 1, "max_node_count": 1},
                "boot_disk": {"boot_disk_type": "pd-balanced", "boot_disk_size_gb": 100},
            },
            {
                "id": pool_id,
                "machine_spec": {
                    "machine_type": machine_type,
                    "accelerator_type": accelerator_type,
                    "accelerator_count": 8,
                    "reservation_affinity": {
                        "reservation_affinity_type": "SPECIFIC_RESERVATION",
                        "key": "compute.googleapis.com/reservation-name",
                        "values": [reservation],
                    },
                },
                "provisioning_model": "RESERVATION",
                "scaling_spec": {"min_node_count": nodes, "max_node_count": nodes},
                "boot_disk": {"boot_disk_type": "hyperdisk-balanced", "boot_disk_size_gb": 200},
            },
        ],
        "storage": {
            # Both made by mtc with the cluster (addresses read back at create).
            "home": {"type": "filestore", "share": "home", "tier": "BASIC_SSD"},
            "lustre": [
                {
                    "filesystem": "lfs",
                    "mount_point": "/mnt/lustre",
                    "performance_tier_mbps_per_tib": lustre_tier,
                    "capacity_gib": lustre_capacity_gib,
                }
            ],
            "gcs_fuse": [{"bucket": bucket, "mount_point": f"/gcs/{bucket}"}],
        },
        "orchestrator_spec": {
            "slurm_spec": {
                "login_node_pool_id": "login",
                "partitions": [{"id": pool_id, "node_pool_ids": [pool_id], "default": True}],
                "prolog_bash_scripts": [],
                "epilog_bash_scripts": epilog or [],
                "config_overrides": overrides,
            }
        },
    }


ARCHITECTURES: tuple[ReferenceArchitecture, ...] = (
    ReferenceArchitecture(
        key="a3-ultra-pretraining",
        title="A3 Ultra 8xH200 LLM pretraining",
        summary="16 A3 Ultra nodes (128 H200 GPUs) from a reservation, Managed Lustre scratch.",
        description=(
            "Large-scale pretraining of dense or mixture-of-experts models. Each a3-ultragpu-8g "
            "node has 8 NVIDIA H200 141GB GPUs joined by NVLink and an RDMA network for "
            "collectives. Checkpoints and training data go to Managed Lustre at 500 MBps/TiB; "
            "/home is a Filestore share; the tokenised dataset is mounted from Cloud Storage."
        ),
        provider="gce",
        highlights=(
            "a3-ultragpu-8g, NVIDIA_H200_141GB x 8",
            "16 nodes, RESERVATION provisioning",
            "Lustre 36 TiB at 500 MBps/TiB, Filestore /home, GCS FUSE",
        ),
        note=GCE_NOTE,
        spec=_gce_spec(
            cluster_id="a3u-pretrain",
            display_name="A3 Ultra pretraining",
            labels={"workload": "pretraining", "accelerator": "h200"},
            pool_id="a3u",
            machine_type="a3-ultragpu-8g",
            accelerator_type="NVIDIA_H200_141GB",
            nodes=16,
            reservation="a3u-reservation",
            lustre_tier=500,
            lustre_capacity_gib=36000,
            bucket="pretraining-datasets",
            overrides={"SlurmdTimeout": "300", "MessageTimeout": "60"},
        ),
    ),
    ReferenceArchitecture(
        key="a4-pretraining",
        title="A4 8xB200 LLM pretraining",
        summary="16 A4 nodes (128 B200 GPUs) from a reservation, fastest Lustre tier.",
        description=(
            "Pretraining on NVIDIA Blackwell. Each a4-highgpu-8g node has 8 NVIDIA B200 GPUs. "
            "Blackwell's throughput needs fast checkpoint writes, so scratch is Managed Lustre "
            "at the 1000 MBps/TiB tier; /home is a Filestore share and datasets come from "
            "Cloud Storage through GCS FUSE."
        ),
        provider="gce",
        highlights=(
            "a4-highgpu-8g, NVIDIA_B200 x 8",
            "16 nodes, RESERVATION provisioning",
            "Lustre 72 TiB at 1000 MBps/TiB, Filestore /home, GCS FUSE",
        ),
        note=GCE_NOTE,
        spec=_gce_spec(
            cluster_id="a4-pretrain",
            display_name="A4 pretraining",
            labels={"workload": "pretraining", "accelerator": "b200"},
            pool_id="a4",
            machine_type="a4-highgpu-8g",
            accelerator_type="NVIDIA_B200",
            nodes=16,
            reservation="a4-reservation",
            lustre_tier=1000,
            lustre_capacity_gib=72000,
            bucket="pretraining-datasets",
            overrides={"SlurmdTimeout": "300", "MessageTimeout": "60"},
        ),
    ),
    ReferenceArchitecture(
        key="a3-mega-finetuning",
        title="A3 Mega 8xH100 fine-tuning",
        summary="4 A3 Mega nodes (32 H100 GPUs) for supervised fine-tuning and RLHF.",
        description=(
            "Fine-tuning and post-training of open models up to ~70B parameters. Each "
            "a3-megagpu-8g node has 8 NVIDIA H100 80GB Mega GPUs. A smaller Lustre instance "
            "holds checkpoints; base weights and datasets are read from Cloud Storage. An epilog "
            "clears node-local scratch between jobs."
        ),
        provider="gce",
        highlights=(
            "a3-megagpu-8g, NVIDIA_H100_MEGA_80GB x 8",
            "4 nodes, RESERVATION provisioning",
            "Lustre 18 TiB at 250 MBps/TiB, Filestore /home, GCS FUSE",
        ),
        note=GCE_NOTE,
        spec=_gce_spec(
            cluster_id="a3m-finetune",
            display_name="A3 Mega fine-tuning",
            labels={"workload": "finetuning", "accelerator": "h100"},
            pool_id="a3m",
            machine_type="a3-megagpu-8g",
            accelerator_type="NVIDIA_H100_MEGA_80GB",
            nodes=4,
            reservation="a3m-reservation",
            lustre_tier=250,
            lustre_capacity_gib=18000,
            bucket="finetuning-data",
            overrides={"SlurmdTimeout": "120"},
            epilog=["#!/bin/bash\nrm -rf /tmp/job-scratch-${SLURM_JOB_ID:-none}\n"],
        ),
    ),
    ReferenceArchitecture(
        key="local-dev",
        title="Local development cluster",
        summary="4 local Slurm nodes on this machine with 8 emulated H200 GPUs each.",
        description=(
            "Real Slurm daemons (slurmctld and one slurmd per node) running on this host. "
            "Without NVIDIA GPUs on the host, each node advertises 8 emulated H200 GPUs as "
            "GRES, so --gpus-per-node scheduling behaves as on the real fleet. Ideal for "
            "trying recipes, job scripts and failure handling in seconds."
        ),
        provider="local",
        highlights=(
            "local-2, NVIDIA_H200_141GB x 8 (emulated)",
            "4 nodes, partition gpu",
            "Up in about a second; nothing leaves this machine",
        ),
        spec={
            "cluster_id": "dev",
            "display_name": "Local development",
            "provider": "local",
            "labels": {"env": "dev"},
            "node_pools": [
                {
                    "id": "login",
                    "machine_spec": {"machine_type": "local-2"},
                    "scaling_spec": {"min_node_count": 1, "max_node_count": 1},
                },
                {
                    "id": "gpu",
                    "machine_spec": {
                        "machine_type": "local-2",
                        "accelerator_type": "NVIDIA_H200_141GB",
                        "accelerator_count": 8,
                    },
                    "provisioning_model": "STANDARD",
                    "scaling_spec": {"min_node_count": 4, "max_node_count": 4},
                },
            ],
            "orchestrator_spec": {
                "slurm_spec": {
                    "login_node_pool_id": "login",
                    "partitions": [{"id": "gpu", "node_pool_ids": ["gpu"], "default": True}],
                    "prolog_bash_scripts": [],
                    "epilog_bash_scripts": [],
                    "config_overrides": {},
                }
            },
        },
    ),
)

_BY_KEY = {arch.key: arch for arch in ARCHITECTURES}


def architecture_list() -> tuple[ReferenceArchitecture, ...]:
    return ARCHITECTURES


def architecture_get(key: str) -> ReferenceArchitecture | None:
    return _BY_KEY.get(key)
