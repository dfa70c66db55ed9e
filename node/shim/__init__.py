"""The mtc device shim: per-node ``nvidia-smi``/``dcgmi``/``mtc-gpu-check`` stand-ins.

``install.install(node_dir, gpu_count, gpu_type)`` sets a node up; ``inject.inject`` and
``inject.clear`` change its faults. See ``_shimlib.py`` for what each fault does.
"""
