"""The recipe pages: the catalog, the launch form (defaults, the preview script,
errors beside fields, launching with the Slurm boundary faked), and the Training card
of a recipe job's page (figures, json_script chart data, plotly, escaping, query
counts).

Clusters and jobs are made directly through the models: no Slurm daemon runs here."""

from __future__ import annotations

import html as html_lib
import json
import re
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from clusters.models import Cluster
from clusters.spec import validate_cluster_spec
from jobs.models import Job, JobEvent, JobMetric
from recipes.catalog import RECIPES
from recipes.forms import JOB_FIELDS, RecipeLaunchForm, body_digest
from recipes.views import recipe_job_series, training_figures

from .conftest import make_spec
from .pages import assert_loads_nothing_remote

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert(1)</script>"
LAUNCH = "/clusters/rc/recipes/llama-pretrain/launch/"


# --- fixtures and helpers ---------------------------------------------------------------
@pytest.fixture
def cluster(db):
    spec = validate_cluster_spec(make_spec("rc", nodes=2))
    return Cluster.objects.create(cluster_id="rc", spec=spec, state="RUNNING")


@pytest.fixture
def user_client(user):
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def staff_client(operator):
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    return tmp_path


@pytest.fixture
def fake_sbatch(monkeypatch):
    """The Slurm boundary: sbatch answers job ids 77, 78, ... and records what it got."""
    from slurm import client

    seen: dict = {}

    def fake_submit(self, args, script, env, **kwargs):
        seen.update(args=args, script=script, env=env)
        seen["count"] = seen.get("count", 0) + 1
        return str(76 + seen["count"])

    monkeypatch.setattr(client.SlurmClient, "submit", fake_submit)
    return seen


def page(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def field_block(text: str, name: str) -> str:
    """The markup of one form field's wrapper (label, input, errors, help)."""
    match = re.search(rf'<div class="field[^"]*" data-field="{name}">(.*?)\n</div>', text, re.S)
    assert match, f"no field {name}"
    return match.group(0)


def form_values(recipe_id: str = "llama-pretrain", **changes) -> dict:
    """What a browser posts for the launch form: the defaults, with changes."""
    data = {"nodes": "2", "partition": "gpu", "gpus_per_node": "", "name": "", "time_limit": ""}
    for param in RECIPES[recipe_id].params:
        if param.kind == "bool":
            if param.default:
                data[param.name] = "on"
        elif param.default is not None:
            data[param.name] = str(param.default)
        else:
            data[param.name] = ""
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def previewed(text: str) -> str:
    return re.search(r'name="previewed" value="([^"]*)"', text).group(1)


def make_recipe_job(cluster, owner, *, job_id="7", recipe="llama-pretrain", points=0, **fields):
    values = dict(
        cluster=cluster,
        job_id=job_id,
        job_number=int(job_id),
        name=f"{recipe}-tiny",
        user="slurm",
        partition="gpu",
        state="RUNNING",
        nodes=2,
        node_list="rc-gpu-[0-1]",
        submit_time=timezone.now(),
        start_time=timezone.now(),
        owner=owner,
        submitted_by_mtc=True,
        script="#!/bin/bash\nsrun true\n",
        recipe=recipe,
        parameters={**RECIPES[recipe].defaults(), "steps": 60, "lr": 0.001, "nodes": 2},
        checkpoint_dir=f"/data/runs/{recipe}-1/checkpoints",
        metrics={
            "step": points,
            "first_loss": 5.5,
            "last_loss": 3.25,
            "lr": 0.001,
            "grad_norm": 0.75,
            "tokens_per_s": 12345.6,
            "mfu": 0.0123,
            "last_checkpoint_step": 40,
        },
    )
    values.update(fields)
    job = Job.objects.create(**values)
    JobEvent.objects.create(job=job, time=timezone.now(), state="PENDING", cause="submitted")
    JobMetric.objects.bulk_create(
        JobMetric(
            job=job,
            step=s,
            values={"loss": 5.5 - s / 100, "tokens_per_s": 12000.0 + s, "mfu": 0.012, "lr": 1e-3},
        )
        for s in range(1, points + 1)
    )
    return job


# --- the catalog page -----------------------------------------------------------------
def test_urls_reverse_to_the_documented_paths():
    assert reverse("recipes:recipes") == "/recipes/"
    assert (
        reverse("recipes:recipe_launch", args=["c1", "sft"]) == "/clusters/c1/recipes/sft/launch/"
    )


def test_recipes_page_lists_every_recipe_and_its_parameters(user_client, cluster):
    Cluster.objects.create(
        cluster_id="busy", spec=make_spec("busy"), state="DEGRADED", display_name="Busy"
    )
    Cluster.objects.create(cluster_id="new", spec=make_spec("new"), state="CREATING")
    text = page(user_client.get("/recipes/"))
    assert 'class="nav-link active" href="/recipes/"' in text
    for recipe in RECIPES.values():
        card = re.search(rf'data-recipe="{recipe.recipe_id}".*?</article>', text, re.S).group(0)
        assert html_lib.escape(recipe.title) in card
        assert html_lib.escape(recipe.description) in card
        assert f'<span class="tag tag-family" title="Model family">{recipe.family}</span>' in card
        for param in recipe.params:
            assert f'<tr data-param="{param.name}">' in card
            assert html_lib.escape(param.help) in card
        # Live clusters (RUNNING, DEGRADED) get a launch link; a CREATING one does not.
        assert f'href="/clusters/rc/recipes/{recipe.recipe_id}/launch/"' in card
        assert f'href="/clusters/busy/recipes/{recipe.recipe_id}/launch/"' in card
        assert "/clusters/new/recipes/" not in card
    assert text.count('data-testid="recipe-card"') == 5
    steps = re.search(r'<tr data-param="steps">.*?</tr>', text, re.S).group(0)
    assert "int" in steps and ">60<" in steps and "1 – 10,000,000" in steps
    model = re.search(r'<tr data-param="model">.*?</tr>', text, re.S).group(0)
    assert "tiny, small, llama3-8b, llama3-70b" in model
    assert "required" in re.search(
        r'data-recipe="continued-pretrain".*?<tr data-param="init_from">.*?</tr>', text, re.S
    ).group(0)


def test_recipes_page_without_a_live_cluster(staff_client):
    text = page(staff_client.get("/recipes/"))
    assert 'data-testid="no-live-cluster"' in text and "Launch on" not in text


def test_recipes_page_queries_do_not_grow_with_clusters(user_client, cluster):
    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            page(user_client.get("/recipes/"))
        return len(ctx.captured_queries)

    before = count()
    for i in range(5):
        Cluster.objects.create(cluster_id=f"c{i}", spec=make_spec(f"c{i}"), state="RUNNING")
    assert count() == before


# --- the launch page --------------------------------------------------------------------
def test_launch_page_shows_defaults_and_the_preview_script(user_client, cluster, data_dir):
    text = page(user_client.get(LAUNCH))
    assert 'class="nav-link active" href="/recipes/"' in text
    # Job fields: 2 nodes by default (the cluster has 2 compute nodes), its partitions.
    nodes = field_block(text, "nodes")
    assert 'name="nodes" value="2"' in nodes and 'max="2"' in nodes
    assert '<option value="gpu" selected>gpu</option>' in text
    # Parameters from the catalog, typed: number inputs with limits, selects, checkboxes.
    steps = field_block(text, "steps")
    assert 'type="number"' in steps and 'value="60"' in steps
    assert 'min="1"' in steps and 'max="10000000"' in steps and 'step="1"' in steps
    assert 'step="any"' in field_block(text, "lr") and 'value="0.003"' in field_block(text, "lr")
    assert '<option value="tiny" selected>tiny</option>' in field_block(text, "model")
    assert 'type="checkbox"' in field_block(text, "compile")
    assert 'type="text"' in field_block(text, "data_path")
    # The preview: the exact batch script and run.json, before anything is submitted.
    script = re.search(r'data-testid="preview-script">(.*?)</pre>', text, re.S).group(1)
    assert "torch.distributed.run" in script and "node.train.train" in script
    assert "# mtc recipe llama-pretrain: Llama pretraining" in script
    run_json = html_lib.unescape(
        re.search(r'data-testid="preview-run-json">(.*?)</pre>', text, re.S).group(1)
    )
    config = json.loads(run_json)
    assert config["recipe"] == "llama-pretrain" and config["steps"] == 60
    assert config["precision"] == "fp32"  # emulated GPUs: CPU training
    sbatch = re.search(r'data-testid="preview-sbatch">(.*?)</code>', text, re.S).group(1)
    assert sbatch.startswith("sbatch ") and "--gpus-per-node=8" in sbatch and "--mem=0" in sbatch
    assert 'data-testid="launch-button"' in text and "disabled" not in re.search(
        r'<button[^>]*data-testid="launch-button"[^>]*>', text
    ).group(0)
    assert not Job.objects.exists()
    assert not (data_dir / "clusters").exists()  # a preview writes nothing


def test_one_compute_node_defaults_to_one_node(user_client, data_dir):
    spec = validate_cluster_spec(make_spec("one", nodes=1))
    Cluster.objects.create(cluster_id="one", spec=spec, state="RUNNING")
    text = page(user_client.get("/clusters/one/recipes/sft/launch/"))
    assert re.search(r'<input type="number" name="nodes" value="1"', text)
    assert "torch.distributed.run" in text


def test_preview_follows_the_posted_values(user_client, cluster, data_dir):
    data = form_values(steps="30", checkpoint_interval="10", model="small", nodes="1")
    data["preview"] = "1"
    text = page(user_client.post(LAUNCH, data))
    script = re.search(r'data-testid="preview-script">(.*?)</pre>', text, re.S).group(1)
    assert "# model small, 30 steps, a checkpoint every 10 steps in" in script
    assert 'data-testid="form-errors"' not in text
    body = json.loads(
        html_lib.unescape(re.search(r'data-testid="api-body">(.*?)</pre>', text, re.S).group(1))
    )
    assert body["nodes"] == 1 and body["overrides"]["steps"] == 30
    assert previewed(text) == body_digest(body)
    assert not Job.objects.exists()


def test_continued_pretrain_asks_for_its_checkpoint_before_the_preview(user_client, cluster):
    text = page(user_client.get("/clusters/rc/recipes/continued-pretrain/launch/"))
    assert 'data-testid="preview-script"' not in text
    missing = re.search(r'data-testid="preview-missing">(.*?)</p>', text, re.S).group(1)
    assert "<code>init_from</code>" in missing
    assert "has-error" not in text  # nothing was posted yet: no error marks
    assert re.search(r'<button[^>]*data-testid="launch-button"[^>]*disabled', text)


@pytest.mark.parametrize("action", ["preview", "launch"])
def test_bad_values_show_errors_beside_their_fields(
    user_client, cluster, data_dir, fake_sbatch, action
):
    data = form_values(steps="0", lr="5", data_path="../../etc/passwd")
    data[action] = "1"
    text = page(user_client.post(LAUNCH, data))
    assert 'data-testid="form-errors"' in text
    steps = field_block(text, "steps")
    assert "has-error" in steps and "Must be at least 1." in steps
    lr = field_block(text, "lr")
    assert "has-error" in lr and "Must be at most 1." in lr
    assert "has-error" in field_block(text, "data_path")
    assert "has-error" not in field_block(text, "model")
    assert 'value="0"' in steps  # what was typed stays in the field
    assert 'data-testid="preview-script"' not in text
    assert not Job.objects.exists() and not fake_sbatch


def test_a_path_the_user_may_not_read_is_an_error_beside_its_field(
    user_client, cluster, data_dir, fake_sbatch, settings
):
    """MTC_IDENTITY=local: the path is checked as the user's own account."""
    from identity.models import PosixAccount
    from identity.sources import local

    settings.MTC_IDENTITY = "local"
    secret = data_dir / "secret"
    secret.mkdir(mode=0o700)
    try:
        for action in ("preview", "launch"):
            text = page(
                user_client.post(LAUNCH, {**form_values(data_path=str(secret)), action: "1"})
            )
            block = field_block(text, "data_path")
            assert "has-error" in block and "may not read it" in block
            assert "has-error" not in field_block(text, "steps")
            assert 'data-testid="preview-script"' not in text
        assert not Job.objects.exists() and not fake_sbatch
    finally:
        for name in PosixAccount.objects.filter(source="local").values_list("name", flat=True):
            local.account_delete(name)


def test_job_field_errors_sit_beside_the_job_fields(user_client, cluster, data_dir):
    data = form_values(nodes="99", gpus_per_node="9", name="x\n#SBATCH --uid=0", steps="abc")
    data["preview"] = "1"
    text = page(user_client.post(LAUNCH, data))
    assert "Must be between 1 and 2." in field_block(text, "nodes")
    assert "has-error" in field_block(text, "gpus_per_node")
    assert "has-error" in field_block(text, "name")
    assert "Enter a whole number." in field_block(text, "steps")
    data = form_values(partition="nope", time_limit="forever")
    text = page(user_client.post(LAUNCH, {**data, "preview": "1"}))
    assert "has-error" in field_block(text, "partition")
    assert "has-error" in field_block(text, "time_limit")
    assert not Job.objects.exists()


def test_launch_submits_and_redirects_to_the_job(user_client, user, cluster, data_dir, fake_sbatch):
    data = form_values(steps="30", checkpoint_interval="10", name="my-run", nodes="2")
    text = page(user_client.post(LAUNCH, {**data, "preview": "1"}))
    shown = re.search(r'data-testid="preview-script">(.*?)</pre>', text, re.S).group(1)
    response = user_client.post(LAUNCH, {**data, "launch": "1", "previewed": previewed(text)})
    job = Job.objects.get()
    assert response.status_code == 302
    assert response.url == reverse("jobs:detail", args=["rc", "77"]) == "/clusters/rc/jobs/77/"
    assert job.job_id == "77" and job.owner == user and job.name == "my-run"
    assert job.recipe == "llama-pretrain" and job.nodes == 2
    assert job.parameters["steps"] == 30 and job.parameters["checkpoint_interval"] == 10
    assert job.parameters["model"] == "tiny" and job.parameters["nodes"] == 2
    config = json.loads((Path(job.checkpoint_dir).parent / "run.json").read_text())
    assert config["steps"] == 30 and config["run_dir"] == str(Path(job.checkpoint_dir).parent)
    # sbatch got the script the preview showed (but for the run directory's name).
    # (clusters/rc/runs/ in single-user mode, clusters/rc/users/<name>/runs/ otherwise)
    run_dir = re.escape(str(data_dir / "clusters" / "rc")) + r"(/users/[^/\s']+)?/runs/[^/\s']+"
    assert re.sub(run_dir, "RUN", fake_sbatch["script"]) == re.sub(
        run_dir, "RUN", html_lib.unescape(shown)
    )
    assert "--job-name=my-run" in fake_sbatch["args"] and "--nodes=2" in fake_sbatch["args"]
    followed = page(user_client.get(response.url))
    assert "Launched Llama pretraining: job 77 (my-run)." in followed


def test_launch_straight_from_the_defaults_preview(user_client, cluster, data_dir, fake_sbatch):
    for recipe_id in ("llama-pretrain", "rl"):
        url = f"/clusters/rc/recipes/{recipe_id}/launch/"
        text = page(user_client.get(url))  # the page shows the defaults' script
        data = {**form_values(recipe_id), "launch": "1", "previewed": previewed(text)}
        response = user_client.post(url, data)
        assert response.status_code == 302, re.findall(r'field-errors".*?</ul>', html(response))
    assert sorted(Job.objects.values_list("recipe", flat=True)) == ["llama-pretrain", "rl"]


def html(response) -> str:
    return response.content.decode()


def test_launch_with_values_changed_since_the_preview_shows_it_again(
    user_client, cluster, data_dir, fake_sbatch
):
    text = page(user_client.get(LAUNCH))
    data = form_values(steps="45")  # changed after the page showed the defaults' script
    text = page(user_client.post(LAUNCH, {**data, "launch": "1", "previewed": previewed(text)}))
    assert 'data-testid="preview-notice"' in text and not Job.objects.exists()
    assert "# model tiny, 45 steps" in text
    response = user_client.post(LAUNCH, {**data, "launch": "1", "previewed": previewed(text)})
    assert response.status_code == 302 and Job.objects.get().parameters["steps"] == 45


def test_slurm_errors_and_conflicts_are_form_errors(user_client, cluster, data_dir, monkeypatch):
    from jobs import services
    from slurm import SlurmError, client

    def refuse(self, args, script, env, **kwargs):
        raise SlurmError("sbatch: error: Batch job submission failed", permanent=True)

    monkeypatch.setattr(client.SlurmClient, "submit", refuse)
    data = form_values()
    text = page(user_client.post(LAUNCH, {**data, "preview": "1"}))
    launch = {**data, "launch": "1", "previewed": previewed(text)}
    text = page(user_client.post(LAUNCH, launch))
    errors = re.search(r'data-testid="form-errors">(.*?)</div>', text, re.S).group(1)
    assert "Slurm refused the job" in errors and "Batch job submission failed" in errors
    assert not Job.objects.exists()

    def conflict(**kwargs):
        raise services.JobConflict("Cluster 'rc' is UPDATING; try again.")

    monkeypatch.setattr(services, "job_submit", conflict)
    text = page(user_client.post(LAUNCH, launch))
    assert "Cluster &#x27;rc&#x27; is UPDATING; try again." in text

    Cluster.objects.filter(pk=cluster.pk).update(state="ERROR")
    text = page(user_client.post(LAUNCH, launch))
    assert 'data-testid="cluster-not-ready"' in text
    assert "is ERROR; jobs need it RUNNING." in text
    assert not Job.objects.exists()


def test_unknown_recipe_or_cluster_is_404(user_client, cluster):
    assert user_client.get("/clusters/rc/recipes/nope/launch/").status_code == 404
    assert user_client.get("/clusters/nope/recipes/sft/launch/").status_code == 404


def test_the_launch_page_needs_a_login(client, cluster):
    response = client.get(LAUNCH)
    assert response.status_code == 302 and response.url.startswith("/accounts/login/")


def test_every_recipe_renders_and_no_parameter_clashes_with_a_job_field(user_client, cluster):
    for recipe in RECIPES.values():
        assert not {p.name for p in recipe.params} & set(JOB_FIELDS)
        text = page(user_client.get(f"/clusters/rc/recipes/{recipe.recipe_id}/launch/"))
        for param in recipe.params:
            assert f'data-field="{param.name}"' in text


def test_form_body_has_every_set_parameter_and_skips_empty_fields():
    recipe = RECIPES["rl"]
    form = RecipeLaunchForm(
        form_values("rl", group_size="8", compile="on", init_from=" /ckpt/run-1 "),
        recipe=recipe,
        partitions=["gpu"],
    )
    assert form.is_valid(), form.errors
    body = form.launch_body()
    assert set(body) == {"nodes", "partition", "overrides"}
    assert body["overrides"]["group_size"] == 8 and body["overrides"]["compile"] is True
    assert body["overrides"]["init_from"] == "/ckpt/run-1"
    assert "data_path" not in body["overrides"]  # empty: the recipe's default (None)
    assert recipe.validate(body["overrides"])["kl_coef"] == 0.0


# --- a recipe job's page ------------------------------------------------------------------
def series_json(text: str) -> dict:
    match = re.search(
        r'<script id="training-series" type="application/json">(.*?)</script>', text, re.S
    )
    assert match, "no json_script data"
    return json.loads(match.group(1))


def test_recipe_job_page_has_the_training_card_and_chart_data(user_client, user, cluster):
    job = make_recipe_job(cluster, user, points=12)
    text = page(user_client.get(f"/clusters/rc/jobs/{job.job_id}/"))
    training = re.search(r'data-testid="training">.*?</section>', text, re.S).group(0)
    assert "Llama pretraining" in training and "<code>llama-pretrain</code>" in training
    # Summary figures.
    figures = re.search(
        r'data-testid="training-figures">(.*?)<div class="training-body">', text, re.S
    )
    figures = re.sub(r"\s+", " ", figures.group(1))
    assert "12 <small>/ 60</small>" in figures
    assert "3.2500" in figures and "from 5.5000 (-40.9 %)" in figures
    assert "12,346" in figures and "1.23 <small>%</small>" in figures
    assert "step 40" in figures and 'aria-valuenow="20"' in figures
    assert "Reward" not in figures  # not an rl job
    # Parameters (changed ones marked) and the checkpoint directory.
    params = re.search(r'data-testid="training-parameters">(.*?)</table>', text, re.S).group(1)
    assert '<tr class="changed" title="default: 0.003"><th scope="row"><code>lr</code>' in params
    assert "<code>seed</code></th><td>1234</td>" in params
    assert "/data/runs/llama-pretrain-1/checkpoints" in training
    # Chart data as JSON (json_script), plotly from the local URL, the chart script.
    series = series_json(text)
    assert series["step"] == list(range(1, 13))
    assert series["loss"][0] == pytest.approx(5.49) and len(series["tokens_per_s"]) == 12
    assert "reward" not in series
    assert f'<script src="{reverse("plotly-js")}" defer></script>' in text
    assert '<script src="/static/mtc-charts.js" defer></script>' in text
    assert_loads_nothing_remote(text)
    assert 'data-metrics-url="/api/v1/clusters/rc/jobs/7/metrics"' in text


def test_rl_job_shows_reward_and_resume(user_client, user, cluster):
    job = make_recipe_job(cluster, user, recipe="rl", points=3)
    job.metrics.update({"reward": 0.625, "resumed_from_step": 20})
    job.save()
    JobMetric.objects.filter(job=job, step=2).update(values={"loss": 1.0, "reward": 0.5})
    text = page(user_client.get(f"/clusters/rc/jobs/{job.job_id}/"))
    assert 'data-chart="reward"' in text
    figures = re.search(
        r'data-testid="training-figures">(.*?)<div class="training-body">', text, re.S
    )
    assert "0.625" in figures.group(1) and "resumed from step 20" in figures.group(1)
    assert series_json(text)["reward"] == [None, 0.5, None]


def test_a_plain_job_page_loads_no_charts(user_client, user, cluster):
    job = Job.objects.create(
        cluster=cluster, job_id="8", job_number=8, name="plain", owner=user, submitted_by_mtc=True
    )
    text = page(user_client.get(f"/clusters/rc/jobs/{job.job_id}/"))
    assert "plotly" not in text and "training-series" not in text
    assert 'data-testid="training"' not in text


def test_recipe_job_without_points_yet(user_client, user, cluster):
    job = make_recipe_job(cluster, user, points=0, metrics={})
    text = page(user_client.get(f"/clusters/rc/jobs/{job.job_id}/"))
    assert series_json(text) == {"step": []}
    figures = re.search(
        r'data-testid="training-figures">(.*?)<div class="training-body">', text, re.S
    )
    assert "none" in figures.group(1)  # no checkpoint yet
    assert 'data-chart="loss"' in text and 'data-chart="tokens_per_s"' in text


def test_hostile_parameters_and_metrics_are_escaped(user_client, user, cluster):
    job = make_recipe_job(
        cluster,
        user,
        points=2,
        name=HOSTILE,
        parameters={"data_path": HOSTILE, "steps": HOSTILE, HOSTILE: "x"},
        checkpoint_dir=f"/data/{HOSTILE}",
        metrics={"step": HOSTILE, "last_loss": HOSTILE, "resumed_from_step": HOSTILE},
    )
    JobMetric.objects.create(job=job, step=3, values={"loss": HOSTILE, "tokens_per_s": "</script>"})
    for url in (f"/clusters/rc/jobs/{job.job_id}/", f"/clusters/rc/jobs/{job.job_id}/fragment/"):
        text = page(user_client.get(url))
        assert HOSTILE not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    text = page(user_client.get(f"/clusters/rc/jobs/{job.job_id}/"))
    series = series_json(text)
    assert series["loss"][-1] is None and series["tokens_per_s"][-1] is None


def test_non_finite_figures_do_not_break_the_page(user, cluster):
    job = make_recipe_job(cluster, user, points=0)
    job.metrics = {"step": 5, "last_loss": float("nan"), "first_loss": 2.0, "mfu": float("inf")}
    figures = {f["key"]: f for f in training_figures(job)}
    assert figures["loss"]["value"] == "NaN" and figures["mfu"]["value"] == "∞"
    JobMetric.objects.create(job=job, step=1, values={"loss": 1.5, "mfu": True, "lr": "x"})
    # Only finite numbers reach the charts; a column without any is left out.
    assert recipe_job_series(job)["training_series"] == {"step": [1], "loss": [1.5]}


def test_job_page_queries_do_not_grow_with_metric_points(user_client, user, cluster):
    small = make_recipe_job(cluster, user, job_id="10", points=10)
    large = make_recipe_job(cluster, user, job_id="11", points=500)

    def count(url: str) -> int:
        with CaptureQueriesContext(connection) as ctx:
            page(user_client.get(url))
        return len(ctx.captured_queries)

    assert count(f"/clusters/rc/jobs/{small.job_id}/") == count(
        f"/clusters/rc/jobs/{large.job_id}/"
    )
    text = page(user_client.get(f"/clusters/rc/jobs/{large.job_id}/"))
    assert len(series_json(text)["step"]) == 500
    # The live fragment carries the figures but no series (and no metric query).
    with CaptureQueriesContext(connection) as ctx:
        fragment = page(user_client.get(f"/clusters/rc/jobs/{large.job_id}/fragment/"))
    assert not any("jobs_jobmetric" in q["sql"] for q in ctx.captured_queries)
    assert 'data-testid="training-figures"' in fragment and "training-series" not in fragment


def test_users_see_only_their_own_recipe_jobs(user_client, operator, cluster):
    job = make_recipe_job(cluster, operator, points=2)
    assert user_client.get(f"/clusters/rc/jobs/{job.job_id}/").status_code == 404


# --- in the browser ------------------------------------------------------------------------
SHOTS = Path("/tmp/ui-shots")


@pytest.mark.browser
def test_launch_and_watch_the_charts_in_the_browser(
    live_server, transactional_db, operator, browser, data_dir, fake_sbatch
):
    from playwright.sync_api import expect

    cluster = Cluster.objects.create(
        cluster_id="rc", spec=validate_cluster_spec(make_spec("rc", nodes=2)), state="RUNNING"
    )
    running = make_recipe_job(cluster, operator, job_id="12", points=5)
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(20_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(live_server.url + "/recipes/")
    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill("pw-olga-123")
    page.get_by_role("button", name="Sign in").click()

    # The catalog: a card per recipe, launched from one of them.
    expect(page.get_by_test_id("recipe-card")).to_have_count(5)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "recipes.png"), full_page=True)
    card = page.locator('[data-recipe="llama-pretrain"]')
    card.get_by_role("link", name="Launch on rc").click()

    # The launch page shows the script for the defaults; an edit makes it stale.
    expect(page.get_by_test_id("preview-script")).to_contain_text("torch.distributed.run")
    launch = page.get_by_test_id("launch-button")
    expect(launch).to_be_enabled()
    page.get_by_label("steps", exact=True).fill("30")
    expect(launch).to_be_disabled()
    page.get_by_role("button", name="Preview").click()
    expect(page.get_by_test_id("preview-script")).to_contain_text("model tiny, 30 steps")
    page.screenshot(path=str(SHOTS / "recipe-launch.png"), full_page=True)
    launch.click()
    expect(page).to_have_url(f"{live_server.url}/clusters/rc/jobs/77/")
    expect(page.locator(".messages")).to_contain_text("Launched Llama pretraining: job 77")
    assert Job.objects.get(job_id="77").parameters["steps"] == 30
    assert "torch.distributed.run" in fake_sbatch["script"]

    # A running job's charts follow the metrics endpoint and survive fragment swaps.
    page.goto(f"{live_server.url}/clusters/rc/jobs/{running.job_id}/")
    charts = page.locator("#training-charts[data-charts-ready]")
    expect(charts).to_have_count(1)
    points = "document.querySelector('[data-chart=loss]').data[0].x.length"
    assert page.evaluate(points) == 5
    JobMetric.objects.bulk_create(
        JobMetric(job=running, step=s, values={"loss": 5.0 - s / 50, "tokens_per_s": 12000.0})
        for s in range(6, 21)
    )
    Job.objects.filter(pk=running.pk).update(metrics={**running.metrics, "step": 20})
    page.wait_for_function(f"{points} === 20", timeout=15_000)
    expect(page.locator('[data-figure="step"] .figure-value')).to_contain_text("20")
    expect(charts).to_have_count(1)  # still the drawn element after the fragment swaps
    page.screenshot(path=str(SHOTS / "recipe-job.png"), full_page=True)
    assert not errors, errors
    page.close()
