"""`manage.py retention_purge`: what the beat task does, now, from a shell (after
lowering a retention, say); --until-done repeats runs until nothing is left."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from mtc.retention import purge_all


class Command(BaseCommand):
    help = "Remove finished rows and files past their retention (README, Retention)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--until-done", action="store_true", help="repeat runs until one removes nothing"
        )

    def handle(self, *args, until_done: bool = False, **opts) -> None:
        totals: dict[str, int] = {}
        while True:
            removed = purge_all()
            for name, n in removed.items():
                totals[name] = totals.get(name, 0) + n
            if not until_done or not any(removed.values()):
                break
        for name, n in sorted(totals.items()):
            self.stdout.write(f"{name}: {n}")
