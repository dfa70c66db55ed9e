"""The registry end to end on a real 1-node local Slurm cluster: a tiny llama-pretrain
launched with ``register_as`` becomes version 1 (exported, loaded by transformers), an
sft started from ``models/<name>@1`` becomes version 2 with version 1 as its parent."""

from pathlib import Path

import pytest
from django.test import Client

from clusters import services as cluster_services
from clusters.models import Cluster
from jobs.models import Job
from jobs.sync import jobs_sync
from recipes.metrics import recipe_jobs_ingest
from registry.models import ModelVersion
from registry.tasks import registrations_poll

from .conftest import make_spec
from .waiting import wait_until

pytestmark = pytest.mark.slurm
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "UNKNOWN"}
TINY = {"steps": 6, "checkpoint_interval": 6, "global_batch": 4, "seq_len": 32}


@pytest.fixture
def cluster(local_clusters):
    cluster_services.cluster_create(spec=make_spec("reg", nodes=1))
    return Cluster.objects.get(cluster_id="reg")


def output(job: Job) -> str:
    root = Path(job.checkpoint_dir).parents[2] / "output"
    return "\n".join(p.read_text()[-3000:] for p in sorted(root.glob(f"slurm-{job.job_id}.*")))


def launch_and_register(api, cluster, recipe: str, **overrides) -> ModelVersion:
    """Launch with register_as, play the job poller until it completes, then the
    registration poll (its export task runs inline: Celery is eager here)."""
    response = api.post(
        f"/api/v1/clusters/reg/recipes/{recipe}/launch",
        {"nodes": 1, "register_as": "tiny-e2e", "overrides": {**TINY, **overrides}},
        format="json",
    )
    assert response.status_code == 201, response.content
    job_id = response.json()["job_id"]

    def finished() -> Job | None:
        job = Job.objects.get(cluster=cluster, job_id=job_id)
        if job.state in TERMINAL and job.metrics.get("done"):
            return job
        assert job.state not in TERMINAL, (job.state, output(job))
        return None

    job = wait_until(
        finished,
        before=lambda: (jobs_sync(cluster=cluster), recipe_jobs_ingest(cluster)),
        what=f"job {job_id} to finish",
        timeout=180,
        every=0.3,
    )
    assert job.state == "COMPLETED", output(job)
    registrations_poll()
    return ModelVersion.objects.select_related("model", "parent").get(source_job=job)


def test_register_as_then_sft_from_the_registered_version(cluster, user_api, user):
    first = launch_and_register(user_api, cluster, "llama-pretrain")
    assert (first.model.name, first.number, first.state) == ("tiny-e2e", 1, "READY")
    assert first.parent is None and first.recipe == "llama-pretrain"
    assert first.metrics["step"] == 6 and first.metrics["last_checkpoint_step"] == 6
    assert first.metrics["last_loss"] < first.metrics["first_loss"]
    assert first.checkpoint_path.endswith("/checkpoints/step-000006")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(first.export_path)
    tokenizer = AutoTokenizer.from_pretrained(first.export_path)
    inputs = tokenizer("import os\n", return_tensors="pt")
    generated = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] > inputs.input_ids.shape[1]
    assert isinstance(tokenizer.decode(generated[0]), str)

    second = launch_and_register(user_api, cluster, "sft", init_from="models/tiny-e2e@1")
    assert (second.number, second.parent, second.recipe) == (2, first, "sft")
    assert second.state == "READY", second.status_message
    assert second.parameters["init_from_version"] == "tiny-e2e@1"

    client = Client()
    client.force_login(user)
    page = client.get("/models/tiny-e2e/").content.decode()
    assert 'id="v1"' in page and 'id="v2"' in page
    chain = page[page.index('data-testid="lineage-chain"') :]
    assert chain.index("tiny-e2e@1") < chain.index("tiny-e2e@2")
