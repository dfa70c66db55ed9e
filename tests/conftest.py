"""Shared fixtures: fixed personas (operator, user), API clients, and real local
clusters that are always torn down (no Slurm daemon outlives its test)."""

from __future__ import annotations

import copy
import json
import os
import subprocess

import pytest
from rest_framework.test import APIClient

from clusters.demo import DEMO_SPEC
from clusters.models import Cluster
from clusters.providers import get_provider, procs

# Fixtures that give a test the database (pytest-django's, and the ones built on them).
DB_FIXTURES = frozenset(
    {
        "db",
        "transactional_db",
        "django_db_reset_sequences",
        "django_db_serialized_rollback",
        "django_db_setup",
        "live_server",
    }
)


def uses_database(item: pytest.Item) -> bool:
    if item.get_closest_marker("django_db") is not None:
        return True
    return not DB_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """MTC_TEST_DB_ONLY=1 (`make test`'s PostgreSQL pass): run only the tests that use
    the database; the others ran in the SQLite pass and would only repeat it."""
    if os.environ.get("MTC_TEST_DB_ONLY") != "1":
        return
    keep = [item for item in items if uses_database(item)]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not uses_database(item)])
        items[:] = keep


@pytest.fixture(autouse=True, scope="session")
def _api_read_cache_off_in_process():
    """The API read cache (mtc/api/readcache.py) is off for the test client in this
    process: every test makes its users and paths anew, and an answer kept by one test
    would be another's. The web servers that tests start keep it on, as deployed."""
    from django.conf import settings

    settings.MTC_API_READ_CACHE_SECONDS = 0
    # Likewise the job tallies (jobs/tally.py): a test's rows are rolled back unseen.
    settings.MTC_JOB_TALLY = False


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("olga", password="pw-olga-123", is_staff=True)


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("uma", password="pw-uma-123")


@pytest.fixture
def local_identity(db, settings):
    """MTC_IDENTITY=local: real Unix accounts for the personas, removed after the test."""
    from identity.models import PosixAccount
    from identity.sources import local

    settings.MTC_IDENTITY = "local"
    yield
    for name in PosixAccount.objects.filter(source="local").values_list("name", flat=True):
        local.account_delete(name)


@pytest.fixture
def operator_api(operator) -> APIClient:
    from mtc.tokens import token_create

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_create(user=operator)[1]}")
    return client


@pytest.fixture
def user_api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def make_spec(cluster_id: str = "t1", nodes: int = 3, **changes) -> dict:
    """A valid local spec: a login pool and one GPU pool of ``nodes`` nodes."""
    spec = copy.deepcopy(DEMO_SPEC)
    spec["cluster_id"] = cluster_id
    spec["display_name"] = f"Test {cluster_id}"
    spec["node_pools"][1]["scaling_spec"] = {"min_node_count": nodes, "max_node_count": nodes}
    spec.update(changes)
    return spec


@pytest.fixture
def local_clusters(transactional_db, settings):
    """Run Operations inline against the real local Slurm; delete every cluster after."""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    yield
    for cluster in Cluster.objects.all():
        get_provider(cluster.provider).delete_cluster(cluster)


def database_url() -> str:
    """DATABASE_URL of the test database, for the workers a test starts in subprocesses."""
    from urllib.parse import quote

    from django.db import connection

    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    if connection.vendor != "postgresql":
        raise NotImplementedError(f"no DATABASE_URL for {connection.vendor}")
    credentials = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"], safe="")
    host = quote(db["HOST"] or "", safe="")  # a socket dir becomes %2F...
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{credentials}@{host}{port}/{quote(db['NAME'], safe='')}"


def cluster_root(cluster_id: str):
    from django.conf import settings

    return settings.DATA_DIR / "clusters" / cluster_id


def cluster_processes(cluster_id: str) -> list[int]:
    return procs.processes_mentioning(str(cluster_root(cluster_id)))


def sinfo_json(cluster_id: str) -> dict[str, str]:
    """{node: state} from `sinfo --json` with the cluster's SLURM_CONF, as a user would."""
    conf = cluster_root(cluster_id) / "etc" / "slurm.conf"
    out = subprocess.run(
        ["sinfo", "--json"],
        env=dict(os.environ, SLURM_CONF=str(conf)),
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout
    nodes = json.loads(out)["nodes"]
    states = {}
    for node in nodes:
        state = node["state"]
        states[node["name"]] = (state if isinstance(state, str) else "+".join(state)).lower()
    return states


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    # Without these Chromium keeps reaching for Google's hosts on a closed network.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def browser():
    """Debian's Chromium, headless, driven by Playwright (never a downloaded browser)."""
    from pathlib import Path

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed")
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM calls beside Playwright
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(autouse=True, scope="session")
def _user_tree_audit():
    """tests/fsaudit.py: mtc's code touches users' trees only through mtc/userfs.py."""
    from . import fsaudit

    fsaudit.install()
    fsaudit.take()  # what collection and earlier fixtures did is not a test's


@pytest.fixture(autouse=True)
def _user_tree_findings(_user_tree_audit):
    from . import fsaudit

    fsaudit.take()
    yield
    found = fsaudit.take()
    if found:
        pytest.fail(
            "mtc touched a user's tree as root without mtc/userfs.py:\n  " + "\n  ".join(found),
            pytrace=False,
        )
