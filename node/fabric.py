"""The fabric check's test: all-reduce bus bandwidth and latency between the ranks of one
srun step (a pair of nodes, one rank each), printed by rank 0 as one JSON line.

    srun --nodes=2 --ntasks=2 --ntasks-per-node=1 python -m node.fabric \
        --master-addr HOST --master-port PORT

It joins the process group the way the training runtime does (node/train/distributed.py:
NCCL on CUDA, gloo on CPU), from Slurm's task variables instead of torchrun's. The bus
bandwidth is nccl-tests' figure for all-reduce: algbw x 2(n-1)/n, with the slowest rank's
time, best of a few rounds (a busy host only ever lowers a round's figure). No Django:
this runs on the nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

RESULT_KEY = "mtc_fabric"  # the marker mtc looks for in the job's output
# The rank's process name while it measures (/proc/PID/comm): the local provider's
# `fabric` fault throttles processes by it, so it slows the collectives, not torch's start.
MEASURING_COMM = "mtc-fabric"


def _slurm_to_torchrun_env(master_addr: str, master_port: int) -> None:
    os.environ.setdefault("RANK", os.environ.get("SLURM_PROCID", "0"))
    os.environ.setdefault("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))
    os.environ.setdefault("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)


def _name_process(name: str) -> None:
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(name)
    except OSError:  # not Linux: nothing looks for it there
        pass


def _timed(op, count: int, sync) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(count):
        op()
    sync()
    return time.perf_counter() - start


def measure(
    size_bytes: int,
    iters: int,
    warmup: int,
    latency_iters: int,
    rounds: int = 3,
    warmup_s: float = 1.0,
) -> dict:
    import torch
    import torch.distributed as dist

    from node.train.distributed import dist_close, dist_init

    d = dist_init()
    try:
        if d.world < 2:
            raise SystemExit("the fabric test needs 2 or more ranks (srun --ntasks=2)")
        device = d._comm_device
        cuda = device.type == "cuda"

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize(device)
            dist.barrier()

        _name_process(MEASURING_COMM)
        big = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
        small = torch.ones(1, dtype=torch.float32, device=device)
        # Warm up for a count and a time: links (and, on emulated nodes, the `fabric`
        # fault's throttle, which finds the ranks by name) settle before the rounds.
        # Rank 0's clock decides for all, so every rank runs the same collectives.
        started, more = time.monotonic(), torch.ones(1, device=device)
        done = 0
        while more.item() > 0:
            dist.all_reduce(big)
            done += 1
            more.fill_(float(done < warmup or time.monotonic() - started < warmup_s))
            dist.broadcast(more, src=0)
        # Both ranks wait for the slower one: its time is the pair's; each rank's best round.
        elapsed = min(_timed(lambda: dist.all_reduce(big), iters, sync) for _ in range(rounds))
        latency = min(
            _timed(lambda: dist.all_reduce(small), latency_iters, sync) for _ in range(rounds)
        )
        slowest = d.all_reduce([elapsed, latency], op="max")
        names: list = [None] * d.world
        dist.all_gather_object(names, os.environ.get("SLURMD_NODENAME") or socket.gethostname())
        alg = size_bytes * iters / slowest[0] / 1e9
        return {
            RESULT_KEY: 1,
            "rank": d.rank,
            "nodes": names,
            "backend": dist.get_backend(),
            "bytes": size_bytes,
            "iters": iters,
            "rounds": rounds,
            "alg_gbps": round(alg, 4),
            "bus_gbps": round(alg * 2 * (d.world - 1) / d.world, 4),
            "latency_us": round(slowest[1] / latency_iters * 1e6, 1),
        }
    finally:
        dist_close(d)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--size-mb", type=float, default=0, help="0: 256 on GPUs, 8 on CPUs")
    parser.add_argument("--iters", type=int, default=10, help="all-reduces a round")
    parser.add_argument("--rounds", type=int, default=3, help="the best round counts")
    parser.add_argument("--warmup", type=int, default=3, help="all-reduces before the rounds")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="and seconds, at least")
    parser.add_argument("--latency-iters", type=int, default=20)
    parser.add_argument("--label", default="", help="copied into the result (pass/pair)")
    args = parser.parse_args(argv)
    _slurm_to_torchrun_env(args.master_addr, args.master_port)
    import torch

    size_mb = args.size_mb or (256 if torch.cuda.is_available() else 8)
    result = measure(
        int(size_mb * 2**20) // 4 * 4,
        args.iters,
        args.warmup,
        args.latency_iters,
        args.rounds,
        args.warmup_s,
    )
    if result.pop("rank") == 0:
        result["label"] = args.label
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    status = main()
    from node.train.distributed import exit_process  # torch is loaded by now

    exit_process(status)
