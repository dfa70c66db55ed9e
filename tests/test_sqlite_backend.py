"""mtc/sqlite: a transaction waiting for SQLite's write lock tries again every few
milliseconds (SQLite's own busy handler looks only every 50 to 100 ms after a while)."""

import sqlite3
import threading
import time

import pytest
from django.contrib.auth.models import Group
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's locking")


def test_a_transaction_waits_for_the_write_lock_in_short_steps(transactional_db):
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's write transaction
    seen: dict = {}

    def write():
        mine = connections["default"]  # this thread's own connection
        with CaptureQueriesContext(mine) as queries:
            with transaction.atomic():
                Group.objects.create(name="after-the-lock")
        seen["begins"] = sum(q["sql"].startswith("BEGIN") for q in queries.captured_queries)
        with mine.cursor() as cursor:
            seen["busy_timeout"] = cursor.execute("PRAGMA busy_timeout").fetchone()[0]
        mine.close()

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(0.3)  # the lock is held this long
    holder.execute("COMMIT")
    writer.join(20)
    holder.close()
    assert Group.objects.filter(name="after-the-lock").exists()
    assert seen["begins"] >= 10  # tried in short steps, not once inside SQLite's handler
    assert seen["busy_timeout"] == 20000  # other statements wait as before
