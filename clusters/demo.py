"""The demo cluster `make run` creates: 4 nodes with 8 emulated H200 GPUs each."""

DEMO_SPEC = {
    "cluster_id": "demo",
    "display_name": "Demo cluster",
    "provider": "local",
    "labels": {"purpose": "demo"},
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
            "scaling_spec": {"min_node_count": 4, "max_node_count": 4},
        },
    ],
    "orchestrator_spec": {
        "slurm_spec": {
            "login_node_pool_id": "login",
            "partitions": [{"id": "gpu", "node_pool_ids": ["gpu"], "default": True}],
            "config_overrides": {},
        }
    },
}
