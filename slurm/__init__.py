"""The one adapter around Slurm's commands (docs/api.md)."""

from .client import SlurmClient, SlurmNode
from .errors import SlurmError

__all__ = ["SlurmClient", "SlurmError", "SlurmNode"]
