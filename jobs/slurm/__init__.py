"""The one adapter around Slurm's commands (DESIGN.md section 5)."""

from .client import SlurmClient, SlurmError, SlurmNode

__all__ = ["SlurmClient", "SlurmError", "SlurmNode"]
