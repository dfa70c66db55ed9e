"""The node image's contract: what deploy/image/provision.sh puts on a gce node and what
mtc relies on there (the startup scripts, recipes' and replicas' batch scripts).
Change one side only with the other (docs/gce.md, "Building the image")."""

from __future__ import annotations

# Slurm's release series on the image: Debian 12's 22.05, the series mtc's own clients
# speak (Slurm talks to daemons within two releases). Startup scripts check `slurmd -V`.
SLURM_SERIES = "22.05"
# The image family mtc boots from unless MTC_GCE_IMAGE says otherwise (mtc/settings.py).
IMAGE_FAMILY = "mtc-slurm-" + SLURM_SERIES.replace(".", "-")
# The node runtime: node/ under NODE_ROOT, in a venv with torch (requirements-node.txt).
NODE_ROOT = "/opt/mtc"
NODE_PYTHON = NODE_ROOT + "/venv/bin/python"


def slurm_check_script() -> str:
    """Shell lines for a startup script: stop the boot, saying so on stderr (which
    Google's startup-script runner copies to the serial console) and in the ``state``
    guest attribute, when the image's Slurm is not SLURM_SERIES
    (mtc's slurm.conf and clients would then talk to daemons they were not made for).
    Needs the script's ``report`` function."""
    return "\n".join(
        [
            "# --- the image: Slurm of the series mtc speaks ----------------------------------",
            "slurm_version=$(slurmd -V 2>/dev/null | awk '{print $2}' || true)",
            f"if [[ $slurm_version != {SLURM_SERIES}.* ]]; then",
            f'  echo "mtc: this image has Slurm ${{slurm_version:-none}}, mtc needs'
            f' {SLURM_SERIES}.x: rebuild it (docs/gce.md, Building the image)" >&2',
            f'  report state "failed: image has Slurm ${{slurm_version:-none}}, not'
            f' {SLURM_SERIES}.x"',
            "  exit 1",
            "fi",
        ]
    )
