"""The inference replica that runs on cluster nodes (standard library + transformers)."""
