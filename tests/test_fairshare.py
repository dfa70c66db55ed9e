"""Fair-share between two teams, against real MariaDB + slurmdbd + Slurm: accounts `a`
(shares 3) and `b` (shares 1) keep a backlog of identical one-node jobs on a 2-node
partition. Once both have used the cluster, Slurm's fair-share factor (what `sprio`
and `sshare` report, read through the Slurm adapter) puts `a`'s pending jobs first
while `a` has used less than 3/4 of the cluster, even when it has used more than `b`:
so `a` gets about three of every four starts.

Slurm adds usage only when its priority thread runs (PriorityCalcPeriod, one minute at
the least), so the test waits for one such round and then asserts the order it
reports; it never counts starts against a clock."""

import getpass
import os
from datetime import timedelta

import pytest
from django.utils import timezone

from clusters import accounts as account_services
from clusters import services as cluster_services
from clusters.models import Cluster
from clusters.providers import get_provider
from jobs.models import Job
from jobs.sync import jobs_sync
from slurm import fairshare

from .conftest import make_spec
from .waiting import wait_until

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        not os.environ.get("MTC_SLURMDBD_PORT"),
        reason="no slurmdbd (scripts/test.sh starts one; MTC_TEST_ACCOUNTING=0 skips it)",
    ),
]

# a, b, a: the first two starts (equal priority, oldest first) go one to each account,
# and until Slurm's first priority round `a` gets two starts for every one of `b`'s.
PATTERN = ("a", "b", "a")
ROUNDS = 8
JOB_S = 6


@pytest.fixture
def cluster(local_clusters):
    spec = make_spec("fs", nodes=2)
    spec["orchestrator_spec"]["slurm_spec"]["config_overrides"] = {
        # Usage and priorities recalculated every minute (Slurm's least), not every 5.
        "PriorityCalcPeriod": 1,
        # Only fair-share orders the backlog: no age or job-size terms.
        "PriorityWeightAge": 0,
        "PriorityWeightJobSize": 0,
        "PriorityWeightPartition": 0,
    }
    cluster_services.cluster_create(spec=spec)
    return Cluster.objects.get(cluster_id="fs")


def usage_share(rows: list[fairshare.ShareRow]) -> dict[str, fairshare.ShareRow]:
    return {r.account: r for r in rows if not r.user and r.account in ("a", "b")}


def test_shares_three_to_one_give_a_three_of_every_four_starts(cluster):
    me = getpass.getuser()  # sbatch runs as this user: it needs an association in both
    for name, shares in (("a", 3), ("b", 1)):
        account_services.account_create(data={"name": name, "shares": shares})
        account_services.association_ensure(cluster=cluster, account=name, user=me)
    client = get_provider(cluster.provider).slurm(cluster)
    owner: dict[str, str] = {}
    for _ in range(ROUNDS):
        for account in PATTERN:
            out = client.run(
                [
                    "sbatch",
                    "--parsable",
                    f"--account={account}",
                    "--nodes=1",
                    "--exclusive",
                    "--time=1",  # a limit lets the backfill scheduler plan starts
                    "--output=/dev/null",
                    f"--wrap=sleep {JOB_S}",
                ]
            ).stdout
            owner[out.strip().split(";")[0]] = account
    try:
        # Both have used the cluster once Slurm's priority thread has counted it: a
        # job's end adds its usage at once, but the shares' ranking (LevelFS) and the
        # jobs' priorities wait for the thread's next round.
        def counted() -> dict[str, fairshare.ShareRow] | None:
            rows = usage_share(fairshare.shares(client, accounts=["a", "b"]))
            done = all(n in rows and rows[n].effective_usage > 0 for n in "ab")
            return rows if done else None

        wait_until(
            counted,
            what=lambda: f"usage for a and b in sshare: {fairshare.shares(client, accounts=[])}",
            timeout=75,
            every=1,
        )

        # Read sshare, sprio, sshare: the same usage on both sides means the order
        # sprio gave was computed from it (a priority round may fall in between).
        def consistent():
            before = usage_share(fairshare.shares(client, accounts=["a", "b"]))
            order = fairshare.priorities(client)
            after = usage_share(fairshare.shares(client, accounts=["a", "b"]))
            same = {n: before[n].raw_usage for n in "ab"} == {n: after[n].raw_usage for n in "ab"}
            return (after, order) if same else None

        shares, order = wait_until(consistent, what="a stable sshare/sprio read", timeout=10)
        a, b = shares["a"], shares["b"]
        assert (a.raw_shares, b.raw_shares) == ("3", "1")
        # Normalized among root's children (root's own user row is one more sibling).
        assert round(a.norm_shares / (a.norm_shares + b.norm_shares), 2) == 0.75

        used_by_a = a.raw_usage / (a.raw_usage + b.raw_usage)
        # `a` has used at least as much as `b`: with equal shares `b` would go first.
        assert used_by_a >= 0.5, (a, b)
        pending = [p for p in order if p.job_id in owner]
        assert {owner[p.job_id] for p in pending} == {"a", "b"}, (pending, owner)
        # Slurm's order: every pending job of `a` ahead of every job of `b` while `a`
        # has used less than its 3/4 (Fair Tree ranks by NormShares / EffectvUsage).
        expected_first = "a" if used_by_a < 0.75 else "b"
        ranks_first = "a" if a.level_fs > b.level_fs else "b"
        assert ranks_first == expected_first, (a, b, order)
        accounts_in_order = [owner[p.job_id] for p in pending]
        first_other = accounts_in_order.index("b" if expected_first == "a" else "a")
        assert set(accounts_in_order[:first_other]) == {expected_first}
        assert expected_first not in accounts_in_order[first_other:], accounts_in_order
        fs = {n: {p.fairshare for p in pending if owner[p.job_id] == n} for n in "ab"}
        assert min(fs[expected_first]) > max(fs["b" if expected_first == "a" else "a"]), fs

        # The starts that rule gives from here, each identical job adding the same
        # usage (Slurm's usage per start so far): `a` gets about 3 of every 4. A long
        # run, so where the usage stands now hardly moves the ratio.
        started = len(owner) - len(pending)
        per_start = (a.raw_usage + b.raw_usage) / max(started, 1)
        usage = {"a": float(a.raw_usage), "b": float(b.raw_usage)}
        starts = []
        for _ in range(200):
            nxt = min("ab", key=lambda n: usage[n] / shares[n].norm_shares)
            usage[nxt] += per_start
            starts.append(nxt)

        share_of_starts = starts.count("a") / len(starts)
        print(f"used by a {used_by_a:.2f}; a's share of the next 200 starts {share_of_starts}")
        assert 0.72 <= share_of_starts <= 0.8, "".join(starts)

        # The backlog's expected starts reach the queue (squeue's StartTime, planned by
        # the backfill scheduler, which has run by now: it runs every 30 s).
        def planned() -> list[Job]:
            jobs_sync(cluster=cluster)
            rows = Job.objects.filter(cluster=cluster, state="PENDING")
            return [j for j in rows if j.expected_start_time]

        soonest = min(
            j.expected_start_time
            for j in wait_until(
                planned,
                what=lambda: (
                    "an expected start in the queue: "
                    + client.run(["squeue", "--noheader", "--format=%i %T %S %r"]).stdout
                ),
                timeout=35,
            )
        )
        assert timezone.now() - timedelta(minutes=1) < soonest < timezone.now() + timedelta(hours=1)
    finally:
        client.run(["scancel", f"--user={me}", "--account=a,b"], check=False)
