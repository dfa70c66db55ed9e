"""The job pages: queue (filters, state counts, sorting, pages, query counts), submit
(errors beside fields), one job (history, controls, output tail), the cluster page's
Jobs card, access rules and escaping.

Rows are made directly through the models (no Slurm) except in tests marked
``slurm``, which create a real local cluster and delete it again."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from clusters import services as cluster_services
from clusters.models import Cluster
from jobs import services
from jobs.choices import JobState
from jobs.forms import JobSubmitForm, parse_env
from jobs.models import Job, JobEvent
from jobs.views import allowed_actions, expand_hostlist
from mtc.templatetags.mtc_ui import job_elapsed, job_tone, slurm_duration

from .conftest import make_spec
from .test_pages import make_cluster
from .waiting import job_wait_state

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert(1)</script>"
STATE_CYCLE = ["RUNNING", "PENDING", "COMPLETED", "FAILED", "CANCELLED"]


# --- fixtures and helpers ------------------------------------------------------------
@pytest.fixture
def staff_client(operator):
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def user_client(user):
    client = Client()
    client.force_login(user)
    return client


def make_jobs(
    cluster: Cluster,
    count: int,
    *,
    first: int = 1,
    owner=None,
    states=STATE_CYCLE,
    name: str = "train",
    **fields,
) -> list[Job]:
    """``count`` jobs as the poller would have stored them, with a history each."""
    now = timezone.now()
    jobs = []
    for i in range(first, first + count):
        state = states[(i - first) % len(states)]
        started = state not in ("PENDING",)
        values = dict(
            cluster=cluster,
            job_id=str(i),
            job_number=i,
            name=f"{name}-{i}",
            user="slurm",
            partition="gpu",
            state=state,
            reason="Resources" if state == "PENDING" else "",
            nodes=2,
            node_list=f"{cluster.cluster_id}-gpu-[0-1]" if started else "",
            cpus=2,
            gpus_per_node=8,
            time_limit="1:00:00",
            submit_time=now - timedelta(minutes=10, seconds=i),
            start_time=now - timedelta(minutes=5) if started else None,
            end_time=now - timedelta(minutes=1) if state in ("COMPLETED", "FAILED") else None,
            exit_code="0:0" if state == "COMPLETED" else "",
            owner=owner,
            submitted_by_mtc=owner is not None,
            script="#!/bin/bash\nsrun hostname\n",
            options={"name": f"{name}-{i}", "nodes": 2, "env": {"A": "1"}, "requeue": True},
        )
        values.update(fields)
        jobs.append(Job(**values))
    jobs = Job.objects.bulk_create(jobs)
    JobEvent.objects.bulk_create(
        JobEvent(job=job, time=job.submit_time, state="PENDING", cause="submitted") for job in jobs
    )
    return jobs


def html(response) -> str:
    return response.content.decode()


def rows(page: str) -> list[str]:
    """Job ids of the queue table's rows, in order."""
    return re.findall(r'<tr data-job="([^"]+)"', page)


def chip_counts(page: str) -> dict[str, str]:
    """{state: count} of the state chips ("ALL" for the first)."""
    return dict(
        re.findall(
            r'<a class="chip-filter[^"]*" href="[^"]*" data-state="(\w+)".*?<strong>(\d+)</strong>',
            page,
        )
    )


def query_count(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


# --- the queue ------------------------------------------------------------------------
def test_urls_reverse_to_the_documented_paths():
    assert reverse("jobs:queue", args=["c1"]) == "/clusters/c1/jobs/"
    assert reverse("jobs:submit", args=["c1"]) == "/clusters/c1/jobs/submit/"
    assert reverse("jobs:detail", args=["c1", "12_3"]) == "/clusters/c1/jobs/12_3/"
    assert reverse("jobs:action", args=["c1", "12", "cancel"]) == "/clusters/c1/jobs/12/cancel/"


def test_queue_shows_jobs_state_counts_and_filters(staff_client, operator, user):
    cluster = make_cluster("alpha")
    make_jobs(cluster, 10, owner=user)
    make_jobs(cluster, 2, first=11, owner=operator, name="eval", states=["PENDING"])
    response = staff_client.get("/clusters/alpha/jobs/")
    assert response.status_code == 200
    page = html(response)
    assert rows(page) == [str(i) for i in range(12, 0, -1)]
    for header in ("Job id", "Name", "Owner", "User", "Partition", "State", "Reason"):
        assert f">{header}<" in page
    assert "Node list" in page and "GPUs" in page and "Elapsed" in page
    assert "alpha-gpu-[0-1]" in page and ">16<" in page  # node list, 2 nodes x 8 GPUs
    assert 'href="/clusters/alpha/jobs/3/"' in page
    # Counts by state, as chips: all jobs, then each state present.
    assert chip_counts(page) == {
        "ALL": "12",
        "PENDING": "4",
        "RUNNING": "2",
        "COMPLETED": "2",
        "FAILED": "2",
        "CANCELLED": "2",
    }
    assert 'data-refresh-url="/clusters/alpha/jobs/fragment/"' in page
    assert 'name="owner"' in page  # operators may filter by owner

    def shown(query: str) -> list[str]:
        return rows(html(staff_client.get("/clusters/alpha/jobs/?" + query)))

    assert shown("state=RUNNING") == ["6", "1"]
    assert shown("state=RUNNING&state=FAILED") == ["9", "6", "4", "1"]
    assert shown("name=eval") == ["12", "11"]
    assert shown("name=EVAL-1") == ["12", "11"]  # contains, any case
    assert shown("owner=uma&state=PENDING") == ["7", "2"]
    assert shown("owner=olga") == ["12", "11"]
    assert shown("partition=gpu&user=slurm") == [str(i) for i in range(12, 0, -1)]
    assert shown("partition=nope") == []
    assert shown("user=root") == []
    assert shown("state=BOGUS") == [str(i) for i in range(12, 0, -1)]  # ignored

    # With a filter, the chips count within it and the selected chip stays shown.
    filtered = html(staff_client.get("/clusters/alpha/jobs/?name=eval&state=RUNNING"))
    assert chip_counts(filtered) == {"ALL": "2", "PENDING": "2", "RUNNING": "0"}
    assert "No job matches these filters." in filtered
    # A chip toggles its state and keeps the other filters.
    assert 'href="/clusters/alpha/jobs/?name=eval&amp;state=RUNNING&amp;state=PENDING"' in filtered
    assert 'href="/clusters/alpha/jobs/?name=eval"' in filtered  # RUNNING chip: off again
    # The fragment is the same table, with the same filters.
    fragment = html(staff_client.get("/clusters/alpha/jobs/fragment/?state=RUNNING"))
    assert rows(fragment) == ["6", "1"] and "<html" not in fragment
    assert 'data-refresh-url="/clusters/alpha/jobs/fragment/?state=RUNNING"' in fragment


def test_queue_sorts_by_whitelisted_columns_only(staff_client, operator):
    cluster = make_cluster("alpha")
    make_jobs(cluster, 3, owner=operator, states=["RUNNING"])
    Job.objects.filter(job_id="1").update(name="zeta", state="PENDING")
    Job.objects.filter(job_id="2").update(name="alpha", state="COMPLETED")
    Job.objects.filter(job_id="3").update(name="mid")

    def order(sort: str) -> list[str]:
        return rows(html(staff_client.get(f"/clusters/alpha/jobs/?sort={sort}")))

    assert order("-job_id") == ["3", "2", "1"]
    assert order("job_id") == ["1", "2", "3"]
    assert order("name") == ["2", "3", "1"]
    assert order("-name") == ["1", "3", "2"]
    assert order("state") == ["2", "1", "3"]  # COMPLETED, PENDING, RUNNING
    assert order("-submit_time") == ["1", "2", "3"]  # job 1 was submitted last here
    assert order("submit_time") == ["3", "2", "1"]
    for bad in ("script", "owner__password", "--name", "-", "name;drop"):
        assert order(bad) == ["3", "2", "1"], bad
    page = html(staff_client.get("/clusters/alpha/jobs/?sort=name"))
    assert 'class="sort sorted-asc"' in page and 'aria-sort="ascending"' in page
    assert 'href="/clusters/alpha/jobs/?sort=-name"' in page


def test_queue_is_paginated_by_50(staff_client, operator):
    cluster = make_cluster("alpha")
    make_jobs(cluster, 120, owner=operator)
    first = html(staff_client.get("/clusters/alpha/jobs/"))
    assert len(rows(first)) == 50 and rows(first)[0] == "120"
    assert "Page 1 of 3" in first
    assert 'href="/clusters/alpha/jobs/?page=2"' in first
    last = html(staff_client.get("/clusters/alpha/jobs/?page=3"))
    assert rows(last) == [str(i) for i in range(20, 0, -1)]
    assert "jobs 101–120 of 120" in last
    assert rows(html(staff_client.get("/clusters/alpha/jobs/?page=99"))) == rows(last)
    assert rows(html(staff_client.get("/clusters/alpha/jobs/?page=x"))) == rows(first)
    # Filters and sort carry over to the next page.
    query = "state=RUNNING&state=PENDING&state=COMPLETED&sort=job_id"
    some = html(staff_client.get("/clusters/alpha/jobs/?" + query))
    assert len(rows(some)) == 50 and rows(some)[:4] == ["1", "2", "3", "6"]
    assert "Page 1 of 2" in some
    next_url = (
        "/clusters/alpha/jobs/?state=PENDING&state=RUNNING&state=COMPLETED&sort=job_id&page=2"
    )
    assert f'href="{next_url.replace("&", "&amp;")}"' in some
    assert len(rows(html(staff_client.get(next_url)))) == 72 - 50


@pytest.mark.parametrize("url", ["/clusters/alpha/jobs/", "/clusters/alpha/jobs/fragment/"])
def test_queue_query_count_does_not_grow_with_jobs(staff_client, operator, user, url):
    cluster = make_cluster("alpha")
    make_jobs(cluster, 5, owner=user)
    few = query_count(staff_client, url)
    make_jobs(cluster, 195, first=6, owner=operator)
    assert query_count(staff_client, url) == few
    assert query_count(staff_client, url + "?state=RUNNING&name=train&sort=name&page=2") == few
    # session, user, cluster, state counts, one page of rows, and for operators the
    # retention purge's tally of the cluster's jobs; full pages add the nav's Repairs
    # badge (one count of repairs, for operators).
    assert few <= (6 if url.endswith("fragment/") else 7)


def test_queue_does_not_load_scripts_or_count_separately(staff_client, operator):
    cluster = make_cluster("alpha")
    make_jobs(cluster, 60, owner=operator)
    with CaptureQueriesContext(connection) as ctx:
        staff_client.get("/clusters/alpha/jobs/?page=2")
    sql = [q["sql"] for q in ctx.captured_queries]
    row_queries = [s for s in sql if "jobs_job" in s and "LIMIT" in s]
    assert len(row_queries) == 1
    assert '"script"' not in row_queries[0] and '"options"' not in row_queries[0]
    assert not any("COUNT(*)" in s and "jobs_job" in s for s in sql)
    assert sum("GROUP BY" in s for s in sql) == 1


def test_users_see_only_their_own_jobs(user_client, user, operator, django_user_model):
    cluster = make_cluster("alpha")
    mine = make_jobs(cluster, 3, owner=user, name="mine")
    bob = django_user_model.objects.create_user("bob", password="pw-bob-123")
    make_jobs(cluster, 4, first=10, owner=bob, name="bobs")
    make_jobs(cluster, 1, first=20, owner=None, name="shell")
    page = html(user_client.get("/clusters/alpha/jobs/"))
    assert rows(page) == ["3", "2", "1"]
    assert "bobs-" not in page and "shell-" not in page
    assert 'name="owner"' not in page
    # Asking for someone else's jobs by owner changes nothing.
    assert rows(html(user_client.get("/clusters/alpha/jobs/?owner=bob"))) == ["3", "2", "1"]
    assert chip_counts(page)["ALL"] == "3"
    assert user_client.get(f"/clusters/alpha/jobs/{mine[0].job_id}/").status_code == 200
    for other in ("10", "20", "999"):
        response = user_client.get(f"/clusters/alpha/jobs/{other}/")
        assert response.status_code == 404 and "Not found" in html(response)
        assert user_client.post(f"/clusters/alpha/jobs/{other}/cancel/").status_code == 404
        assert user_client.get(f"/clusters/alpha/jobs/{other}/fragment/").status_code == 404
    # The cluster page's Jobs card lists only theirs too.
    detail = html(user_client.get("/clusters/alpha/"))
    assert "mine-1" in detail and "bobs-" not in detail and "shell-" not in detail


def test_operators_see_every_job(staff_client, user):
    cluster = make_cluster("alpha")
    make_jobs(cluster, 2, owner=user)
    make_jobs(cluster, 1, first=3, owner=None, name="shell")
    assert rows(html(staff_client.get("/clusters/alpha/jobs/"))) == ["3", "2", "1"]
    assert staff_client.get("/clusters/alpha/jobs/3/").status_code == 200


def test_anonymous_is_sent_to_login(client):
    make_cluster("alpha")
    for url in ("/clusters/alpha/jobs/", "/clusters/alpha/jobs/submit/", "/clusters/alpha/jobs/1/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize(
    "url",
    [
        "/clusters/alpha/jobs/abc/",
        "/clusters/alpha/jobs/12x/",
        "/clusters/alpha/jobs/1_2_3/",
        "/clusters/alpha/jobs/-1/",
        "/clusters/alpha/jobs/1_/",
        "/clusters/alpha/jobs/abc/fragment/",
        "/clusters/alpha/jobs/404/",
        "/clusters/nope/jobs/",
        "/clusters/nope/jobs/submit/",
        "/clusters/nope/jobs/1/",
    ],
)
def test_bad_job_ids_and_unknown_things_are_404_pages(staff_client, operator, url):
    make_jobs(make_cluster("alpha"), 1, owner=operator)
    response = staff_client.get(url)
    assert response.status_code == 404
    assert "Not found" in html(response)


def test_hostile_names_are_escaped_on_every_page(staff_client, operator):
    cluster = make_cluster("alpha")
    make_jobs(
        cluster,
        1,
        owner=operator,
        name="x",
        reason=HOSTILE,
        node_list="<img src=x onerror=alert(1)>",
        user="<b>u</b>",
        options={"name": HOSTILE, "env": {"X": HOSTILE}},
        script=f"#!/bin/bash\necho '{HOSTILE}'\n",
    )
    Job.objects.update(name=HOSTILE)
    JobEvent.objects.update(cause=HOSTILE, reason=HOSTILE)
    for url in (
        "/clusters/alpha/jobs/",
        "/clusters/alpha/jobs/fragment/",
        "/clusters/alpha/jobs/1/",
        "/clusters/alpha/jobs/1/fragment/",
        "/clusters/alpha/",
        "/clusters/alpha/jobs/?name=" + HOSTILE,
    ):
        page = html(staff_client.get(url))
        assert "&lt;script&gt;" in page, url
        assert "<script>alert(1)" not in page, url
        assert "<img src=x" not in page and "<b>u</b>" not in page, url


# --- one job ------------------------------------------------------------------------
def test_job_page_shows_fields_history_script_options_and_output_tail(staff_client, operator):
    cluster = make_cluster("alpha")
    (job,) = make_jobs(cluster, 1, owner=operator, states=["COMPLETED"])
    later = job.submit_time + timedelta(seconds=5)
    JobEvent.objects.create(job=job, time=later, state="RUNNING", cause="seen by the poller")
    JobEvent.objects.create(
        job=job, time=later + timedelta(seconds=5), state="COMPLETED", cause="seen by the poller"
    )
    page = html(staff_client.get("/clusters/alpha/jobs/1/"))
    assert "train-1" in page and 'data-testid="job-state">COMPLETED<' in page
    history = page[page.index('data-testid="job-history"') :]
    positions = [history.index(f">{s}<") for s in ("PENDING", "RUNNING", "COMPLETED")]
    assert positions == sorted(positions)
    assert "<code>alpha-gpu-0</code>" in page and "<code>alpha-gpu-1</code>" in page
    assert '<pre class="code-block" id="job-script" data-testid="job-script">#!/bin/bash\n' in page
    assert '<code class="env-line">A=1</code>' in page
    assert 'data-output-url="/api/v1/clusters/alpha/jobs/1/output"' in page
    assert 'data-testid="output-stdout"' in page and 'data-testid="output-stderr"' in page
    assert 'data-job-terminal="1"' in page and 'data-refresh-ms="0"' in page
    assert "5:00" in page or "4:0" in page  # elapsed, M:SS


def test_job_page_of_a_job_from_a_shell(staff_client):
    cluster = make_cluster("alpha")
    make_jobs(cluster, 1, owner=None, script="", options={}, states=["RUNNING"])
    page = html(staff_client.get("/clusters/alpha/jobs/1/"))
    assert 'data-testid="output-unavailable"' in page
    assert 'data-testid="output-stdout"' not in page
    assert "Submitted outside mtc" in page
    assert 'data-job-terminal="0"' in page and 'data-refresh-ms="3000"' in page
    fragment = html(staff_client.get("/clusters/alpha/jobs/1/fragment/"))
    assert fragment.lstrip().startswith('<div id="job-live"') and "<html" not in fragment


def test_job_page_query_count_does_not_grow_with_history(staff_client, operator):
    cluster = make_cluster("alpha")
    # Both pending: a pending job's page also counts the jobs ahead (one query).
    short, long = make_jobs(cluster, 2, owner=operator, states=("PENDING",))
    few = query_count(staff_client, f"/clusters/alpha/jobs/{short.job_id}/")
    JobEvent.objects.bulk_create(
        JobEvent(job=long, time=timezone.now(), state="RUNNING", cause=f"event {i}")
        for i in range(50)
    )
    assert query_count(staff_client, f"/clusters/alpha/jobs/{long.job_id}/") == few
    assert few <= 7  # ... the nav's Repairs badge (operators), and the jobs ahead


CASES = [
    ("PENDING", "", {"cancel", "hold"}),
    ("PENDING", "JobHeldUser", {"cancel", "release"}),
    ("PENDING", "JobHeldAdmin", {"cancel", "release"}),
    ("RUNNING", "", {"cancel", "requeue"}),
    ("SUSPENDED", "", {"cancel", "requeue"}),
    ("CONFIGURING", "", {"cancel"}),
    ("COMPLETING", "", set()),
    ("COMPLETED", "", {"requeue"}),
    ("FAILED", "NonZeroExitCode", {"requeue"}),
    ("CANCELLED", "", {"requeue"}),
    ("UNKNOWN", "Left the queue unseen", set()),
]


@pytest.mark.parametrize("state, reason, expected", CASES)
def test_action_buttons_only_when_the_state_allows(staff_client, operator, state, reason, expected):
    cluster = make_cluster("alpha")
    make_jobs(cluster, 1, owner=operator, states=[state], reason=reason)
    job = Job.objects.get()
    assert set(allowed_actions(job)) == expected
    page = html(staff_client.get("/clusters/alpha/jobs/1/"))
    buttons = set(re.findall(r'data-action="(\w+)"', page))
    assert buttons == expected
    for action in expected:
        form = f'action="/clusters/alpha/jobs/1/{action}/"'
        assert form in page
        assert 'name="csrfmiddlewaretoken"' in page
    # The rules are the service's: what is not offered, it refuses.
    for action in {"cancel", "requeue", "hold", "release"} - expected:
        with pytest.raises(services.JobConflict):
            services.job_control(job=job, action=action, actor=operator)


def test_action_refused_by_state_shows_the_conflict(staff_client, operator):
    cluster = make_cluster("alpha")
    make_jobs(cluster, 1, owner=operator, states=["COMPLETING"])
    response = staff_client.post("/clusters/alpha/jobs/1/cancel/", follow=True)
    assert response.redirect_chain == [("/clusters/alpha/jobs/1/", 302)]
    assert "message-error" in html(response)
    assert "Job 1 is COMPLETING; it cannot be cancelled." in html(response)


def test_actions_are_post_only_csrf_protected_and_known(operator):
    cluster = make_cluster("alpha")
    make_jobs(cluster, 1, owner=operator, states=["COMPLETING"])
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.get("/clusters/alpha/jobs/1/cancel/").status_code == 405
    assert client.post("/clusters/alpha/jobs/1/cancel/").status_code == 403  # no token
    page = html(client.get("/clusters/alpha/jobs/1/"))
    assert "data-action" not in page
    token = client.cookies["csrftoken"].value
    assert (
        client.post("/clusters/alpha/jobs/1/explode/", {"csrfmiddlewaretoken": token}).status_code
        == 404
    )
    response = client.post("/clusters/alpha/jobs/1/cancel/", {"csrfmiddlewaretoken": token})
    assert response.status_code == 302


# --- the cluster page's Jobs card ------------------------------------------------------
def test_cluster_page_lists_the_latest_jobs(staff_client, operator):
    cluster = make_cluster("alpha")
    make_jobs(cluster, 15, owner=operator)
    page = html(staff_client.get("/clusters/alpha/"))
    card = page[page.index('data-testid="cluster-jobs"') :]
    assert re.findall(r'<tr data-job="(\d+)"', card) == [str(i) for i in range(15, 5, -1)]
    assert 'href="/clusters/alpha/jobs/"' in card and "View queue" in card
    assert 'href="/clusters/alpha/jobs/submit/"' in card and "Submit job" in card
    assert 'href="/clusters/alpha/jobs/15/"' in card
    header = page[: page.index('data-testid="cluster-jobs"')]
    assert re.search(r'<a class="btn" href="/clusters/alpha/jobs/">Jobs</a>', header)
    # One query for the card, whatever the number of jobs.
    few = query_count(staff_client, "/clusters/alpha/")
    make_jobs(cluster, 100, first=100, owner=operator)
    assert query_count(staff_client, "/clusters/alpha/") == few
    other = make_cluster("beta")
    assert "No jobs yet." in html(staff_client.get(f"/clusters/{other.cluster_id}/"))


# --- submit ---------------------------------------------------------------------------
def test_submit_page_offers_an_editor_and_options(user_client):
    make_cluster("alpha")
    page = html(user_client.get("/clusters/alpha/jobs/submit/"))
    assert "hello from $SLURMD_NODENAME" in page
    assert 'class="mono script-editor"' in page
    for name in (
        "name",
        "script",
        "partition",
        "nodes",
        "ntasks_per_node",
        "gpus_per_node",
        "cpus_per_task",
        "time_limit",
        "env",
        "requeue",
        "dependency",
        "array",
    ):
        assert f'name="{name}"' in page, name
    assert '<option value="gpu">gpu</option>' in page
    assert re.search(r'<input type="checkbox" name="requeue"[^>]* checked', page)


def test_submit_errors_show_beside_fields_and_create_nothing(user_client):
    make_cluster("alpha")
    response = user_client.post(
        "/clusters/alpha/jobs/submit/",
        {
            "name": "evil\nname",
            "script": "#!/bin/bash\necho hi\n",
            "nodes": "1",
            "ntasks_per_node": "1",
            "gpus_per_node": "0",
            "cpus_per_task": "1",
            "env": "GOOD=yes\nX=$(id)\nSLURM_JOB_ID=1",
            "array": "0-99999",
            "dependency": "afterok:1;rm",
            "time_limit": "soon",
        },
    )
    assert response.status_code == 200
    page = html(response)
    assert not Job.objects.exists()

    def field_errors(field: str) -> str:
        block = page.split(f'data-field="{field}"')[1].split("data-field=")[0]
        match = re.search(r'<ul class="field-errors" role="alert">(.*?)</ul>', block, re.S)
        return match.group(1) if match else ""

    assert "newlines" in field_errors("name")
    assert "X: May not contain" in field_errors("env")
    assert "SLURM_JOB_ID: This variable is set by Slurm or mtc." in field_errors("env")
    assert "afterok:123" in field_errors("dependency")
    assert "10000 tasks" in field_errors("array")
    assert "minutes" in field_errors("time_limit")
    assert field_errors("script") == "" and field_errors("nodes") == ""
    assert "fix the fields marked below" in page
    # What the user typed is kept.
    assert "X=$(id)" in page and "evil\nname" in page


def test_submit_checks_numbers_against_the_cluster(user_client):
    make_cluster("alpha", nodes=2)
    response = user_client.post(
        "/clusters/alpha/jobs/submit/",
        {
            "name": "big",
            "script": "echo no shebang",
            "nodes": "5",
            "ntasks_per_node": "x",
            "gpus_per_node": "9",
            "cpus_per_task": "1",
            "partition": "nope",
            "env": "NOEQUALS",
        },
    )
    page = html(response)
    assert not Job.objects.exists()
    assert "Must be between 1 and 2." in page  # nodes: the cluster has 2
    assert "Must be between 0 and 8." in page  # GPUs per node
    assert "Must start with an interpreter line" in page
    assert "Enter a whole number." in page
    assert "Select a valid choice." in page
    assert "Line 1: use KEY=value." in page


def test_submit_to_a_cluster_that_is_not_running_is_a_form_error(user_client):
    make_cluster("alpha", state="CREATING")
    response = user_client.post(
        "/clusters/alpha/jobs/submit/",
        {
            "name": "ok",
            "script": "#!/bin/bash\ntrue\n",
            "nodes": "1",
            "ntasks_per_node": "1",
            "gpus_per_node": "0",
            "cpus_per_task": "1",
        },
    )
    page = html(response)
    assert response.status_code == 200 and not Job.objects.exists()
    assert "The job was not submitted" in page
    assert "is CREATING; jobs need it RUNNING." in page
    assert 'data-testid="cluster-not-ready"' in page


def test_submit_form_builds_the_submission_dict():
    form = JobSubmitForm(
        {
            "name": " demo ",
            "script": "#!/bin/bash\r\necho hi",
            "partition": "gpu",
            "nodes": "2",
            "ntasks_per_node": "1",
            "gpus_per_node": "8",
            "cpus_per_task": "4",
            "time_limit": " 10 ",
            "env": "# a comment\n\nA=1\nB = two words \nC=x=y",
            "requeue": "",
            "dependency": "",
            "array": "0-3",
        },
        partitions=["gpu"],
    )
    assert form.is_valid(), form.errors
    assert form.submission_data() == {
        "name": "demo",
        "script": "#!/bin/bash\necho hi\n",
        "partition": "gpu",
        "nodes": 2,
        "ntasks_per_node": 1,
        "gpus_per_node": 8,
        "cpus_per_task": 4,
        "time_limit": "10",
        "env": {"A": "1", "B": "two words", "C": "x=y"},
        "requeue": False,
        "array": "0-3",
    }
    assert parse_env("A=1\nA=2")[1] == ["Line 2: A is set twice."]


# --- template helpers ------------------------------------------------------------------
def test_job_state_tones_and_elapsed_time():
    assert job_tone("RUNNING") == "info" and job_tone("COMPLETED") == "ok"
    assert job_tone("FAILED") == "bad" and job_tone("PENDING") == "warn"
    assert job_tone("CANCELLED") == "muted" and job_tone("WHATEVER") == "muted"
    for state in JobState.values:
        assert job_tone(state) in {"ok", "info", "warn", "bad", "muted"}
    assert slurm_duration(5) == "0:05"
    assert slurm_duration(3725) == "1:02:05"
    assert slurm_duration(2 * 86400 + 3600 + 61) == "2-01:01:01"
    now = timezone.now()
    job = Job(state="COMPLETED", start_time=now - timedelta(seconds=90), end_time=now)
    assert job_elapsed(job) == "1:30"
    job = Job(state="PENDING", start_time=now + timedelta(hours=1), end_time=None)
    assert job_elapsed(job) == ""  # an expected start is not a start
    job = Job(state="RUNNING", start_time=now - timedelta(seconds=61), end_time=now)
    assert job_elapsed(job) in ("1:01", "1:02")  # to now, not to the limit


def test_node_lists_expand():
    assert expand_hostlist("jp-gpu-[0-1]") == ["jp-gpu-0", "jp-gpu-1"]
    assert expand_hostlist("a[01-03,7],b") == ["a01", "a02", "a03", "a7", "b"]
    assert expand_hostlist("node-5") == ["node-5"]
    assert expand_hostlist("") == []


# --- against real Slurm --------------------------------------------------------------
wait_state = job_wait_state


@pytest.mark.slurm
def test_submit_and_control_a_real_job_through_the_pages(local_clusters, user):
    cluster_services.cluster_create(spec=make_spec("jp", nodes=2))
    cluster = Cluster.objects.get(cluster_id="jp")
    client = Client()
    client.force_login(user)

    # Invalid: nothing reaches Slurm.
    bad = client.post(
        "/clusters/jp/jobs/submit/",
        {
            "name": "bad\nname",
            "script": "#!/bin/bash\nid\n",
            "nodes": "1",
            "ntasks_per_node": "1",
            "gpus_per_node": "0",
            "cpus_per_task": "1",
            "env": "X=$(id)",
        },
    )
    assert bad.status_code == 200 and "newlines" in html(bad) and "X: May not contain" in html(bad)
    assert not Job.objects.exists()

    response = client.post(
        "/clusters/jp/jobs/submit/",
        {
            "name": "sleeper",
            "script": "#!/bin/bash\r\nsleep 120\r\n",
            "partition": "gpu",
            "nodes": "1",
            "ntasks_per_node": "1",
            "gpus_per_node": "0",
            "cpus_per_task": "1",
            "env": "GREETING=hi there",
            "requeue": "on",
        },
    )
    job = Job.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/clusters/jp/jobs/{job.job_id}/"
    assert job.owner == user and job.script == "#!/bin/bash\nsleep 120\n"
    assert job.options["env"] == {"GREETING": "hi there"}
    page = html(client.get(response["Location"]))
    assert f"Submitted job {job.job_id} (sleeper)." in page
    wait_state(cluster, job.job_id, {"RUNNING"})
    page = html(client.get(f"/clusters/jp/jobs/{job.job_id}/"))
    assert set(re.findall(r'data-action="(\w+)"', page)) == {"cancel", "requeue"}

    response = client.post(f"/clusters/jp/jobs/{job.job_id}/cancel/", follow=True)
    assert f"Asked Slurm to cancel job {job.job_id}." in html(response)
    assert wait_state(cluster, job.job_id, {"CANCELLED"}).state == "CANCELLED"
    again = client.post(f"/clusters/jp/jobs/{job.job_id}/cancel/", follow=True)
    assert "it cannot be cancelled" in html(again)
    queue = html(client.get("/clusters/jp/jobs/?state=CANCELLED"))
    assert rows(queue) == [job.job_id]


def test_the_api_list_shows_each_job_as_its_detail_does_in_flat_queries(operator, user):
    """The list reads rows with values(); each item is what the job's own URL says of it
    (less options, script and history), for jobs of mtc's users and from outside."""
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(operator)
    cluster = make_cluster("alpha")
    make_jobs(cluster, 4, owner=user)
    make_jobs(cluster, 3, first=5, owner=None, name="shell")
    url = "/api/v1/clusters/alpha/jobs"
    with CaptureQueriesContext(connection) as few:
        listed = api.get(url).json()["results"]
    assert sorted(item["owner"] or "" for item in listed) == ["", "", "", *[user.username] * 4]
    for item in listed:
        detail = api.get(f"{url}/{item['job_id']}").json()
        assert {k: detail[k] for k in item} == item
        assert item["gpus"] == 16 and item["cluster"] == "alpha"
    make_jobs(cluster, 60, first=8, owner=operator)
    with CaptureQueriesContext(connection) as many:
        assert len(api.get(url).json()["results"]) == 50
    assert len(many) == len(few)
