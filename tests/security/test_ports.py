"""The ports mtc's proxies call on this host, which users' processes open: another
user's job is refused by a TensorBoard's port (it has no sign-in), and a job that takes
a dead replica's port gets neither the endpoint's token nor its traffic (mtc checks the
answering socket's account before it sends anything). Real accounts, real processes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from clusters.models import Cluster
from identity.runas import popen_as, run_as
from identity.services import account_ensure
from mtc import firewall
from mtc.devstack import free_port
from recipes import tensorboard

from ..conftest import make_spec
from ..test_tensorboard import ISO_ID, ISO_PREFIX, isolated, run_names, wait_for_runs
from ..waiting import wait_until

__all__ = ["isolated"]  # a fixture these tests use
pytestmark = [pytest.mark.security, pytest.mark.django_db]

CONNECT = (
    "import socket, sys; s = socket.socket(); s.settimeout(5); "
    "rc = s.connect_ex(('127.0.0.1', int(sys.argv[1]))); print('refused' if rc else 'connected')"
)


def connect_as(account, port: int) -> str:
    done = run_as(
        account, ["/usr/bin/python3", "-c", CONNECT, str(port)], capture_output=True, text=True
    )
    return done.stdout.strip()


def test_another_users_job_is_refused_by_a_tensorboard_port(isolated):
    if why := firewall.firewall_problem():  # the host gives no nft: make test says so
        pytest.skip(f"no firewall on this host: {why}")
    ada, bob = isolated["ada"], isolated["bob"]
    assert ada["client"].post(f"/clusters/{ISO_ID}/jobs/21/tensorboard/").status_code == 302
    ada_run = tensorboard.run_name(ada["job"])
    assert run_names(wait_for_runs(ada["client"], {ada_run}, prefix=ISO_PREFIX)) == {ada_run}
    board = tensorboard.tensorboard_get(ISO_ID, viewer=ada["user"])
    table = firewall.table_for(settings.DATA_DIR)
    assert board.port in firewall.firewall_ports(table)
    assert connect_as(bob["account"], board.port) == "refused"
    tensorboard.tensorboard_stop(ISO_ID)  # the port is anyone's again once it is gone
    assert board.port not in firewall.firewall_ports(table)


IMPOSTOR = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(3)
    try:
        data = c.recv(65536)
    except OSError:
        data = b""
    with open(sys.argv[2], "ab") as fh:
        fh.write(b"<" + data + b">")
    c.close()
"""


def test_a_job_on_a_dead_replicas_port_gets_neither_the_token_nor_the_traffic(
    local_identity, user, django_user_model, tmp_path
):
    from registry.models import Model, ModelVersion, VersionState
    from serving import routing
    from serving.models import Endpoint, Replica
    from serving.reconcile import replica_health

    owner = account_ensure(user=user)
    other_user = django_user_model.objects.create_user("mallory", password="pw-mal-123")
    mallory = account_ensure(user=other_user)
    cluster = Cluster.objects.create(cluster_id="rp", spec=make_spec("rp"), state="RUNNING")
    model = Model.objects.create(name="tiny")
    version = ModelVersion.objects.create(model=model, number=1, state=VersionState.READY)
    endpoint = Endpoint.objects.create(
        name="ep", owner=user, version=version, cluster=cluster, state="READY",
        replica_token="the-endpoints-token",
    )  # fmt: skip
    port = free_port()
    replica = Replica.objects.create(
        endpoint=endpoint, number=1, state="READY", host="127.0.0.1", port=port,
        run_dir="/none", create_time=timezone.now(),
    )  # fmt: skip
    seen = Path("/tmp") / f"mtc-impostor-{port}"  # the impostor's own file
    seen.unlink(missing_ok=True)
    impostor = popen_as(
        mallory,
        ["/usr/bin/python3", "-c", IMPOSTOR, str(port), str(seen)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert impostor.stdout.readline().strip() == "listening"
        replica.endpoint = endpoint
        healthy, why, _ = replica_health(endpoint, replica)
        assert not healthy and f"not {owner.uid}" in why, why
        with pytest.raises(routing.RouteError):
            routing.completion_route(endpoint=endpoint, body={"prompt": "hi"}, chat=False)
        # Two connections (the health check, the request), each closed unused.
        got = wait_until(
            lambda: seen.exists() and seen.read_bytes().count(b">") >= 2 and seen.read_bytes(),
            what="the impostor to have seen mtc's two connections",
        )
        assert b"the-endpoints-token" not in got and b"POST" not in got and b"GET" not in got
        assert got.count(b"<>") == len(got) // 2, got  # connections, never a byte sent
    finally:
        impostor.kill()
        impostor.wait()
        seen.unlink(missing_ok=True)
