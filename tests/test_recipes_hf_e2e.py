"""init_from a Hugging Face model directory on a real 2-node local cluster: a tiny Llama
and a tiny Gemma written by the test with save_pretrained, launched through the API as
continued-pretrain and sft; each job's first logged loss is the model's own loss on
that first batch, not a fresh initialisation's. About 1 min on 2 cores."""

import shutil
from pathlib import Path

import pytest

from .hf_models import corpus, first_batches, hf_model_write, own_and_fresh_loss
from .test_recipes_e2e import cluster, finished, launch, loss_at, output  # noqa: F401 - fixture

pytestmark = pytest.mark.slurm
SMALL = {"steps": 1, "checkpoint_interval": 1, "global_batch": 4, "seq_len": 32}


@pytest.fixture
def shared(settings):
    """World-readable (the jobs run as the user's account, not as root)."""
    base = Path(settings.DATA_DIR) / "hf-e2e"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def readable(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def test_continued_pretrain_and_sft_start_from_hf_models(cluster, user_api, shared, tmp_path):  # noqa: F811
    llama = hf_model_write(shared / "tiny-llama", "llama")
    gemma = hf_model_write(shared / "tiny-gemma", "gemma")
    (shared / "corpus.txt").write_text(corpus())
    readable(shared)
    cont_id = launch(
        user_api,
        "continued-pretrain",
        init_from=str(llama),
        data_path=str(shared / "corpus.txt"),
        **SMALL,
    )
    sft_id = launch(user_api, "sft", init_from=str(gemma), **SMALL)
    for job_id, model, family in ((cont_id, llama, "llama"), (sft_id, gemma, "gemma")):
        job = finished(cluster, job_id)
        run_dir = Path(job.checkpoint_dir).parent
        batches = first_batches(run_dir, 2, tmp_path / job_id)
        own, fresh = own_and_fresh_loss(model, batches, seed=job.parameters["seed"])
        assert loss_at(job, 1) == pytest.approx(own, rel=1e-3), family
        assert abs(loss_at(job, 1) - fresh) > 0.05 * fresh, family
        log = output(job)
        assert "world 2 (FSDP2/gloo)" in log and f"{family}/tiny-{family}" in log
