"""What a Slurm call can fail with: permanent (a bad request) or transient (retry)."""

from __future__ import annotations

# Messages Slurm prints when the controller is down or slow: worth a retry.
TRANSIENT_MARKERS = (
    "unable to contact slurm controller",
    "connection refused",
    "socket timed out",
    "connect failure",
    "zero bytes were transmitted",
    "communication connection failure",
    "timed out",
)


class SlurmError(Exception):
    def __init__(self, message: str, *, permanent: bool, command: list[str] | None = None):
        super().__init__(message)
        self.permanent = permanent
        self.command = command or []
