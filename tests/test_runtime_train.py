"""The training runtime (node/train), run for real on this CPU: no Slurm, no
database. One llama-pretrain tiny run (a real ``python -m`` process) is shared by the
tests that need an uninterrupted reference or a checkpoint to start from; the others
call the entry point's ``main`` in this process (same code, no interpreter start-up)."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from node.train import train

REPO = Path(__file__).resolve().parent.parent
BASE = {
    "recipe": "llama-pretrain",
    "model": "tiny",
    "steps": 60,
    "checkpoint_interval": 20,
    "global_batch": 8,
    "seq_len": 64,
    "lr": 0.003,
    "lr_schedule": "cosine",
    "warmup_steps": 5,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.01,
    "grad_clip": 1.0,
    "precision": "fp32",
    "seed": 1234,
    "data_path": None,
    "init_from": None,
    "activation_checkpointing": False,
    "compile": False,
    "rl": {"group_size": 4, "max_new_tokens": 8, "kl_coef": 0.0},
    "corpus_bytes": 600_000,
}


def write_config(run_dir: Path, **changes) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = {**BASE, **changes, "run_dir": str(run_dir)}
    path = run_dir / "run.json"
    path.write_text(json.dumps(cfg))
    return path


def exit_rank(root: str, rank: int, result: dict) -> None:
    """The end of a test's torch.multiprocessing rank, after its process group is gone:
    write what the test reads, then leave as the runtime's ranks do (exit_process)."""
    from node.train.distributed import exit_process

    Path(root, f"rank{rank}.json").write_text(json.dumps(result))
    exit_process(0)


def read_metrics(run_dir: Path) -> tuple[dict[int, dict], list[dict]]:
    steps, events = {}, []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "event" in row:
            events.append(row)
        else:
            steps[row["step"]] = row  # a re-trained step replaces the earlier line
    return steps, events


def run_inprocess(run_dir: Path, **changes) -> int:
    return train.main(["--config", str(write_config(run_dir, **changes))])


def env_for_subprocess(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), **extra)
    env.pop("MTC_STOP_AT_STEP", None)
    return env


@pytest.fixture(scope="module")
def pretrain_run(tmp_path_factory) -> Path:
    """llama-pretrain tiny, 60 steps, uninterrupted, through ``python -m`` as Slurm runs it."""
    run_dir = tmp_path_factory.mktemp("pretrain")
    config = write_config(run_dir)
    proc = subprocess.run(
        [sys.executable, "-m", "node.train.train", "--config", str(config)],
        cwd=REPO,
        env=env_for_subprocess(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir / "stdout.txt").write_text(proc.stdout)
    return run_dir


def test_pretrain_learns_checkpoints_and_metrics(pretrain_run):
    steps, events = read_metrics(pretrain_run)
    assert sorted(steps) == list(range(1, 61))
    for row in steps.values():
        for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "time"):
            assert isinstance(row[key], float) and math.isfinite(row[key]), (key, row)
        assert row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1
    start = sum(steps[s]["loss"] for s in range(1, 6)) / 5
    end = sum(steps[s]["loss"] for s in range(56, 61)) / 5
    assert end < start - 0.5, (start, end)
    assert steps[6]["lr"] == pytest.approx(0.003, rel=1e-3)  # warm-up over, cosine decay next
    assert steps[60]["lr"] == pytest.approx(0.0003, rel=1e-6)

    kinds = [e["event"] for e in events]
    # The last save is synchronous and announced first (the hang detector waits for it).
    assert kinds == ["start", "checkpoint", "checkpoint", "checkpoint_saving", "checkpoint", "done"]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [20, 40, 60]
    # Interval checkpoints are written in the background: step 21 trained meanwhile,
    # and the checkpoint was marked complete only after that. The last one is synchronous.
    assert [e.get("mode") for e in events if e["event"] == "checkpoint"] == ["async"] * 2 + [None]
    lines = (pretrain_run / "metrics.jsonl").read_text().splitlines()
    order = [(json.loads(x).get("event", "step"), json.loads(x)["step"]) for x in lines]
    assert order.index(("checkpoint", 20)) > order.index(("step", 21))
    ckpts = sorted(p.name for p in (pretrain_run / "checkpoints").iterdir())
    assert ckpts == ["step-000020", "step-000040", "step-000060"]  # no partial dirs left
    for name in ckpts:
        marker = json.loads((pretrain_run / "checkpoints" / name / "COMPLETE").read_text())
        assert marker["step"] == int(name[5:]) and ".metadata" in marker["files"]
    assert list((pretrain_run / "tb").glob("events.out.tfevents.*"))
    assert (pretrain_run / "tokenizer.json").exists()
    out = (pretrain_run / "stdout.txt").read_text()
    assert "step 60/60 loss" in out and "tok/s" in out and "mfu" in out


def test_resume_is_exact(pretrain_run, tmp_path, monkeypatch):
    """Stopped after the step-30 checkpoint (a simulated preemption), that checkpoint
    lost, and started again from the async step-20 one: the run's losses are the
    uninterrupted run's."""
    run_dir = tmp_path / "resumed"
    monkeypatch.setenv("MTC_STOP_AT_STEP", "30")
    assert run_inprocess(run_dir, checkpoint_interval=20) == 0
    steps, events = read_metrics(run_dir)
    assert max(steps) == 30 and events[-1]["event"] == "stopped"
    assert {p.name for p in (run_dir / "checkpoints").iterdir()} == {"step-000020", "step-000030"}

    shutil.rmtree(run_dir / "checkpoints" / "step-000030")
    monkeypatch.delenv("MTC_STOP_AT_STEP")
    assert run_inprocess(run_dir, checkpoint_interval=20) == 0
    steps, events = read_metrics(run_dir)
    resumed = [e for e in events if e["event"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["from_step"] == 20
    reference, _ = read_metrics(pretrain_run)
    for step in (21, 31, 60):
        assert steps[step]["loss"] == pytest.approx(reference[step]["loss"], rel=1e-5), step


def test_incomplete_and_corrupt_checkpoints_are_skipped(pretrain_run, tmp_path, caplog):
    run_dir = tmp_path / "damaged"
    ckpts = run_dir / "checkpoints"
    src = pretrain_run / "checkpoints"
    shutil.copytree(src / "step-000020", ckpts / "step-000020")
    shutil.copytree(src / "step-000040", ckpts / "step-000040")
    (ckpts / "step-000040" / "COMPLETE").unlink()  # the save died before the marker
    shutil.copytree(src / "step-000060", ckpts / "step-000050")
    (ckpts / "step-000050" / "COMPLETE").write_text('{"format": "mtc-dcp-1", "st')  # torn
    shutil.copytree(src / "step-000060", ckpts / "step-000055")
    marker = json.loads((ckpts / "step-000055" / "COMPLETE").read_text())
    marker["step"] = 55
    (ckpts / "step-000055" / "COMPLETE").write_text(json.dumps(marker))
    with open(ckpts / "step-000055" / ".metadata", "r+b") as fh:
        fh.truncate(100)  # a marker whose files do not match
    (ckpts / ".step-000058.partial").mkdir()  # an unfinished save's directory

    with caplog.at_level(logging.WARNING, logger="mtc.runtime"):
        assert run_inprocess(run_dir) == 0
    warned = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "step-000055: .metadata has 100 bytes" in warned
    assert "step-000050: COMPLETE marker unreadable" in warned
    assert "step-000040: no COMPLETE marker" in warned
    steps, events = read_metrics(run_dir)
    assert [e["from_step"] for e in events if e["event"] == "resumed"] == [20]
    assert {e["step"] for e in events if e["event"] == "checkpoint_skipped"} == {40, 50, 55}
    reference, _ = read_metrics(pretrain_run)
    assert steps[60]["loss"] == pytest.approx(reference[60]["loss"], rel=1e-4)
    assert (ckpts / "step-000040" / "COMPLETE").exists()  # saved again, properly


def test_continued_pretrain_from_checkpoint(pretrain_run, tmp_path):
    text = tmp_path / "corpus.txt"
    stdlib = Path(json.__file__).parent
    text.write_text("\n\n".join(p.read_text() for p in sorted(stdlib.glob("*.py"))))
    run_dir = tmp_path / "continued"
    rc = run_inprocess(
        run_dir,
        recipe="continued-pretrain",
        family="llama",
        steps=20,
        checkpoint_interval=10,
        lr=0.001,
        data_path=str(text),
        init_from=str(pretrain_run / "checkpoints"),
    )
    assert rc == 0
    steps, events = read_metrics(run_dir)
    reference, _ = read_metrics(pretrain_run)
    # Starting from trained weights, its first loss is far below a fresh model's.
    assert steps[1]["loss"] < reference[1]["loss"] - 0.5
    assert steps[20]["loss"] < steps[1]["loss"]
    same = (run_dir / "tokenizer.json").read_text() == (pretrain_run / "tokenizer.json").read_text()
    assert same
    assert (run_dir / "checkpoints" / "step-000020" / "COMPLETE").exists()
    state = json.loads((run_dir / "checkpoints/step-000020/trainer_state.json").read_text())
    assert state["init_checkpoint"].endswith("step-000060")


def test_continued_pretrain_needs_init_from(tmp_path):
    assert run_inprocess(tmp_path / "x", recipe="continued-pretrain") == 2


def test_gemma_pretrain_tiny(tmp_path):
    run_dir = tmp_path / "gemma"
    assert run_inprocess(run_dir, recipe="gemma-pretrain", steps=30, checkpoint_interval=30) == 0
    steps, events = read_metrics(run_dir)
    start = json.loads((run_dir / "model.json").read_text())
    assert start["arch"] == "gemma" and start["tie_embeddings"]
    assert sum(steps[s]["loss"] for s in range(26, 31)) < sum(steps[s]["loss"] for s in range(1, 6))
    assert events[-1]["event"] == "done"


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    """sft tiny on generated single-digit addition (operands 0-3): a start for rl."""
    run_dir = tmp_path_factory.mktemp("sft")
    rc = run_inprocess(
        run_dir,
        recipe="sft",
        steps=80,
        checkpoint_interval=40,
        global_batch=16,
        seq_len=16,
        lr=0.01,
        warmup_steps=5,
        max_operand=3,
    )
    assert rc == 0
    return run_dir


def test_sft_masks_prompt_and_learns(sft_run):
    from node.train.sft import IGNORE, sft_batch, sft_example
    from node.train.tokenizer import tokenizer_load

    tok = tokenizer_load(sft_run / "tokenizer.json")
    ids, labels = sft_example(tok, "12+7=", "19", 32)
    prompt_len = 1 + len(tok.encode("12+7="))
    assert labels[:prompt_len] == [IGNORE] * prompt_len  # <bos> and the prompt
    assert labels[prompt_len:] == ids[prompt_len:] == [*tok.encode("19"), tok.eos_id]
    batch = sft_batch(tok, [("1+1=", "2"), ("12+7=", "19")], 32, "cpu")
    assert (batch["labels"][batch["input_ids"] == tok.pad_id] == IGNORE).all()
    assert batch["weight"] == 2 + 3  # response tokens + <eos>, per example

    steps, events = read_metrics(sft_run)
    assert steps[80]["loss"] < steps[1]["loss"] / 3
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [40, 80]


def test_sft_reads_jsonl(tmp_path):
    data = tmp_path / "pairs.jsonl"
    rows = [
        {"prompt": f"capital of {c}? ", "response": r}
        for c, r in [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid")]
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    run_dir = tmp_path / "sft-jsonl"
    rc = run_inprocess(
        run_dir,
        recipe="sft",
        steps=6,
        checkpoint_interval=0,
        global_batch=4,
        seq_len=24,
        data_path=str(data),
    )
    assert rc == 0
    steps, _ = read_metrics(run_dir)
    assert steps[6]["loss"] < steps[1]["loss"]


def test_rl_grpo_reward_rises(sft_run, tmp_path):
    run_dir = tmp_path / "rl"
    rc = run_inprocess(
        run_dir,
        recipe="rl",
        steps=40,
        checkpoint_interval=20,
        global_batch=16,
        seq_len=16,
        lr=0.003,
        warmup_steps=0,
        lr_schedule="constant",
        max_operand=3,
        init_from=str(sft_run),
        rl={"group_size": 8, "max_new_tokens": 3, "kl_coef": 0.0},
    )
    assert rc == 0
    steps, events = read_metrics(run_dir)
    rewards = [steps[s]["reward"] for s in range(1, 41)]
    assert all(0.0 <= r <= 1.0 for r in rewards)
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.05, rewards
    assert events[-1]["event"] == "done"


def test_rl_with_kl_to_initial_policy(sft_run, tmp_path):
    run_dir = tmp_path / "rl-kl"
    rc = run_inprocess(
        run_dir,
        recipe="rl",
        steps=4,
        checkpoint_interval=0,
        global_batch=4,
        seq_len=16,
        max_operand=3,
        init_from=str(sft_run),
        rl={"group_size": 4, "max_new_tokens": 3, "kl_coef": 0.1},
    )
    assert rc == 0
    steps, _ = read_metrics(run_dir)
    assert steps[1]["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy starts as the reference
    assert all(steps[s]["kl"] >= 0 for s in steps)


def test_rl_two_updates_per_batch(sft_run, tmp_path):
    """ppo_epochs=2: steps 1-2 update on one batch of samples, steps 3-4 on the next."""
    run_dir = tmp_path / "rl-ppo"
    rc = run_inprocess(
        run_dir,
        recipe="rl",
        steps=4,
        checkpoint_interval=0,
        global_batch=4,
        seq_len=16,
        max_operand=3,
        init_from=str(sft_run),
        rl={"group_size": 4, "max_new_tokens": 3, "kl_coef": 0.1, "ppo_epochs": 2},
    )
    assert rc == 0
    steps, events = read_metrics(run_dir)
    assert sorted(steps) == [1, 2, 3, 4] and events[-1]["event"] == "done"
    assert steps[1]["reward"] == steps[2]["reward"] and steps[3]["reward"] == steps[4]["reward"]
    assert steps[1]["kl"] == pytest.approx(0.0, abs=1e-6) and steps[2]["kl"] > 0


def test_rl_two_processes_unsharded_rollouts(sft_run, tmp_path):
    """rl over 2 FSDP2 ranks (gloo): rollouts on the gathered copy, ppo_epochs=2."""
    run_dir = tmp_path / "rl-ddp"
    rl = {"group_size": 2, "max_new_tokens": 3, "kl_coef": 0.0, "ppo_epochs": 2}
    config = write_config(
        run_dir,
        recipe="rl",
        steps=2,
        checkpoint_interval=0,
        global_batch=4,
        seq_len=16,
        max_operand=3,
        init_from=str(sft_run),
        rl=rl,
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    proc = subprocess.run(
        [*cmd, "-m", "node.train.train", "--config", str(config)],
        cwd=REPO,
        env=env_for_subprocess(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "world 2 (FSDP2/gloo)" in proc.stdout
    assert "rl rollouts: KV cache, unsharded policy" in proc.stdout
    steps, _ = read_metrics(run_dir)
    assert sorted(steps) == [1, 2]


def test_two_processes_with_torchrun(tmp_path):
    run_dir = tmp_path / "ddp"
    config = write_config(run_dir, steps=20, checkpoint_interval=10)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "node.train.train",
            "--config",
            str(config),
        ],
        cwd=REPO,
        env=env_for_subprocess(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "world 2 (FSDP2/gloo)" in proc.stdout
    steps, events = read_metrics(run_dir)
    assert sorted(steps) == list(range(1, 21)) and events[-1]["event"] == "done"
    assert steps[20]["loss"] < steps[1]["loss"]
    final = run_dir / "checkpoints" / "step-000020"
    marker = json.loads((final / "COMPLETE").read_text())
    assert marker["world_size"] == 2
    assert {"rank-00000.pt", "rank-00001.pt", "__0_0.distcp", "__1_0.distcp"} <= set(
        marker["files"]
    )


def test_two_nodes_as_the_batch_script_starts_them(tmp_path):
    """One torchrun per "node", static rendezvous on 127.0.0.1 and a per-job port: the
    command line recipes/launch.py's batch script runs under srun."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "nodes"
    config = write_config(run_dir, steps=10, checkpoint_interval=5)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={rank}",
                "--nproc-per-node=1",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "-m",
                "node.train.train",
                "--config",
                str(config),
            ],
            cwd=REPO,
            env=env_for_subprocess(OMP_NUM_THREADS="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "world 2 (FSDP2/gloo)" in outs[0] and "done: 10 steps" in outs[0]
    marker = json.loads((run_dir / "checkpoints" / "step-000010" / "COMPLETE").read_text())
    assert marker["world_size"] == 2


def test_keep_checkpoints(tmp_path):
    run_dir = tmp_path / "keep"
    assert run_inprocess(run_dir, steps=8, checkpoint_interval=2, keep_checkpoints=2) == 0
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["step-000006", "step-000008"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_stop_signals_checkpoint_then_exit(tmp_path, sig):
    """Slurm's requeue / preemption (SIGTERM) or --signal warning (SIGUSR1): checkpoint
    after the current step, exit 143; after SIGUSR1 the batch script is asked to requeue."""
    run_dir = tmp_path / "term"
    config = write_config(run_dir, steps=100_000, checkpoint_interval=0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.train.train", "--config", str(config)],
        cwd=REPO, env=env_for_subprocess(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    for line in proc.stdout:
        if line.startswith("step 1/"):
            proc.send_signal(sig)
            break
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out
    _, events = read_metrics(run_dir)
    stopped = events[-1]
    assert stopped["event"] == "stopped" and stopped["reason"] == "signal"
    assert (run_dir / "checkpoints" / f"step-{stopped['step']:06d}" / "COMPLETE").exists()
    requeue = run_dir / train.REQUEUE_FILE
    if sig == signal.SIGUSR1:
        assert json.loads(requeue.read_text()) == {"step": stopped["step"], "signal": "SIGUSR1"}
    else:
        assert not requeue.exists()
