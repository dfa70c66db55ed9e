"""The model registry without Slurm: one real tiny training run (the runtime, in this
process) gives a real checkpoint; jobs that "completed" with it are registered, exported
with save_pretrained and loaded back by transformers. The API, aliases, lineage through
``init_from: models/<name>@<ref>``, the delete refusal and the pages."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.apps import apps
from django.db.models import ProtectedError
from django.test import Client
from django.utils import timezone

from clusters.models import Cluster
from clusters.spec import validate_cluster_spec
from jobs.models import Job
from recipes.catalog import RECIPES
from registry import services
from registry.models import Model, ModelVersion

from .conftest import make_spec

TINY_RUN = {
    "recipe": "llama-pretrain",
    "model": "tiny",
    "steps": 3,
    "checkpoint_interval": 3,
    "global_batch": 4,
    "seq_len": 32,
    "corpus_bytes": 200_000,
}


# --- fixtures and helpers ---------------------------------------------------------------
@pytest.fixture(autouse=True)
def shared_identity(settings):
    """The checkpoints here are written by the test (root) into pytest's 0700 tmp dirs,
    as a single-user job would; exports as the owner's account: test_registry_owner."""
    settings.MTC_IDENTITY = "single-user"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished tiny llama-pretrain run (3 steps, about 2 s on one CPU)."""
    from node.train import train

    run = tmp_path_factory.mktemp("registry") / "run-1"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({**TINY_RUN, "run_dir": str(run)}))
    assert train.main(["--config", str(run / "run.json")]) == 0
    assert (run / "checkpoints" / "step-000003" / "COMPLETE").exists()
    return run


@pytest.fixture
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.CELERY_TASK_ALWAYS_EAGER = True
    return tmp_path


@pytest.fixture
def cluster(db):
    spec = validate_cluster_spec(make_spec("rg", nodes=2))
    return Cluster.objects.create(cluster_id="rg", spec=spec, state="RUNNING")


@pytest.fixture
def other_api(django_user_model):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(django_user_model.objects.create_user("otto", password="pw-otto-1"))
    return client


@pytest.fixture
def user_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def fake_sbatch(monkeypatch):
    """The Slurm boundary: sbatch answers job ids 501, 502, ..."""
    from slurm import client

    count = {"n": 500}

    def fake_submit(self, args, script, env, **kwargs):
        count["n"] += 1
        return str(count["n"])

    monkeypatch.setattr(client.SlurmClient, "submit", fake_submit)


def completed_job(cluster, owner, run_dir: Path, *, job_id="11", **fields) -> Job:
    """A recipe job as the poller leaves it once it completed."""
    recipe = fields.pop("recipe", "llama-pretrain")
    values = dict(
        cluster=cluster,
        job_id=job_id,
        job_number=int(job_id),
        name=f"{recipe}-tiny",
        user="slurm",
        state="COMPLETED",
        nodes=1,
        submit_time=timezone.now(),
        end_time=timezone.now(),
        owner=owner,
        submitted_by_mtc=True,
        recipe=recipe,
        parameters={**RECIPES[recipe].defaults(), **TINY_RUN, "nodes": 1},
        checkpoint_dir=str(run_dir / "checkpoints"),
        metrics={"step": 3, "first_loss": 6.9, "last_loss": 6.5, "tokens_per_s": 3e4, "done": 1},
        # The poller has read all of metrics.jsonl.
        metrics_offset=(run_dir / "metrics.jsonl").stat().st_size,
    )
    values.update(fields)
    return Job.objects.create(**values)


def register(job, capture) -> ModelVersion:
    """Run the poll; the export task runs when its transaction commits."""
    with capture(execute=True):
        assert services.registrations_process() == 1
    return ModelVersion.objects.get(source_job=job)


def error_of(response) -> dict:
    return response.json()["error"]


# --- registration and export -------------------------------------------------------------
def test_a_completed_job_is_registered_exported_and_loads_in_transformers(
    cluster, user, run_dir, data_dir, django_capture_on_commit_callbacks
):
    job = completed_job(cluster, user, run_dir, register_as="tiny-llama")
    version = register(job, django_capture_on_commit_callbacks)

    assert (version.model.name, version.number, version.state) == ("tiny-llama", 1, "READY")
    assert version.model.owner == user and version.created_by == user
    assert version.checkpoint_path == str(run_dir / "checkpoints" / "step-000003")
    assert version.metrics == {"step": 3, "first_loss": 6.9, "last_loss": 6.5, "tokens_per_s": 3e4}
    assert version.recipe == "llama-pretrain" and version.parameters["steps"] == 3
    assert version.data["sequences_seen"] == 12 and version.parent is None
    assert version.cluster == cluster
    export = Path(version.export_path)
    assert export == data_dir / "registry" / "tiny-llama" / "1"
    assert (export / "model.safetensors").is_file() and (export / "tokenizer.json").is_file()
    assert "LlamaForCausalLM" in version.status_message
    assert not (export / "chat_template.jinja").exists()  # pretraining: no chat

    # Idempotent: the job has its version, a second poll registers nothing.
    assert services.registrations_process() == 0

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(export)
    tokenizer = AutoTokenizer.from_pretrained(export)
    inputs = tokenizer("def main(", return_tensors="pt")
    assert inputs.input_ids[0, 0].item() == tokenizer.bos_token_id
    out = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    assert out.shape[1] == inputs.input_ids.shape[1] + 6 or out[0, -1] == tokenizer.eos_token_id
    assert isinstance(tokenizer.decode(out[0], skip_special_tokens=True), str)
    # The exported weights are the checkpoint's.
    import torch.distributed.checkpoint as dcp

    state = {k: torch.empty_like(v) for k, v in model.state_dict().items()}
    dcp.load({"model": state}, checkpoint_id=version.checkpoint_path)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_a_job_without_a_checkpoint_becomes_a_failed_version(
    cluster, user, run_dir, data_dir, tmp_path, django_capture_on_commit_callbacks
):
    empty = tmp_path / "run-x" / "checkpoints"
    empty.mkdir(parents=True)
    job = completed_job(cluster, user, run_dir, register_as="broken", checkpoint_dir=str(empty))
    version = register(job, django_capture_on_commit_callbacks)
    assert version.state == "FAILED" and "No complete checkpoint" in version.status_message


def test_the_poll_waits_for_the_last_metrics_and_skips_unfinished_jobs(
    cluster, user, run_dir, data_dir
):
    completed_job(cluster, user, run_dir, job_id="12", register_as="m", metrics_offset=0)
    completed_job(cluster, user, run_dir, job_id="13", register_as="m", state="RUNNING")
    completed_job(cluster, user, run_dir, job_id="14", register_as="m", state="FAILED")
    completed_job(cluster, user, run_dir, job_id="15")  # not asked to register
    assert services.registrations_process() == 0
    assert not ModelVersion.objects.exists()


def test_numbers_are_taken_once_and_never_reused(
    cluster, user, user_api, run_dir, data_dir, django_capture_on_commit_callbacks
):
    jobs = [
        completed_job(cluster, user, run_dir, job_id=str(20 + i), register_as="seq")
        for i in range(3)
    ]
    with django_capture_on_commit_callbacks(execute=False):
        assert services.registrations_process() == 3
    assert [ModelVersion.objects.get(source_job=j).number for j in jobs] == [1, 2, 3]
    # A job registers once, however it is asked.
    with pytest.raises(services.RegistryConflict):
        services.version_register(job=jobs[0], model_name="seq", created_by=user)
    assert user_api.delete("/api/v1/models/seq/versions/3").status_code == 204
    job = completed_job(cluster, user, run_dir, job_id="30", register_as="seq")
    with django_capture_on_commit_callbacks(execute=False):
        services.registrations_process()
    assert ModelVersion.objects.get(source_job=job).number == 4
    # The deleted version's job is not registered again.
    assert services.registrations_process() == 0


# --- the API -------------------------------------------------------------------------------
def test_models_api_create_list_get_and_errors(user_api, other_api, user):
    created = user_api.post(
        "/api/v1/models", {"name": "chat", "description": "a chat model"}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["owner"] == "uma" and created.json()["version_count"] == 0
    again = user_api.post("/api/v1/models", {"name": "chat"}, format="json")
    assert again.status_code == 409 and error_of(again)["code"] == "ALREADY_EXISTS"
    bad = user_api.post("/api/v1/models", {"name": "Bad Name!"}, format="json")
    assert bad.status_code == 400 and "name" in error_of(bad)["fields"]

    listed = other_api.get("/api/v1/models").json()  # the registry is shared for reading
    assert listed["count"] == 1 and listed["results"][0]["name"] == "chat"
    detail = other_api.get("/api/v1/models/chat").json()
    assert detail["description"] == "a chat model" and detail["versions"] == []
    missing = user_api.get("/api/v1/models/nope")
    assert missing.status_code == 404 and error_of(missing)["code"] == "NOT_FOUND"
    assert user_api.get("/api/v1/models/nope/versions").status_code == 404


def test_versions_api_registers_a_job_and_aliases_move(
    cluster,
    user,
    user_api,
    other_api,
    run_dir,
    data_dir,
    django_assert_max_num_queries,
    django_capture_on_commit_callbacks,
):
    job = completed_job(cluster, user, run_dir)
    body = {"cluster_id": "rg", "job_id": job.job_id}
    with django_capture_on_commit_callbacks(execute=True):
        response = user_api.post("/api/v1/models/base/versions", body, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    assert created["ref"] == "models/base@1" and created["state"] == "PENDING"
    assert created["source_job"] == {"cluster_id": "rg", "job_id": "11"}
    again = user_api.post("/api/v1/models/base/versions", body, format="json")
    assert again.status_code == 409 and "already registered as base@1" in error_of(again)["message"]
    # Someone else's job is not theirs to register.
    other = other_api.post("/api/v1/models/theirs/versions", body, format="json")
    assert other.status_code == 400 and error_of(other)["fields"] == {
        "job_id": "No job by that id that you can see."
    }
    running = completed_job(cluster, user, run_dir, job_id="12", state="RUNNING")
    busy = user_api.post(
        "/api/v1/models/base/versions", {**body, "job_id": running.job_id}, format="json"
    )
    assert busy.status_code == 409 and "RUNNING" in error_of(busy)["message"]

    ModelVersion.objects.create(model=Model.objects.get(name="base"), number=2, state="READY")
    Model.objects.filter(name="base").update(last_version_number=2)
    for alias, number in (("production", 1), ("staging", 2), ("production", 2)):
        r = user_api.post(
            "/api/v1/models/base/aliases", {"alias": alias, "version": number}, format="json"
        )
        assert r.status_code == 200 and r.json() == {"alias": alias, "version": number}
    detail = user_api.get("/api/v1/models/base").json()
    assert detail["aliases"] == {"production": 2, "staging": 2}  # one version per alias
    assert detail["latest_version"] == 2 and detail["version_count"] == 2
    with django_assert_max_num_queries(8):  # not one query per version
        versions = user_api.get("/api/v1/models/base/versions").json()
    assert [v["number"] for v in versions["results"]] == [2, 1]
    assert versions["results"][0]["aliases"] == ["production", "staging"]
    assert versions["results"][1]["state"] == "READY"

    no_version = user_api.post(
        "/api/v1/models/base/aliases", {"alias": "prod", "version": 9}, format="json"
    )
    assert no_version.status_code == 400 and "version" in error_of(no_version)["fields"]
    bad_alias = user_api.post(
        "/api/v1/models/base/aliases", {"alias": "Prod!", "version": 1}, format="json"
    )
    assert bad_alias.status_code == 400 and "alias" in error_of(bad_alias)["fields"]
    foreign = other_api.post(
        "/api/v1/models/base/aliases", {"alias": "mine", "version": 1}, format="json"
    )
    assert foreign.status_code == 403 and "another user" in error_of(foreign)["message"]
    assert other_api.delete("/api/v1/models/base/versions/1").status_code == 403
    removed = user_api.post(
        "/api/v1/models/base/aliases", {"alias": "staging", "version": None}, format="json"
    )
    assert removed.status_code == 200
    assert user_api.get("/api/v1/models/base").json()["aliases"] == {"production": 2}


def test_deleting_a_version_removes_its_export(
    cluster, user, user_api, run_dir, data_dir, django_capture_on_commit_callbacks
):
    job = completed_job(cluster, user, run_dir, register_as="gone")
    version = register(job, django_capture_on_commit_callbacks)
    export = Path(version.export_path)
    assert export.is_dir()
    with django_capture_on_commit_callbacks(execute=True):
        response = user_api.delete("/api/v1/models/gone/versions/1")
    assert response.status_code == 204
    assert not export.exists() and not ModelVersion.objects.filter(pk=version.pk).exists()
    assert user_api.delete("/api/v1/models/gone/versions/1").status_code == 404


def test_deleting_a_protected_version_is_refused_with_the_endpoint_named(
    cluster, user, user_api, run_dir, data_dir, monkeypatch
):
    """The refusal path for serving's Endpoint.version (on_delete=PROTECT), whether or
    not the serving app has its Endpoint yet: the database refuses the delete."""
    model = Model.objects.create(name="served", owner=user)
    version = ModelVersion.objects.create(model=model, number=1, state="READY")

    class Endpoint:
        name = "chat-prod"

    def protected_delete(self, *args, **kwargs):
        raise ProtectedError("protected", {Endpoint()})

    monkeypatch.setattr(ModelVersion, "delete", protected_delete)
    response = user_api.delete("/api/v1/models/served/versions/1")
    assert response.status_code == 409
    message = error_of(response)["message"]
    assert "served by endpoint chat-prod" in message and "Version 1 of 'served'" in message
    assert ModelVersion.objects.filter(pk=version.pk).exists()


def _endpoint_for(version, user, cluster):
    """A serving Endpoint on ``version``, its other required fields filled plainly."""
    endpoint_model = apps.get_model("serving", "Endpoint")
    values = {}
    for field in endpoint_model._meta.concrete_fields:
        if field.primary_key or field.null or field.has_default() or field.blank:
            continue
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            continue
        related = field.related_model
        if related is ModelVersion:
            values[field.name] = version
        elif related is Cluster:
            values[field.name] = cluster
        elif related is not None and related._meta.label == "auth.User":
            values[field.name] = user
        elif field.get_internal_type() in ("CharField", "SlugField", "TextField"):
            values[field.name] = "chat-prod"[: field.max_length or 9]
        elif "Integer" in field.get_internal_type():
            values[field.name] = 1
        elif field.get_internal_type() == "JSONField":
            values[field.name] = {}
    values.setdefault("version", version)
    return endpoint_model.objects.create(**values)


def test_deleting_a_version_an_endpoint_serves_is_refused(cluster, user, user_api, data_dir):
    try:
        apps.get_model("serving", "Endpoint")
    except LookupError:
        pytest.skip("serving.models.Endpoint does not exist yet (built in parallel)")
    model = Model.objects.create(name="served", owner=user)
    version = ModelVersion.objects.create(model=model, number=1, state="READY")
    _endpoint_for(version, user, cluster)
    response = user_api.delete("/api/v1/models/served/versions/1")
    assert response.status_code == 409, response.content
    assert "is served by endpoint" in error_of(response)["message"]
    assert ModelVersion.objects.filter(pk=version.pk).exists()


def test_schema_documents_the_registry(user_api):
    paths = user_api.get("/api/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    for path in (
        "/api/v1/models",
        "/api/v1/models/{name}",
        "/api/v1/models/{name}/versions",
        "/api/v1/models/{name}/versions/{number}",
        "/api/v1/models/{name}/aliases",
    ):
        assert path in paths or path + "/" in paths, path


# --- launching from a registered version ---------------------------------------------------
def _dry_run(api, recipe: str, **body):
    return api.post(
        f"/api/v1/clusters/rg/recipes/{recipe}/launch",
        {"nodes": 1, "dry_run": True, **body},
        format="json",
    )


def test_init_from_a_registered_version_resolves_at_launch(
    cluster, user, user_api, other_api, run_dir, data_dir
):
    model = Model.objects.create(name="base", owner=user, last_version_number=1)
    checkpoint = run_dir / "checkpoints" / "step-000003"
    version = ModelVersion.objects.create(
        model=model, number=1, state="READY", checkpoint_path=str(checkpoint)
    )
    model.aliases.create(alias="production", version=version)
    for ref in ("models/base@1", "models/base@production"):
        response = _dry_run(user_api, "sft", overrides={"init_from": ref, "steps": 4})
        assert response.status_code == 200, response.content
        plan = response.json()
        assert plan["run_config"]["init_from"] == str(checkpoint)
        assert "init_from_version" not in plan["run_config"]
        assert plan["parameters"]["init_from"] == ref
        assert plan["parameters"]["init_from_version"] == "base@1"

    for ref, message in (
        ("models/nope@1", "No model 'nope'"),
        ("models/base@7", "has no version 7"),
        ("models/base@canary", "has no alias 'canary'"),
        ("models/Base", "models/<name>@<alias or version number>"),
    ):
        response = _dry_run(user_api, "continued-pretrain", overrides={"init_from": ref})
        assert response.status_code == 400, ref
        assert message in error_of(response)["fields"]["overrides.init_from"], ref

    gone = ModelVersion.objects.create(
        model=model, number=2, checkpoint_path=str(run_dir / "nothing" / "step-000001")
    )
    response = _dry_run(user_api, "rl", overrides={"init_from": f"models/base@{gone.number}"})
    assert "is no longer there" in error_of(response)["fields"]["overrides.init_from"]

    # register_as: a valid name, not someone else's model.
    bad = _dry_run(user_api, "llama-pretrain", register_as="Not OK")
    assert bad.status_code == 400 and "register_as" in error_of(bad)["fields"]
    foreign = _dry_run(other_api, "llama-pretrain", register_as="base")
    assert error_of(foreign)["fields"] == {"register_as": "Model 'base' belongs to another user."}
    ok = _dry_run(user_api, "llama-pretrain", register_as="base")
    assert ok.status_code == 200 and ok.json()["register_as"] == "base"


def test_launch_records_register_as_and_the_parent_version(
    cluster, user, user_api, run_dir, data_dir, fake_sbatch, django_capture_on_commit_callbacks
):
    base = Model.objects.create(name="base", owner=user, last_version_number=1)
    parent = ModelVersion.objects.create(
        model=base,
        number=1,
        state="READY",
        recipe="llama-pretrain",
        checkpoint_path=str(run_dir / "checkpoints" / "step-000003"),
    )
    response = user_api.post(
        "/api/v1/clusters/rg/recipes/sft/launch",
        {
            "nodes": 1,
            "register_as": "base",
            "overrides": {"init_from": "models/base@1", "steps": 4},
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    job = Job.objects.get(cluster=cluster, job_id=response.json()["job_id"])
    assert job.register_as == "base" and job.parameters["init_from_version"] == "base@1"
    run_json = json.loads((Path(job.checkpoint_dir).parent / "run.json").read_text())
    assert run_json["init_from"] == parent.checkpoint_path

    # It "completes" with the parent's checkpoint (no Slurm here); the child records it.
    Job.objects.filter(pk=job.pk).update(
        state="COMPLETED",
        end_time=timezone.now(),
        checkpoint_dir=str(run_dir / "checkpoints"),
        metrics_offset=(run_dir / "metrics.jsonl").stat().st_size,
    )
    child = register(job, django_capture_on_commit_callbacks)
    assert (child.number, child.parent, child.recipe, child.state) == (2, parent, "sft", "READY")
    versions = user_api.get("/api/v1/models/base/versions").json()["results"]
    assert versions[0]["parent"] == "base@1" and versions[1]["children"] == ["base@2"]

    # An sft version chats the way it was trained: "<bos> prompt" then the answer.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(child.export_path)
    messages = [{"role": "system", "content": "hi"}, {"role": "user", "content": "2+3="}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == "<|bos|>2+3="


# --- pages -----------------------------------------------------------------------------------
def test_model_pages_show_versions_lineage_and_escape_names(
    cluster, user, user_client, run_dir, django_assert_max_num_queries
):
    hostile = '<script>alert("x")</script>'
    base = Model.objects.create(name="base", owner=user, description=hostile)
    job = completed_job(cluster, user, run_dir)
    v1 = ModelVersion.objects.create(
        model=base,
        number=1,
        state="READY",
        source_job=job,
        cluster=cluster,
        recipe="llama-pretrain",
        metrics={"last_loss": 2.5, "step": 60},
        export_path="/data/registry/base/1",
    )
    v2 = ModelVersion.objects.create(
        model=base, number=2, state="FAILED", status_message=hostile, parent=v1, recipe="sft"
    )
    chat = Model.objects.create(name="chat", owner=user)
    ModelVersion.objects.create(model=chat, number=1, state="PENDING", parent=v2, recipe="rl")
    base.aliases.create(alias="production", version=v1)

    listing = user_client.get("/models/").content.decode()
    assert 'href="/models/base/"' in listing and 'href="/models/chat/"' in listing
    assert hostile not in listing and "&lt;script&gt;" in listing
    assert "production → 1" in listing

    with django_assert_max_num_queries(12):
        text = user_client.get("/models/base/").content.decode()
    assert hostile not in text and "&lt;script&gt;alert" in text
    rows = {n: re.search(rf'<tr id="v{n}".*?</tr>', text, re.S).group(0) for n in (1, 2)}
    assert "READY" in rows[1] and 'href="/clusters/rg/jobs/11/"' in rows[1]
    assert "loss <strong>2.5000</strong>" in rows[1] and "production" in rows[1]
    assert "FAILED" in rows[2] and "base@1" in rows[2] and "chat@1" in rows[2]
    chain = re.search(r'data-testid="lineage-chain">(.*?)</p>', text, re.S).group(1)
    assert chain.index("base@1") < chain.index("base@2")
    assert 'href="/jobs/compare/?versions=base@1,base@2"' in text

    chat_page = user_client.get("/models/chat/").content.decode()
    chat_chain = re.search(r'data-testid="lineage-chain">(.*?)</p>', chat_page, re.S).group(1)
    assert [m for m in re.findall(r"<code>(\w+@\d)</code>", chat_chain)] == [
        "base@1",
        "base@2",
        "chat@1",
    ]
    assert user_client.get("/models/nope/").status_code == 404
    assert Client().get("/models/").status_code == 302  # login required


def test_launch_page_has_a_register_as_field(cluster, user_client, data_dir):
    text = user_client.get("/clusters/rg/recipes/sft/launch/").content.decode()
    assert 'name="register_as"' in text and "Register as" in text
    response = user_client.post(
        "/clusters/rg/recipes/sft/launch/",
        {"nodes": "1", "register_as": "Bad Name", "preview": "1", "model": "tiny"},
    )
    text = response.content.decode()
    block = re.search(r'data-field="register_as".*?</div>', text, re.S).group(0)
    assert "Lower-case letters" in block
