"""gce nodes: the cluster's users' accounts in the boot data, the metadata server out
of reach of everyone but root (the startup script's first step), the munge key
readable by munge alone, a dedicated service account with minimal scopes, and
readiness confirmed by the controller. The plan is pure; the account part of the
startup script also runs here for real (useradd, as root)."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command

from clusters.providers.gce import access, plan
from clusters.providers.gce.provider import target_for
from clusters.reference_architectures import architecture_get
from identity.sources.base import AccountData

from .gce_fake import FakeCompute  # noqa: F401  (the provider fixture lives in test_gce_provider)
from .test_gce_provider import CID, a3u_spec, compute, operation  # noqa: F401
from .unix import spare_uids

ACCOUNTS = [
    AccountData(name="bob", uid=20002, gid=20002, home="/home/bob"),
    AccountData(name="alice", uid=20001, gid=20001, home="/home/alice"),
]
TARGET = plan.Target(project="my-project", zone="us-central1-a", image="img")
LOGGING, MONITORING = access.BASE_SCOPES
STORAGE = access.STORAGE_SCOPE


def _spec() -> dict:
    return copy.deepcopy(architecture_get("a3-ultra-pretraining").build_spec())


def _templates(requests) -> dict[str, dict]:
    """Each template by ``<cluster>-<pool>`` (its name without the content version)."""
    return {
        r.name.rsplit("-", 1)[0]: r.body["properties"]
        for r in requests
        if r.resource == "instanceTemplates"
    }


def _metadata(properties: dict) -> dict[str, str]:
    return {i["key"]: i["value"] for i in properties["metadata"]["items"]}


def _scripts(spec: dict) -> dict[str, str]:
    return {
        name: _metadata(props)["startup-script"]
        for name, props in _templates(plan.cluster_plan(spec, TARGET, accounts=ACCOUNTS)).items()
    }


def test_every_template_carries_the_accounts_sorted_by_uid():
    templates = _templates(plan.cluster_plan(_spec(), TARGET, accounts=ACCOUNTS))
    assert sorted(templates) == [f"{CID}-a3u", f"{CID}-login"]  # workers and the controller
    for props in templates.values():
        rendered = json.loads(_metadata(props)[access.ACCOUNTS_KEY])
        assert rendered == [
            {"name": "alice", "uid": 20001, "gid": 20001, "home": "/home/alice"},
            {"name": "bob", "uid": 20002, "gid": 20002, "home": "/home/bob"},
        ]


@pytest.mark.parametrize(
    "bad",
    [
        AccountData(name="root", uid=0, gid=0, home="/root"),
        AccountData(name="x;rm -rf /", uid=20003, gid=20003, home="/home/x"),
        AccountData(name="eve", uid=20004, gid=20004, home="/home/../etc"),
        AccountData(name="mal", uid=20005, gid=20005, home="/home/mal\n"),
    ],
)
def test_an_account_a_node_must_not_create_is_refused_at_render(bad):
    with pytest.raises(access.BadAccount):
        plan.cluster_plan(_spec(), TARGET, accounts=[*ACCOUNTS, bad])


def test_two_accounts_with_one_uid_are_refused():
    clash = AccountData(name="carol", uid=20001, gid=20001, home="/home/carol")
    with pytest.raises(access.BadAccount, match="share"):
        access.accounts_json([*ACCOUNTS, clash])


def test_a_home_on_mtcs_host_becomes_home_on_the_nodes(tmp_path):
    data = str(tmp_path)
    assert access.node_home(f"{data}/home/alice", "alice", data) == "/home/alice"
    assert access.node_home("/u/alice", "alice", data) == "/u/alice"  # a directory's own
    assert access.node_home(f"{data}x/alice", "alice", data) == f"{data}x/alice"


def _first(script: str, pattern: str) -> int:
    match = re.search(pattern, script, re.M)
    assert match, pattern
    return match.start()


def test_the_metadata_block_comes_before_anything_reaches_the_metadata_server():
    for name, script in _scripts(_spec()).items():
        block = _first(script, r"^/usr/local/sbin/mtc-metadata-block$")  # the rule is run
        # Nothing talks to the metadata server (curl, meta, report) before the block runs.
        assert block < _first(script, r"curl ")
        assert block < _first(script, r"^report state configuring")
        assert block < _first(script, r"^meta mtc-munge-key")
        # Only the "set -euo pipefail; umask" preamble and the block's own text precede it.
        before = [
            line
            for line in script[:block].splitlines()
            if line.strip() and not line.startswith("#")
        ]
        assert before[:2] == ["set -euo pipefail", "umask 022"], name
        rule = re.search(r"rule=\(OUTPUT -d \"\$addr/32\" (.*)\)", script)[1]
        assert (
            rule == "-p tcp --dport 80 -m owner ! --uid-owner 0 -j REJECT --reject-with tcp-reset"
        )
        assert "printf '%s\\n' 169.254.169.254" in script
        assert "getent ahostsv4 metadata.google.internal" in script
        assert "ExecStart=/usr/local/sbin/mtc-metadata-block" in script  # every later boot


def test_the_munge_key_is_only_ever_in_a_root_or_munge_only_file():
    for script in _scripts(_spec()).values():
        lines = [
            line
            for line in script.splitlines()
            if ("munge-key" in line or "munge.key" in line or '"$key"' in line)
            and not line.lstrip().startswith("#")
        ]
        assert lines == [
            "key=$(mktemp /etc/munge/.munge.key.XXXXXX)",
            'meta mtc-munge-key | base64 -d >"$key"',
            'chown munge:munge "$key"',
            'chmod 0400 "$key"',
            'mv -f "$key" /etc/munge/munge.key',
        ]
        assert "munge.key" not in script.replace("/etc/munge/munge.key", "").replace(
            "/etc/munge/.munge.key.XXXXXX", ""
        )


def test_accounts_exist_before_slurm_starts_and_slurmd_is_not_enabled():
    scripts = _scripts(_spec())
    worker, controller = scripts[f"{CID}-a3u"], scripts[f"{CID}-login"]
    for script, daemon in (
        (worker, "systemctl restart slurmd"),
        (controller, "install -d -o slurm -g slurm /var/spool/slurmctld"),
    ):
        made = _first(script, r'ensure_account "\$name"')
        assert made > _first(script, r"^/usr/local/sbin/mtc-metadata-block$")
        assert made < _first(script, re.escape(daemon))
    assert "systemctl enable slurmd" not in worker and "systemctl disable slurmd" in worker


def test_the_rendered_scripts_are_valid_bash():
    for name, script in _scripts(_spec()).items():
        proc = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert proc.returncode == 0, (name, proc.stderr)


def _parser(script: str) -> str:
    """The node's own account check: the python3 -c program in the rendered script."""
    line = re.search(
        r"^accounts=\$\(meta mtc-accounts \| python3 -c ('.*?')\)$", script, re.M | re.S
    )
    return shlex.split(line[1])[0]


def test_the_node_checks_the_accounts_again_before_useradd():
    script = _scripts(_spec())[f"{CID}-a3u"]
    code = _parser(script)
    good = access.accounts_json(ACCOUNTS)
    out = subprocess.run(["python3", "-c", code], input=good, text=True, capture_output=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["alice:20001:20001:/home/alice", "bob:20002:20002:/home/bob"]
    for bad in (
        {"name": "root", "uid": 0, "gid": 0, "home": "/root"},
        {"name": "a:b", "uid": 20003, "gid": 20003, "home": "/home/a"},
        {"name": "c", "uid": "20004", "gid": 20004, "home": "/home/c"},
        {"name": "d", "uid": 20005, "gid": 20005, "home": "/home/d:/bin/sh"},
        {"name": "e\n", "uid": 20006, "gid": 20006, "home": "/home/e"},
    ):
        data = json.dumps([bad])
        out = subprocess.run(["python3", "-c", code], input=data, text=True, capture_output=True)
        assert out.returncode != 0 and "refusing account" in out.stderr, bad


def _account_section(script: str) -> str:
    start = script.index("ensure_account() {")
    end = script.index('done <<<"$accounts"') + len('done <<<"$accounts"')
    return script[start:end]


@pytest.mark.skipif(os.geteuid() != 0, reason="useradd needs root")
def test_the_account_part_of_the_startup_script_makes_the_accounts_idempotently(tmp_path):
    """The rendered section, run for real: fixed uids and gids, a 0700 home, a second
    boot changes nothing, and an existing name with another uid fails the boot."""
    base = spare_uids(2)
    prefix = f"mtcg{base}"
    accounts = [
        AccountData(name=f"{prefix}a", uid=base, gid=base, home=str(tmp_path / "a")),
        AccountData(name=f"{prefix}b", uid=base + 1, gid=base + 1, home=str(tmp_path / "b")),
    ]
    metadata = tmp_path / "accounts.json"
    metadata.write_text(access.accounts_json(accounts))
    section = _account_section(_scripts(_spec())[f"{CID}-a3u"])
    program = f"set -euo pipefail\nmeta() {{ cat {shlex.quote(str(metadata))}; }}\n{section}\n"

    def boot() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", program], text=True, capture_output=True)

    try:
        for _ in range(2):  # every boot runs it again
            proc = boot()
            assert proc.returncode == 0, proc.stderr
            for a in accounts:
                ids = subprocess.run(["id", a.name], text=True, capture_output=True).stdout
                assert ids.startswith(f"uid={a.uid}({a.name}) gid={a.gid}({a.name})")
                home = Path(a.home).stat()
                assert (home.st_uid, home.st_gid, home.st_mode & 0o777) == (a.uid, a.gid, 0o700)
        metadata.write_text(
            access.accounts_json(
                [AccountData(name=f"{prefix}a", uid=base + 2, gid=base, home=accounts[0].home)]
            )
        )
        proc = boot()
        assert proc.returncode != 0
        assert f"account {prefix}a is {base}:{base} here, not {base + 2}:{base}" in proc.stderr
    finally:
        for a in accounts:
            subprocess.run(["userdel", a.name], capture_output=True)
            subprocess.run(["groupdel", a.name], capture_output=True)


def test_nodes_run_as_the_dedicated_account_with_minimal_scopes(settings):
    settings.MTC_GCE_SERVICE_ACCOUNT = "mtc-nodes@{project}.iam.gserviceaccount.com"
    spec = _spec()
    target = target_for(spec, "my-project")
    requests = plan.cluster_plan(spec, target, accounts=ACCOUNTS)
    for props in _templates(requests).values():
        # a3u mounts a GCS bucket with gcsfuse: storage is the one scope it adds.
        assert props["serviceAccounts"] == [
            {
                "email": "mtc-nodes@my-project.iam.gserviceaccount.com",
                "scopes": [LOGGING, MONITORING, STORAGE],
            }
        ]
    assert "cloud-platform" not in json.dumps([r.body for r in requests])
    spec["storage"].pop("gcs_fuse")
    for props in _templates(plan.cluster_plan(spec, target)).values():
        assert props["serviceAccounts"][0]["scopes"] == [LOGGING, MONITORING]
    settings.MTC_GCE_SERVICE_ACCOUNT = "nodes@shared.iam.gserviceaccount.com"
    target = target_for(spec, "my-project")
    props = next(iter(_templates(plan.cluster_plan(spec, target)).values()))
    assert props["serviceAccounts"][0]["email"] == "nodes@shared.iam.gserviceaccount.com"


@pytest.mark.django_db
def test_cli_plan_shows_accounts_service_account_scopes_and_the_block(
    tmp_path, capsys, settings, monkeypatch
):
    settings.MTC_GCE_PROJECT = "my-project"
    monkeypatch.setattr(access, "node_accounts", lambda: list(ACCOUNTS))
    spec_file = tmp_path / "a3u.json"
    spec_file.write_text(json.dumps(_spec()))
    call_command("mtc", "cluster", "plan", "-f", str(spec_file), "--json")
    described = json.loads(capsys.readouterr().out)
    node_access = described["node_access"]
    assert node_access["service_account"] == "mtc-nodes@my-project.iam.gserviceaccount.com"
    assert node_access["scopes"] == [LOGGING, MONITORING, STORAGE]
    assert [a["name"] for a in node_access["accounts"]] == ["bob", "alice"]
    assert "only root reaches 169.254.169.254" in node_access["metadata_server"]

    call_command("mtc", "cluster", "plan", "-f", str(spec_file))
    text = capsys.readouterr().out
    assert "# nodes run as mtc-nodes@my-project.iam.gserviceaccount.com, scopes" in text
    assert "#   alice 20001:20001 /home/alice" in text
    assert "--- metadata mtc-accounts:" in text and '"name": "bob", "uid": 20002' in text
    assert text.index("--- metadata startup-script:") < text.index("--- end startup-script")
    assert "/usr/local/sbin/mtc-metadata-block" in text


@pytest.mark.django_db
def test_node_accounts_come_from_the_database(django_user_model, settings):
    from django.apps import apps

    if not apps.is_installed("identity"):
        assert access.node_accounts() == []
        return
    from identity.models import PosixAccount

    data = str(settings.DATA_DIR)
    for i, (name, home) in enumerate((("ann", f"{data}/home/ann"), ("ben", "/u/ben"))):
        user = django_user_model.objects.create_user(f"gce-{name}")
        PosixAccount.objects.update_or_create(
            user=user,
            defaults=dict(name=name, uid=21000 + i, gid=21000 + i, home=home, source="local"),
        )
    mine = [a for a in access.node_accounts() if a.name in ("ann", "ben")]
    assert mine == [
        AccountData(name="ann", uid=21000, gid=21000, home="/home/ann"),
        AccountData(name="ben", uid=21001, gid=21001, home="/u/ben"),
    ]


def test_create_sends_the_accounts_and_the_node_service_account(compute, operator_api, monkeypatch):  # noqa: F811
    monkeypatch.setattr(access, "node_accounts", lambda: list(ACCOUNTS))
    op = operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(2), format="json"))
    assert op["state"] == "SUCCEEDED", op
    for template in (r.body for r in compute.requests if r.call == "POST instanceTemplates"):
        props = template["properties"]
        names = [a["name"] for a in json.loads(_metadata(props)[access.ACCOUNTS_KEY])]
        assert names == ["alice", "bob"]
        assert props["serviceAccounts"][0]["email"] == "mtc-nodes@mtc-test.iam.gserviceaccount.com"


def test_a_node_is_ready_only_when_the_controller_says_so(compute, operator_api):  # noqa: F811
    # Its guest attributes say ready (anything root on the node could write), but
    # slurmctld never heard from it: the create waits and names it.
    compute.slurm.unregistered.add(f"{CID}-a3u-1")
    op = operation(operator_api, operator_api.post("/api/v1/clusters", a3u_spec(2), format="json"))
    assert op["state"] == "FAILED" and op["error"]["code"] == "TIMEOUT"
    assert (
        f"{CID}-a3u-1" in op["error"]["message"] and f"{CID}-a3u-0," not in op["error"]["message"]
    )
