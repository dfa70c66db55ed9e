"""The one adapter around Slurm's commands (DESIGN.md section 5)."""

from .client import SlurmClient, SlurmNode
from .errors import SlurmError

__all__ = ["SlurmClient", "SlurmError", "SlurmNode"]
