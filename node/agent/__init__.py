"""The mtc node health agent (docs/health.md).

``mtc_agent.py`` is a single stdlib-only file that runs ON the nodes (any python3 >= 3.8);
``shim/`` holds the per-node ``nvidia-smi``/``dcgmi``/``mtc-gpu-check`` stand-ins that report
injected faults on machines without GPUs. Nothing here imports Django.
"""
