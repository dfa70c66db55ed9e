"""The demo cluster `make run` creates: the local development reference architecture
(4 nodes with 8 emulated H200 GPUs each) under the id `demo`."""

from .reference_architectures import architecture_get

DEMO_SPEC = {
    **architecture_get("local-dev").build_spec("demo"),
    "display_name": "Demo cluster",
    "labels": {"purpose": "demo"},
}
