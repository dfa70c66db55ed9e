"""In Debian's Chromium: a model's page with two versions (the second fine-tuned from
the first) leads to the comparison, where both runs' loss curves are drawn over each
other and the differing learning rate is what "Only differences" leaves."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from registry.models import Model, ModelVersion

from .test_compare import make_run

pytestmark = pytest.mark.browser
PASSWORD = "browser-pw-2"


@pytest.fixture
def person(django_user_model):
    return django_user_model.objects.create_user("mia", password=PASSWORD)


def test_model_lineage_to_overlaid_curves(live_server, transactional_db, person, browser):
    from clusters.models import Cluster

    from .conftest import make_spec

    cluster = Cluster.objects.create(cluster_id="cmp", spec=make_spec("cmp"), state="RUNNING")
    model = Model.objects.create(name="tiny-chat", owner=person, description="A <b>tiny</b> one")
    first = ModelVersion.objects.create(
        model=model,
        number=1,
        state="READY",
        recipe="llama-pretrain",
        source_job=make_run(cluster, person, 1, lr=3e-3),
        created_by=person,
    )
    ModelVersion.objects.create(
        model=model,
        number=2,
        state="READY",
        recipe="sft",
        parent=first,
        source_job=make_run(cluster, person, 2, lr=1e-4),
        created_by=person,
    )

    page = browser.new_page(viewport={"width": 1360, "height": 900})
    page.set_default_timeout(20_000)
    page.goto(live_server.url + "/models/tiny-chat/")
    page.get_by_label("Username").fill("mia")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()

    expect(page.get_by_test_id("model-description")).to_have_text("A <b>tiny</b> one")
    expect(page.get_by_test_id("lineage-chain")).to_contain_text("tiny-chat@1")
    expect(page.get_by_test_id("lineage-chain")).to_contain_text("tiny-chat@2")
    page.get_by_test_id("compare-versions").click()
    expect(page).to_have_url(re.compile(r"/jobs/compare/\?versions="))

    charts = page.get_by_test_id("compare-charts")
    # plotly draws one line per run in the loss chart.
    expect(charts.locator(".js-plotly-plot").first.locator("g.trace.scatter")).to_have_count(2)
    table = page.get_by_test_id("compare-table")
    page.get_by_label("Only differences").check()
    expect(table.get_by_role("row", name=re.compile(r"^lr\b"))).to_be_visible()
    expect(table.get_by_role("row", name=re.compile(r"^seed\b"))).to_be_hidden()
