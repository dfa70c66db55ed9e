"""Parsing Slurm's output (recorded from Slurm 22.05 on this project's local clusters)."""

from datetime import UTC, datetime

from slurm.client import parse_sinfo_state
from slurm.fairshare import parse_sprio, parse_sshare
from slurm.queue import (
    SEP,
    exit_code_from_status,
    expand_task_string,
    gpus_from_tres,
    parse_squeue,
    parse_squeue_json,
    parse_time,
)


def line(*fields: str) -> str:
    return SEP.join(fields) + SEP


SQUEUE = "\n".join(
    [
        line(
            "1",
            "1",
            "N/A",
            "wrap",
            "root",
            "gpu",
            "FAILED",
            "NonZeroExitCode",
            "1",
            "sq-gpu-0",
            "1",
            "N/A",
            "UNLIMITED",
            "2026-11-30T19:11:25",
            "2026-11-30T19:11:28",
            "2026-11-30T19:11:28",
            "768",
            "0",
        ),
        line(
            "3_0",
            "3",
            "0",
            "sweep",
            "root",
            "gpu",
            "PENDING",
            "JobHeldUser",
            "1",
            "",
            "1",
            "N/A",
            "UNLIMITED",
            "2026-11-30T19:11:25",
            "N/A",
            "N/A",
            "0",
            "0",
        ),
        line(
            "4",
            "4",
            "N/A",
            "train",
            "root",
            "gpu",
            "RUNNING",
            "None",
            "2",
            "sq-gpu-[0-1]",
            "4",
            "gres:gpu:8",
            "1:00:00",
            "2026-11-30T19:11:25",
            "2026-11-30T19:11:26",
            "N/A",
            "0",
            "2",
        ),
        line(
            "5_[0-99]",
            "5",
            "N/A",
            "summary",
            "root",
            "gpu",
            "PENDING",
            "None",
            "1",
            "",
            "1",
            "",
            "",
            "",
            "",
            "",
            "0",
            "0",
        ),
        "garbage line without separators",
    ]
)


def test_parse_squeue_fields():
    failed, task, running = parse_squeue(SQUEUE)
    assert failed.job_id == "1" and failed.state == "FAILED" and failed.exit_code == "3:0"
    assert failed.end_time == datetime(2026, 11, 30, 19, 11, 28, tzinfo=UTC)
    assert task.job_id == "3_0" and task.job_number == 3 and task.array_task_id == 0
    assert task.reason == "JobHeldUser" and task.start_time is None
    assert running.nodes == 2 and running.node_list == "sq-gpu-[0-1]"
    assert running.gpus_per_node == 8 and running.reason == "" and running.restart_count == 2


def pending_line(job_id: str, state: str, start: str) -> str:
    fields = [job_id, job_id, "N/A", "wait", "root", "gpu", state, "Resources", "1", ""]
    fields += ["1", "N/A", "UNLIMITED", "2026-11-30T19:00:00", start, "N/A", "0", "0"]
    return line(*fields)


def test_expected_start_is_a_pending_jobs_start_time_within_300_days():
    now = datetime(2026, 11, 30, 19, 0, tzinfo=UTC)
    text = "\n".join(
        [
            pending_line("10", "PENDING", "2026-11-30T19:30:00"),  # backfill's plan
            pending_line("11", "PENDING", "2027-11-30T19:00:00"),  # a year: no plan
            pending_line("12", "PENDING", "N/A"),
            pending_line("13", "RUNNING", "2026-11-30T18:59:00"),  # started: not expected
            pending_line("14", "PENDING", "2027-09-26T19:00:00"),  # 300 days: still a plan
        ]
    )
    planned, year, unknown, running, edge = parse_squeue(text, now=now)
    assert planned.expected_start_time == datetime(2026, 11, 30, 19, 30, tzinfo=UTC)
    assert year.expected_start_time is None and year.start_time is not None
    assert unknown.expected_start_time is None
    assert running.expected_start_time is None and running.start_time is not None
    assert edge.expected_start_time == datetime(2027, 9, 26, 19, 0, tzinfo=UTC)
    soon, later = 1_796_083_200, 1_827_619_200  # 2026-12-01 and 2027-12-01, 00:00 UTC
    data = {
        "jobs": [
            {"job_id": 20, "job_state": "PENDING", "start_time": soon},
            {"job_id": 21, "job_state": "PENDING", "start_time": later},
        ]
    }
    json_soon, json_later = parse_squeue_json(data, now=now)
    assert json_soon.expected_start_time == datetime(2026, 12, 1, tzinfo=UTC)
    assert json_later.expected_start_time is None


def test_helpers():
    assert exit_code_from_status("0") == "0:0"
    assert exit_code_from_status("9") == "0:9"  # killed by SIGKILL
    assert exit_code_from_status("N/A") == ""
    assert gpus_from_tres("gres:gpu:h200:4") == 4
    assert gpus_from_tres("N/A") == 0
    assert parse_time("Unknown") is None and parse_time("N/A") is None
    assert expand_task_string("0-3") == [0, 1, 2, 3]
    assert expand_task_string("1,3,5-9:2%4") == [1, 3, 5, 7, 9]


def test_parse_squeue_json_expands_pending_arrays():
    data = {
        "jobs": [
            {
                "array_job_id": 1,
                "array_task_id": None,
                "array_task_string": "0-3",
                "job_id": 1,
                "job_state": "PENDING",
                "state_reason": "JobHeldUser",
                "name": "wrap",
                "user_name": "root",
                "partition": "gpu",
                "nodes": "",
                "cpus": 1,
                "node_count": 1,
                "restart_cnt": 0,
                "submit_time": 1796066183,
                "start_time": 0,
                "end_time": 0,
                "exit_code": 0,
                "time_limit": None,
                "tres_per_node": "",
            },
            {
                "array_job_id": 0,
                "array_task_id": None,
                "array_task_string": "",
                "job_id": 3,
                "job_state": "COMPLETED",
                "state_reason": "None",
                "name": "x",
                "user_name": "root",
                "partition": "gpu",
                "nodes": "sq-gpu-1",
                "cpus": 2,
                "node_count": 1,
                "restart_cnt": 1,
                "submit_time": 1796066183,
                "start_time": 1796066184,
                "end_time": 1796066185,
                "exit_code": 256,
                "time_limit": 60,
                "tres_per_node": "gres:gpu:8",
            },
        ]
    }
    jobs = parse_squeue_json(data)
    assert [j.job_id for j in jobs] == ["1_0", "1_1", "1_2", "1_3", "3"]
    done = jobs[-1]
    assert done.exit_code == "1:0" and done.gpus_per_node == 8 and done.restart_count == 1
    assert done.start_time == datetime.fromtimestamp(1796066184, tz=UTC)
    assert jobs[0].reason == "JobHeldUser" and done.reason == ""


def test_parse_sinfo_states():
    assert parse_sinfo_state("n", "idle", "2", "gpu:h200:8", "none").display_state == "idle"
    drained = parse_sinfo_state("n", "drained", "2", "(null)", "maintenance")
    assert drained.state == "IDLE" and "DRAIN" in drained.flags
    assert drained.display_state == "drained" and drained.reason == "maintenance"
    down = parse_sinfo_state("n", "down*", "2", "", "Not responding")
    assert down.state == "DOWN" and down.display_state == "down*"
    assert parse_sinfo_state("n", "draining", "2", "", "x").display_state == "draining"


def test_output_chunks_never_split_a_character():
    from jobs.selectors import _whole_characters

    text = "loss ↓ 3.2".encode()
    cut = text[: text.index("↓".encode()) + 1]  # one byte of a three-byte character
    assert _whole_characters(cut, at_end=False) == b"loss "
    assert _whole_characters(text, at_end=False) == text
    assert _whole_characters(cut, at_end=True) == cut


def test_ids_and_names_are_matched_whole():
    """A trailing newline slips past ``^...$`` with re.match; every check matches whole."""
    import pytest

    from slurm import SlurmError
    from slurm.client import SlurmClient
    from slurm.submit import SubmissionError, validate_submission

    body = {"name": "x", "script": "#!/bin/bash\n", "partition": "gpu\n", "time_limit": "1:00\n"}
    with pytest.raises(SubmissionError) as exc:
        validate_submission(body, partitions=["gpu", "gpu\n"], max_nodes=1, max_gpus_per_node=8)
    assert {"partition", "time_limit"} <= set(exc.value.fields)
    client = SlurmClient.__new__(SlurmClient)  # validation comes before any command
    with pytest.raises(SlurmError, match="invalid node name"):
        client.node_update(["node-1\n"], state="DOWN")


# `sacct --parsable2 --noheader --noconvert --allusers --format=<slurm.accounting>` on a
# local cluster: a finished job with its steps, a failed one, an array's tasks.
SACCT = """\
3|COMPLETED|0:0|2026-12-04T16:29:20|2026-12-04T16:29:22|2026-12-04T16:29:25|3|00:00.197||billing=1,cpu=4,gres/gpu=8,mem=4000M,node=1|llm
3.batch|COMPLETED|0:0|2026-12-04T16:29:22|2026-12-04T16:29:22|2026-12-04T16:29:25|3|00:00.197|95391744|cpu=1,mem=0,node=1|llm
3.0|COMPLETED|0:0|2026-12-04T16:29:22|2026-12-04T16:29:22|2026-12-04T16:29:25|3|01:02.5|120000K|cpu=1,mem=0,node=1|llm
4|FAILED|3:0|2026-12-04T16:29:12|2026-12-04T16:29:12|2026-12-04T16:29:12|0|00:00.001||billing=1,cpu=1,node=1|
5_1|CANCELLED by 0|0:15|2026-12-04T16:30:00|None|2026-12-04T16:31:00|0|||billing=1,cpu=1,node=1|
5_[2-9]|PENDING|0:0|2026-12-04T16:30:00|Unknown|Unknown|0|||billing=1,cpu=1,node=1|
"""


def test_sacct_records_fold_steps_into_their_job():
    from slurm.accounting import parse_duration, parse_sacct, parse_size

    jobs = parse_sacct(SACCT)
    assert sorted(jobs) == ["3", "4", "5_1"]
    done = jobs["3"]
    assert (done.state, done.exit_code, done.elapsed_s, done.gpus) == ("COMPLETED", "0:0", 3, 8)
    assert done.max_rss_bytes == 120000 * 1024  # the largest step's
    assert done.cpu_time_s == 0.197  # the allocation's TotalCPU sums its steps
    assert done.start_time == parse_time("2026-12-04T16:29:22")
    # AllocTRES's cpu= and mem=, and the account: what efficiency and usage need.
    assert (done.cpus, done.mem_bytes, done.account) == (4, 4000 * 2**20, "llm")
    assert (jobs["4"].cpus, jobs["4"].mem_bytes, jobs["4"].account) == (1, None, "")
    assert (jobs["4"].state, jobs["4"].exit_code, jobs["4"].max_rss_bytes) == (
        "FAILED",
        "3:0",
        None,
    )
    assert jobs["5_1"].state == "CANCELLED" and jobs["5_1"].start_time is None
    assert parse_duration("1-02:03:04") == 93784 and parse_duration("02:03.5") == 123.5
    assert parse_size("4.5G") == int(4.5 * 2**30) and parse_size("") is None


def test_sacct_failures_say_whether_accounting_exists():
    from slurm import SlurmError
    from slurm.accounting import unavailable

    off = unavailable(SlurmError("Slurm accounting storage is disabled", permanent=True))
    assert not off.configured
    down = unavailable(
        SlurmError(
            "slurm_persist_conn_open_without_init: failed to open persistent connection\n"
            "sacct: error: Problem talking to the database: Connection refused",
            permanent=False,
        )
    )
    assert down.configured and str(down) == "Problem talking to the database: Connection refused"


def test_sshare_and_sprio_rows():
    """`sshare --parsable2 --all` (an account's own row has no user; LevelFS is inf
    while unused, empty before the priority thread's first round) and `sprio`."""
    rows = parse_sshare(
        "root|||0.000000|67||1.000000|\n"
        "root|root|1|0.200000|0|0.000000|inf|1.000000\n"
        "a||3|0.600000|45|0.671642|0.893333|\n"
        "a|root|1|1.000000|45|1.000000|1.000000|0.666667\n"
        "b||1|0.200000|22|0.328358||\n"
    )
    root_user, a, a_user, b = rows[1:]
    assert root_user.level_fs == float("inf") and root_user.user == "root"
    assert (a.account, a.user, a.raw_shares, a.raw_usage) == ("a", "", "3", 45)
    assert a.norm_shares == 0.6 and a.level_fs == 0.893333
    assert a_user.fairshare == 0.666667
    assert b.level_fs == 0.0  # not computed yet
    jobs = parse_sprio("  7|root|6667|0.6666667\n 5|root|3333|0.3333333\n 6|root|6667|0.6666667\n")
    assert [(j.job_id, j.priority) for j in jobs] == [("6", 6667), ("7", 6667), ("5", 3333)]
    assert jobs[-1].fairshare == 0.3333333
