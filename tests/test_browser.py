"""End to end in Debian's Chromium: log in, create a local cluster with the wizard
and another from a reference architecture, see their node grids, delete them.

Celery tasks run eagerly, so each create starts real Slurm daemons during the
request; every cluster made here is deleted again at the end."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in this thread; Django's ORM calls from
# the test itself (set-up, clean-up) are still plain synchronous code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from playwright.sync_api import expect  # noqa: E402

from clusters import services  # noqa: E402
from clusters.models import Cluster, Operation  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slurm]

SHOTS = Path("/tmp/ui-shots")
PASSWORD = "browser-pw-1"


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("operator", password=PASSWORD, is_staff=True)


@pytest.fixture
def cleanup_clusters(transactional_db):
    yield
    # Whatever a failed step left behind: stop its daemons and remove its rows.
    for cluster in Cluster.objects.all():
        services.cluster_delete(cluster=cluster)
    assert not Cluster.objects.exists()


def test_wizard_and_reference_architecture_in_the_browser(
    live_server, transactional_db, settings, operator, browser, cleanup_clusters
):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    base = live_server.url
    page = browser.new_page(viewport={"width": 1360, "height": 900})
    page.set_default_timeout(20_000)

    # Log in through the login page.
    page.goto(base + "/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("Username").fill("operator")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    expect(page.get_by_text("No clusters yet")).to_be_visible()

    # The wizard, end to end, with its defaults: 2 nodes with 8 emulated H200 each.
    page.get_by_role("link", name="Create cluster").first.click()
    page.get_by_role("link", name=re.compile("Step-by-step wizard")).click()
    expect(page.get_by_role("heading", name="Basics", exact=True)).to_be_visible()
    page.get_by_label("Cluster id").fill("Wiz E2E")
    page.get_by_role("button", name="Next →").click()
    expect(page.locator('[data-field="cluster_id"] .field-errors')).to_contain_text(
        "Lowercase letters"
    )
    page.get_by_label("Cluster id").fill("wiz-e2e")
    page.get_by_label("Display name").fill("Wizard e2e")
    page.get_by_role("button", name="Next →").click()
    expect(page.get_by_role("heading", name="Node pools", exact=True)).to_be_visible()
    expect(page.locator("#id_pools-0-node_count")).to_have_value("2")
    expect(page.locator("#id_pools-0-accelerator_type")).to_have_value("NVIDIA_H200_141GB")
    # A pool added and removed again leaves the cluster as it was.
    page.get_by_role("button", name="+ Add compute pool").click()
    expect(page.locator("#id_pools-1-pool_id")).to_have_value("pool2")
    page.locator("#id_pools-1-DELETE").check()
    page.get_by_role("button", name="Next →").click()
    expect(page.get_by_role("heading", name="Network", exact=True)).to_be_visible()
    page.get_by_role("button", name="Next →").click()
    expect(page.get_by_role("heading", name="Storage", exact=True)).to_be_visible()
    page.get_by_role("button", name="Next →").click()
    expect(page.get_by_role("heading", name="Slurm", exact=True)).to_be_visible()
    expect(page.get_by_label("Partitions")).to_have_value("gpu = gpu")
    page.get_by_role("button", name="Review →").click()
    expect(page.get_by_role("heading", name="Review", exact=True)).to_be_visible()
    expect(page.get_by_test_id("review-spec")).to_contain_text('"cluster_id": "wiz-e2e"')
    page.get_by_role("button", name="Create cluster").click()

    expect(page.get_by_role("heading", name=re.compile("Wizard e2e"))).to_be_visible()
    expect(page.locator(".messages")).to_contain_text("Cluster wiz-e2e was created.")
    expect(page.get_by_test_id("cluster-state")).to_have_text("RUNNING")
    tiles = page.locator(".node-tile")
    expect(tiles).to_have_count(2)
    for i in range(2):
        tile = page.locator(f'[data-node="wiz-e2e-gpu-{i}"]')
        expect(tile.locator(".node-state")).to_have_text("IDLE")
        expect(tile).to_contain_text("8 × H200")
        expect(tile).to_contain_text("emulated")
    expect(page.get_by_test_id("login-box")).to_contain_text(
        f"SLURM_CONF={settings.DATA_DIR}/clusters/wiz-e2e/etc/slurm.conf sinfo"
    )
    expect(page.get_by_test_id("operations")).to_contain_text("SUCCEEDED")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "cluster.png"), full_page=True)

    # While an Operation runs the page follows it by itself, and stops when it ends.
    operation = Operation.objects.create(
        kind="UPDATE_CLUSTER",
        target="clusters/wiz-e2e",
        state="RUNNING",
        progress=50,
        cluster=Cluster.objects.get(cluster_id="wiz-e2e"),
        status_message="Resizing pool gpu",
    )
    page.reload()
    expect(page.get_by_test_id("active-operation")).to_contain_text("Resizing pool gpu")
    Operation.objects.filter(pk=operation.pk).update(progress=80, status_message="Almost there")
    expect(page.get_by_test_id("active-operation")).to_contain_text("Almost there", timeout=8000)
    Operation.objects.filter(pk=operation.pk).update(
        state="SUCCEEDED", progress=100, status_message="Done"
    )
    expect(page.get_by_test_id("active-operation")).to_have_count(0, timeout=8000)
    expect(page.locator("#live")).to_have_attribute("data-live-active", "0")

    # A reference architecture: the local development cluster under another id.
    page.get_by_role("link", name="Create cluster").first.click()
    page.get_by_role("link", name=re.compile("Reference architecture")).click()
    card = page.locator('[data-arch="local-dev"]')
    expect(card.get_by_role("heading")).to_have_text("Local development cluster")
    expect(page.locator('[data-arch="a4-pretraining"]')).to_contain_text("Needs the gce provider")
    card.get_by_role("link", name="Use this architecture").click()
    expect(page.get_by_role("heading", name="Local development cluster")).to_be_visible()
    page.get_by_label("Cluster id").fill("ref-e2e")
    expect(page.get_by_label("Spec JSON")).to_have_value(re.compile(r'"cluster_id": "ref-e2e"'))
    page.get_by_role("button", name="Create cluster").click()

    expect(page.get_by_test_id("cluster-state")).to_have_text("RUNNING")
    expect(page.locator(".node-tile")).to_have_count(4)
    expect(page.locator('.node-tile[data-state="IDLE"]')).to_have_count(4)
    expect(page.locator('[data-node="ref-e2e-gpu-3"] .node-state')).to_have_text("IDLE")
    page.screenshot(path=str(SHOTS / "cluster-ref.png"), full_page=True)

    # The dashboard shows both, with their node grids.
    page.get_by_role("link", name="Dashboard").click()
    expect(page.locator('[data-cluster="wiz-e2e"] .mini-node')).to_have_count(2)
    expect(page.locator('[data-cluster="ref-e2e"] .mini-node')).to_have_count(4)
    page.screenshot(path=str(SHOTS / "dashboard.png"), full_page=True)

    # Delete one through its delete page: a wrong id is refused beside the field.
    page.goto(base + "/clusters/ref-e2e/")
    page.get_by_role("link", name="Delete cluster").click()
    page.get_by_label("Type the cluster id to confirm").fill("ref-e2")
    page.get_by_role("button", name="Delete cluster").click()
    expect(page.locator('[data-field="confirm"] .field-errors')).to_contain_text("ref-e2e")
    page.get_by_label("Type the cluster id to confirm").fill("ref-e2e")
    page.get_by_role("button", name="Delete cluster").click()
    expect(page.get_by_role("heading", name="Clusters")).to_be_visible()
    expect(page.locator(".messages")).to_contain_text("Cluster ref-e2e was deleted")
    expect(page.get_by_test_id("cluster-table")).not_to_contain_text("ref-e2e")
    assert not Cluster.objects.filter(cluster_id="ref-e2e").exists()

    # The other one through the service, as the API would.
    services.cluster_delete(cluster=Cluster.objects.get(cluster_id="wiz-e2e"))
    assert not Cluster.objects.exists()
    page.reload()
    expect(page.get_by_test_id("cluster-table")).to_contain_text("No clusters yet")
    page.close()
