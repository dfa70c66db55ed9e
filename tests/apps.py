"""The project's packages, for the tests that walk them (layers, the user-file rules, the
audit hook): the Django apps, and node/ (what runs on nodes, no Django)."""

DJANGO_APPS = (
    "mtc",
    "identity",
    "slurm",
    "clusters",
    "jobs",
    "recipes",
    "health",
    "registry",
    "serving",
)
PACKAGES = (*DJANGO_APPS, "node")
