"""End to end in Debian's Chromium: submit a 2-node job from the submit page, watch
it reach COMPLETED in the queue, read both nodes' output in the job page's live
tail, then cancel a sleeping job with its button.

There is no Celery worker in tests: the test itself plays the poller's part by
calling jobs_sync every half second while it waits; the pages refresh themselves."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in this thread; Django's ORM calls from
# the test itself (set-up, the poller's sync) are still plain synchronous code.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from clusters import services as cluster_services  # noqa: E402
from clusters.models import Cluster  # noqa: E402
from jobs.models import Job  # noqa: E402
from jobs.sync import jobs_sync  # noqa: E402

from .conftest import make_spec  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slurm]

SHOTS = Path("/tmp/ui-shots")
NODE_NAMES = "#!/bin/bash\nsrun bash -c 'echo node=$SLURMD_NODENAME'\n"
HOSTILE = "<script>alert(1)</script>"


def poll_until(page, cluster: Cluster, check, timeout: float = 40) -> None:
    """Play the poller (jobs_sync every 0.5 s) until check() holds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        jobs_sync(cluster=cluster)
        page.wait_for_timeout(500)


def test_submit_watch_output_and_cancel_in_the_browser(
    live_server, local_clusters, settings, operator, browser
):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    cluster_services.cluster_create(spec=make_spec("jp", nodes=2))
    cluster = Cluster.objects.get(cluster_id="jp")
    base = live_server.url
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(20_000)
    dialogs: list[tuple[str, str]] = []

    def on_dialog(dialog):
        dialogs.append((dialog.type, dialog.message))
        dialog.accept()

    page.on("dialog", on_dialog)

    # Log in through the login page.
    page.goto(base + "/clusters/jp/")
    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill("pw-olga-123")
    page.get_by_role("button", name="Sign in").click()
    jobs_card = page.get_by_test_id("cluster-jobs")
    expect(jobs_card).to_contain_text("No jobs yet.")

    # Submit a 2-node job from the cluster page's Jobs card.
    jobs_card.get_by_role("link", name="Submit job").click()
    expect(page.get_by_role("heading", name="Submit a job")).to_be_visible()
    expect(page.get_by_label("Script")).to_have_value(re.compile(r"hello from \$SLURMD_NODENAME"))
    page.get_by_label("Name").fill("hello-nodes")
    page.get_by_label("Script").fill(NODE_NAMES)
    page.locator("#id_nodes").fill("2")
    page.get_by_role("button", name="Submit job").click()

    job = Job.objects.get(name="hello-nodes")
    expect(page).to_have_url(f"{base}/clusters/jp/jobs/{job.job_id}/")
    expect(page.locator(".messages")).to_contain_text(f"Submitted job {job.job_id} (hello-nodes).")
    expect(page.get_by_role("heading", name=re.compile("hello-nodes"))).to_be_visible()

    # The queue shows it and follows it to COMPLETED by itself.
    page.get_by_role("link", name="Queue").click()
    row = page.locator(f'tr[data-job="{job.job_id}"]')
    expect(row).to_contain_text("hello-nodes")
    poll_until(page, cluster, lambda: row.get_attribute("data-state") == "COMPLETED")
    expect(row.locator(".badge")).to_have_text("COMPLETED")
    expect(row).to_contain_text("jp-gpu-[0-1]")
    expect(page.locator('[data-state="COMPLETED"] strong').first).to_have_text("1")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "job-queue.png"), full_page=True)

    # Its page: both nodes' lines in the live output tail, which then stops.
    row.get_by_role("link", name=job.job_id).click()
    expect(page.get_by_test_id("job-state")).to_have_text("COMPLETED")
    stdout = page.get_by_test_id("output-stdout")
    expect(stdout).to_contain_text("node=jp-gpu-0")
    expect(stdout).to_contain_text("node=jp-gpu-1")
    expect(page.get_by_test_id("job-output")).to_have_attribute("data-output-done", "1")
    expect(page.get_by_test_id("job-nodes")).to_contain_text("jp-gpu-1")
    expect(page.get_by_test_id("job-history")).to_contain_text("COMPLETED")
    expect(page.get_by_test_id("job-actions").get_by_role("button")).to_have_text(["Requeue"])
    page.get_by_role("tab", name=re.compile("stderr")).click()
    expect(page.get_by_test_id("output-stderr")).to_be_visible()
    expect(stdout).to_be_hidden()
    page.get_by_role("tab", name=re.compile("stdout")).click()
    page.screenshot(path=str(SHOTS / "job-detail.png"), full_page=True)

    # A sleeping job (with a hostile name), cancelled with its button.
    page.goto(f"{base}/clusters/jp/jobs/submit/")
    page.get_by_role("button", name="Sleep for two minutes").click()
    expect(page.get_by_label("Script")).to_have_value(re.compile(r"sleep 120"))
    page.get_by_label("Name").fill(HOSTILE)
    page.get_by_role("button", name="Submit job").click()
    sleeper = Job.objects.get(name=HOSTILE)
    expect(page).to_have_url(f"{base}/clusters/jp/jobs/{sleeper.job_id}/")
    expect(page.get_by_role("heading", name=HOSTILE)).to_be_visible()
    state = page.get_by_test_id("job-state")
    poll_until(page, cluster, lambda: state.text_content() == "RUNNING")
    expect(page.get_by_test_id("output-stdout")).to_contain_text("started on jp-gpu-")
    page.screenshot(path=str(SHOTS / "job-running.png"), full_page=True)
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator(".messages")).to_contain_text(
        f"Asked Slurm to cancel job {sleeper.job_id}."
    )
    assert dialogs and dialogs[-1][0] == "confirm"
    assert f"Cancel job {sleeper.job_id}?" in dialogs[-1][1]
    poll_until(page, cluster, lambda: state.text_content() == "CANCELLED")
    expect(page.get_by_test_id("job-output")).to_have_attribute("data-output-done", "1")

    # Both in the queue; filtering by a state chip narrows it; nothing ran the name.
    page.get_by_role("link", name="Queue").click()
    expect(page.locator(f'tr[data-job="{sleeper.job_id}"] .badge')).to_have_text("CANCELLED")
    expect(page.locator(f'tr[data-job="{sleeper.job_id}"]')).to_contain_text(HOSTILE)
    page.locator('.chip-filter[data-state="CANCELLED"]').click()
    expect(page.locator("tbody tr[data-job]")).to_have_count(1)
    expect(page.locator('.chip-filter[data-state="CANCELLED"]')).to_have_class(re.compile("active"))
    page.locator('.chip-filter[data-state="ALL"]').click()
    expect(page.locator("tbody tr[data-job]")).to_have_count(2)
    page.screenshot(path=str(SHOTS / "job-queue-2.png"), full_page=True)
    page.goto(f"{base}/clusters/jp/")
    expect(page.get_by_test_id("cluster-jobs").locator("tbody tr")).to_have_count(2)
    page.screenshot(path=str(SHOTS / "cluster-jobs.png"), full_page=True)
    assert all(kind == "confirm" for kind, _ in dialogs), dialogs
    page.close()
