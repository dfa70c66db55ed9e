"""Django's SQLite backend, with a write transaction's start retried in short steps.

mtc's transactions begin IMMEDIATE (they take SQLite's one write lock at BEGIN). Waiting
for that lock inside SQLite, its busy handler sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25,
50, 50, 100 ms between tries: a writer that has waited a while looks again only every 50
to 100 ms, and a newcomer takes the lock first. Under bench/load.py a third of a job
submit's time went there (py-spy) and its p99 reached 0.8 s. Here BEGIN is tried with
SQLite's wait off and retried every 1 to 4 ms (random, so waiters do not move in step)
until the connection's timeout; every other statement waits as before.
"""

from __future__ import annotations

import random
import sqlite3
import time

from django.db import OperationalError
from django.db.backends.sqlite3 import base

RETRY_S = (0.001, 0.004)


class DatabaseWrapper(base.DatabaseWrapper):
    def _start_transaction_under_autocommit(self):
        if self.transaction_mode is None:
            return super()._start_transaction_under_autocommit()
        timeout_s = float(self.settings_dict["OPTIONS"].get("timeout", 5))
        deadline = time.monotonic() + timeout_s
        raw = self.connection  # PRAGMAs through it: not logged as the app's queries
        raw.execute("PRAGMA busy_timeout = 0")
        try:
            while True:
                try:
                    self.cursor().execute(f"BEGIN {self.transaction_mode}")
                    return None
                except OperationalError as exc:
                    cause = exc.__cause__
                    locked = isinstance(cause, sqlite3.OperationalError) and str(cause) in (
                        "database is locked",
                        "database is busy",
                    )
                    if not locked or time.monotonic() >= deadline:
                        raise
                time.sleep(random.uniform(*RETRY_S))
        finally:
            raw.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
