"""The cluster pages: rendering, access rules, forms and their errors, query counts.

Rows are made directly through the models (no Slurm) except in tests marked
``slurm``, which create a real local cluster and delete it again."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from clusters import services
from clusters.create_views import wizard_step_for_path
from clusters.models import Cluster, Node, NodePool, Operation
from clusters.reference_architectures import architecture_get, architecture_list
from clusters.spec import validate_cluster_spec
from mtc.templatetags.mtc_ui import node_group

pytestmark = pytest.mark.django_db

NODE_STATES = ["IDLE", "ALLOCATED", "MIXED", "DRAINING", "DRAINED", "DOWN*", "UNKNOWN"]


# --- fixtures and helpers ------------------------------------------------------
@pytest.fixture
def staff_user(django_user_model):
    return django_user_model.objects.create_user("operator", password="pw-operator", is_staff=True)


@pytest.fixture
def plain_user(django_user_model):
    return django_user_model.objects.create_user("alice", password="pw-alice")


@pytest.fixture
def staff_client(client, staff_user):
    client.force_login(staff_user)
    return client


@pytest.fixture
def plain_client(plain_user):
    other = Client()
    other.force_login(plain_user)
    return other


def make_cluster(
    cluster_id: str,
    *,
    nodes: int = 2,
    state: str = "RUNNING",
    display_name: str = "",
    state_message: str = "",
    operations: int = 0,
) -> Cluster:
    """A cluster's rows as a finished create leaves them, without any daemon."""
    spec = architecture_get("local-dev").build_spec(cluster_id)
    spec["node_pools"][1]["scaling_spec"] = {"min_node_count": nodes, "max_node_count": nodes}
    if display_name:
        spec["display_name"] = display_name
    spec = validate_cluster_spec(spec)
    cluster = Cluster.objects.create(
        cluster_id=cluster_id,
        display_name=spec["display_name"],
        provider="local",
        spec=spec,
        labels=spec["labels"],
        state=state,
        state_message=state_message,
    )
    NodePool.objects.create(
        cluster=cluster,
        pool_id="login",
        machine_type="local-2",
        is_login=True,
        target_node_count=1,
    )
    gpu = NodePool.objects.create(
        cluster=cluster,
        pool_id="gpu",
        machine_type="local-2",
        accelerator_type="NVIDIA_H200_141GB",
        accelerator_count=8,
        partitions=["gpu"],
        target_node_count=nodes,
    )
    Node.objects.bulk_create(
        Node(
            cluster=cluster,
            pool=gpu,
            index=i,
            name=f"{cluster_id}-gpu-{i}",
            partition="gpu",
            slurm_state=NODE_STATES[i % len(NODE_STATES)],
            gpus=8,
            gpu_type="h200",
            gpus_emulated=True,
            lifecycle="ACTIVE",
        )
        for i in range(nodes)
    )
    Operation.objects.bulk_create(
        Operation(
            kind="CREATE_CLUSTER",
            target=f"clusters/{cluster_id}",
            cluster=cluster,
            state="SUCCEEDED",
            progress=100,
            status_message="Done",
        )
        for _ in range(operations)
    )
    return cluster


def local_spec(cluster_id: str, nodes: int = 2) -> dict:
    spec = architecture_get("local-dev").build_spec(cluster_id)
    spec["node_pools"][1]["scaling_spec"] = {"min_node_count": nodes, "max_node_count": nodes}
    return spec


def html(response) -> str:
    return response.content.decode()


CREATE_URLS = [
    "/clusters/create/",
    "/clusters/create/wizard/basics/",
    "/clusters/create/reference/",
    "/clusters/create/reference/local-dev/",
    "/clusters/create/json/",
]


# --- rendering -----------------------------------------------------------------
def test_every_page_renders_for_staff(staff_client):
    make_cluster("alpha", nodes=3)
    pages = {
        "/": "Dashboard",
        "/clusters/": "Clusters",
        "/clusters/alpha/": "How to log in",
        "/clusters/alpha/fragment/": "Operations",
        "/clusters/alpha/delete/": "Type the cluster id to confirm",
        "/clusters/create/": "Step-by-step wizard",
        "/clusters/create/wizard/basics/": "Cluster id",
        "/clusters/create/reference/": "Local development cluster",
        "/clusters/create/reference/a3-ultra-pretraining/": "a3-ultragpu-8g",
        "/clusters/create/json/": "Spec JSON",
    }
    for url, text in pages.items():
        response = staff_client.get(url)
        assert response.status_code == 200, url
        assert text in html(response), url
    assert staff_client.get("/clusters/create/wizard/").status_code == 302


def test_nav_bar_shows_operator_links(staff_client, plain_client):
    page = html(staff_client.get("/"))
    for text in (
        "mtc",
        "Dashboard",
        "Clusters",
        "Create cluster",
        "API docs",
        "/api/docs/",
        "Admin",
        "operator",
        "Log out",
        'action="/accounts/logout/"',
    ):
        assert text in page
    page = html(plain_client.get("/"))
    assert "alice" in page and "Log out" in page
    assert "Create cluster" not in page and ">Admin<" not in page


def test_login_page_and_logout(client, staff_user):
    response = client.get("/accounts/login/")
    assert response.status_code == 200 and "Sign in" in html(response)
    response = client.post("/accounts/login/", {"username": "operator", "password": "wrong"})
    assert response.status_code == 200 and "alert" in html(response)
    response = client.post("/accounts/login/", {"username": "operator", "password": "pw-operator"})
    assert response.status_code == 302 and response.url == "/"
    assert client.get("/").status_code == 200
    response = client.post("/accounts/logout/")
    assert response.status_code == 302 and response.url == "/accounts/login/"
    assert client.get("/").status_code == 302


@pytest.mark.parametrize(
    "url",
    [
        "/",
        "/clusters/",
        "/clusters/alpha/",
        "/clusters/alpha/fragment/",
        "/clusters/alpha/delete/",
        *CREATE_URLS,
    ],
)
def test_anonymous_is_sent_to_login(client, url):
    make_cluster("alpha")
    response = client.get(url)
    assert response.status_code == 302
    assert response.url.startswith("/accounts/login/?next=")


@pytest.mark.parametrize("url", [*CREATE_URLS, "/clusters/alpha/delete/"])
def test_non_staff_gets_403_on_create_and_delete(plain_client, url):
    make_cluster("alpha")
    response = plain_client.get(url)
    assert response.status_code == 403
    assert "Not allowed" in html(response)


def test_non_staff_cannot_post_create_or_delete(plain_client):
    make_cluster("alpha")
    response = plain_client.post("/clusters/alpha/delete/", {"confirm": "alpha"})
    assert response.status_code == 403
    response = plain_client.post(
        "/clusters/create/json/", {"spec_text": json.dumps(local_spec("beta"))}
    )
    assert response.status_code == 403
    assert set(Cluster.objects.values_list("cluster_id", flat=True)) == {"alpha"}
    assert Cluster.objects.get().state == "RUNNING"


def test_non_staff_reads_pages_without_write_buttons(plain_client):
    make_cluster("alpha")
    for url in ("/", "/clusters/", "/clusters/alpha/"):
        assert plain_client.get(url).status_code == 200
    assert "Delete cluster" not in html(plain_client.get("/clusters/alpha/"))


@pytest.mark.parametrize(
    "url",
    [
        "/clusters/nope/",
        "/clusters/nope/fragment/",
        "/clusters/nope/delete/",
        "/clusters/create/reference/nope/",
        "/clusters/create/wizard/nope/",
    ],
)
def test_unknown_things_are_404_pages(staff_client, url):
    response = staff_client.get(url)
    assert response.status_code == 404
    assert "Not found" in html(response) and "Traceback" not in html(response)


def test_dashboard_shows_clusters_states_and_node_grid(staff_client):
    make_cluster("alpha", nodes=7)
    make_cluster("beta", nodes=2, state="ERROR", state_message="slurmctld did not start")
    page = html(staff_client.get("/"))
    assert 'data-cluster="alpha"' in page and 'data-cluster="beta"' in page
    assert page.count('class="mini-node ') == 9
    for tone in ("idle", "busy", "drain", "down", "unknown"):
        assert f"mini-node tone-{tone}" in page
    assert "slurmctld did not start" in page
    assert "ERROR" in page and "RUNNING" in page


def test_cluster_list_is_paginated(staff_client):
    for i in range(55):
        Cluster.objects.create(cluster_id=f"c{i:03d}", spec={}, state="RUNNING")
    page1 = html(staff_client.get("/clusters/"))
    assert "c000" in page1 and "c049" in page1 and "c050" not in page1
    assert "Page 1 of 2" in page1
    page2 = html(staff_client.get("/clusters/?page=2"))
    assert "c050" in page2 and "c054" in page2 and "c049" not in page2
    filtered = html(staff_client.get("/clusters/?q=c05"))
    assert "c050" in filtered and "c001" not in filtered


def test_cluster_list_columns(staff_client):
    make_cluster("alpha", nodes=7, display_name="Alpha training")
    page = html(staff_client.get("/clusters/"))
    # IDLE, ALLOCATED, MIXED of 7 nodes are ready; 7 nodes x 8 GPUs.
    for text in ("alpha", "Alpha training", "local", "RUNNING", "3 / 7", ">56<"):
        assert text in page


def test_cluster_detail_shows_pools_partitions_nodes_and_login(staff_client, settings):
    cluster = make_cluster("alpha", nodes=7, operations=1)
    Operation.objects.create(
        kind="UPDATE_CLUSTER",
        target="clusters/alpha",
        cluster=cluster,
        state="FAILED",
        progress=40,
        status_message="Starting daemons",
        error_code="SLURM_ERROR",
        error_message="slurmd exited",
    )
    page = html(staff_client.get("/clusters/alpha/"))
    assert 'data-testid="cluster-state">RUNNING<' in page
    # One tile per node, coloured by Slurm state, with its GPUs marked emulated.
    assert page.count('class="node-tile ') == 7
    assert 'class="node-tile tone-idle" data-node="alpha-gpu-0" data-state="IDLE"' in page
    assert 'tone-busy" data-node="alpha-gpu-1"' in page
    assert 'tone-drain" data-node="alpha-gpu-3"' in page
    assert 'tone-down" data-node="alpha-gpu-5"' in page
    assert 'tone-unknown" data-node="alpha-gpu-6"' in page
    assert page.count("tag-emulated") >= 7 and "8 × H200" in page
    # Pools (login pool marked) and partitions.
    assert "NVIDIA_H200_141GB × 8" in page and ">login</span>" in page
    assert '<code>gpu</code> <span class="tag">default</span>' in page
    # Operations with progress and errors.
    assert "SLURM_ERROR" in page and "slurmd exited" in page and 'aria-valuenow="40"' in page
    # How to log in: the provider's exact line and the CLI.
    conf = settings.DATA_DIR / "clusters" / "alpha" / "etc" / "slurm.conf"
    assert f"SLURM_CONF={conf} sinfo" in page
    assert "python manage.py mtc login alpha" in page
    # Labels and the spec.
    assert 'label-key">env<' in page
    assert "&quot;cluster_id&quot;: &quot;alpha&quot;" in page


def test_detail_of_gce_cluster_explains_missing_project(staff_client, settings):
    settings.MTC_GCE_PROJECT = ""
    cluster = make_cluster("gcp", state="ERROR", state_message="The gce provider needs a project")
    Cluster.objects.filter(pk=cluster.pk).update(provider="gce")
    page = html(staff_client.get("/clusters/gcp/"))
    assert "set MTC_GCE_PROJECT" in page
    assert "python manage.py mtc login gcp" in page


def test_detail_refreshes_itself_only_while_an_operation_is_active(staff_client):
    cluster = make_cluster("alpha")
    page = html(staff_client.get("/clusters/alpha/"))
    assert 'data-live-active="0"' in page and "/clusters/alpha/fragment/" in page
    assert 'src="/static/mtc.js"' in page
    Operation.objects.create(
        kind="UPDATE_CLUSTER",
        target="clusters/alpha",
        cluster=cluster,
        state="RUNNING",
        progress=70,
        status_message="Waiting for nodes to register with Slurm",
    )
    fragment = html(staff_client.get("/clusters/alpha/fragment/"))
    assert 'data-live-active="1"' in fragment
    assert "Waiting for nodes to register with Slurm" in fragment
    assert "<html" not in fragment


def test_user_text_is_escaped(staff_client):
    make_cluster(
        "alpha",
        display_name="<script>alert('x')</script>",
        state="ERROR",
        state_message="<img src=x onerror=alert(1)>",
    )
    for url in ("/", "/clusters/", "/clusters/alpha/", "/clusters/alpha/delete/"):
        page = html(staff_client.get(url))
        assert "<script>alert" not in page and "<img src=x" not in page, url
        assert "&lt;script&gt;" in page, url


# --- query counts --------------------------------------------------------------
def _query_count(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize(
    "url, small, large",
    [
        (
            "/",
            lambda: [make_cluster(f"c{i}", nodes=3) for i in range(5)],
            lambda: [make_cluster(f"c{i}", nodes=10) for i in range(5, 50)],
        ),
        (
            "/clusters/",
            lambda: [make_cluster(f"c{i}", nodes=3) for i in range(5)],
            lambda: [make_cluster(f"c{i}", nodes=10) for i in range(5, 50)],
        ),
    ],
)
def test_list_pages_do_not_query_per_row(
    staff_client, django_assert_max_num_queries, url, small, large
):
    small()
    few = _query_count(staff_client, url)
    large()
    with django_assert_max_num_queries(few):
        staff_client.get(url)
    assert _query_count(staff_client, url) == few


def test_detail_does_not_query_per_node(staff_client, django_assert_max_num_queries):
    make_cluster("small", nodes=5, operations=2)
    make_cluster("large", nodes=50, operations=10)
    few = _query_count(staff_client, "/clusters/small/")
    with django_assert_max_num_queries(few):
        staff_client.get("/clusters/large/")
    assert _query_count(staff_client, "/clusters/large/fragment/") <= few


# --- delete --------------------------------------------------------------------
def test_delete_needs_the_cluster_id_typed(staff_client):
    make_cluster("alpha")
    response = staff_client.post("/clusters/alpha/delete/", {"confirm": "alhpa"})
    assert response.status_code == 200
    assert "Type &#x27;alpha&#x27; exactly" in html(response)
    assert 'class="field has-error' in html(response)
    assert Cluster.objects.get().state == "RUNNING"
    assert not Operation.objects.filter(kind="DELETE_CLUSTER").exists()


def test_delete_starts_the_delete_operation(staff_client, staff_user):
    make_cluster("alpha")
    # No on_commit here: the operation is queued, not run (no Slurm in this test).
    response = staff_client.post("/clusters/alpha/delete/", {"confirm": "alpha"}, follow=True)
    assert response.redirect_chain[-1][0] == reverse("clusters:cluster_list")
    assert "Deleting cluster alpha" in html(response)
    assert Cluster.objects.get().state == "DELETING"
    op = Operation.objects.get(kind="DELETE_CLUSTER")
    assert op.owner == staff_user and op.state == "PENDING"


# --- create: JSON -------------------------------------------------------------
def test_json_upload_rejects_invalid_json(staff_client):
    response = staff_client.post("/clusters/create/json/", {"spec_text": '{"cluster_id": '})
    assert response.status_code == 200
    assert "Invalid JSON" in html(response) and "has-error" in html(response)
    response = staff_client.post("/clusters/create/json/", {"spec_text": "[1, 2]"})
    assert "must be a JSON object" in html(response)
    response = staff_client.post("/clusters/create/json/", {"spec_text": ""})
    assert "Paste a spec or choose a file" in html(response)
    assert Cluster.objects.count() == 0


def test_json_upload_lists_spec_errors_by_path(staff_client):
    spec = local_spec("Bad Id")
    spec["node_pools"][1]["scaling_spec"]["min_node_count"] = -1
    response = staff_client.post("/clusters/create/json/", {"spec_text": json.dumps(spec)})
    page = html(response)
    assert response.status_code == 200
    assert 'data-path="cluster_id"' in page
    assert 'data-path="node_pools[1].scaling_spec.min_node_count"' in page
    assert "<code>node_pools[1].scaling_spec.min_node_count</code>" in page
    assert "node pool &#x27;gpu&#x27;" in page and "Must be at least 0." in page
    # The text the user sent stays in the textarea.
    assert "Bad Id" in page
    assert Cluster.objects.count() == 0


def test_json_upload_reports_existing_id(staff_client):
    make_cluster("alpha")
    response = staff_client.post(
        "/clusters/create/json/", {"spec_text": json.dumps(local_spec("alpha"))}
    )
    assert "already exists" in html(response)
    assert Cluster.objects.count() == 1


def test_json_upload_from_file_creates_the_cluster(staff_client, staff_user):
    upload = SimpleUploadedFile(
        "spec.json", json.dumps(local_spec("fromfile")).encode(), "application/json"
    )
    response = staff_client.post("/clusters/create/json/", {"spec_file": upload})
    assert response.status_code == 302 and response.url == "/clusters/fromfile/"
    cluster = Cluster.objects.get()
    assert cluster.cluster_id == "fromfile" and cluster.owner == staff_user
    assert cluster.operations.get().kind == "CREATE_CLUSTER"
    bad = SimpleUploadedFile("spec.json", b"\xff\xfe", "application/json")
    response = staff_client.post("/clusters/create/json/", {"spec_file": bad})
    assert "not UTF-8" in html(response)


# --- create: reference architectures --------------------------------------------
def test_reference_architectures_are_valid_specs():
    keys = {arch.key for arch in architecture_list()}
    assert {"a3-ultra-pretraining", "a4-pretraining", "a3-mega-finetuning", "local-dev"} <= keys
    expected = {
        "a3-ultra-pretraining": ("a3-ultragpu-8g", "NVIDIA_H200_141GB"),
        "a4-pretraining": ("a4-highgpu-8g", "NVIDIA_B200"),
        "a3-mega-finetuning": ("a3-megagpu-8g", "NVIDIA_H100_MEGA_80GB"),
        "local-dev": ("local-2", "NVIDIA_H200_141GB"),
    }
    for arch in architecture_list():
        spec = validate_cluster_spec(arch.build_spec())
        machine = spec["node_pools"][1]["machine_spec"]
        assert (machine["machine_type"], machine["accelerator_type"]) == expected[arch.key]
        assert machine["accelerator_count"] == 8
        if arch.provider == "gce":
            assert spec["provider"] == "gce" and spec["zone"] == "us-central1-a"
            assert spec["node_pools"][1]["provisioning_model"] == "RESERVATION"
            assert spec["storage"]["lustre"] and spec["storage"]["home"]["type"] == "filestore"
        else:
            assert spec["provider"] == "local"
            assert spec["node_pools"][1]["scaling_spec"]["min_node_count"] == 4
    # build_spec hands out copies.
    arch = architecture_get("local-dev")
    arch.build_spec("x")["labels"]["mutated"] = "yes"
    assert "mutated" not in arch.build_spec()["labels"]


def test_reference_picker_notes_gce_needs(staff_client):
    page = html(staff_client.get("/clusters/create/reference/"))
    for arch in architecture_list():
        assert arch.title in page
        assert reverse("clusters:create_reference_edit", args=[arch.key]) in page
    assert page.count("Needs the gce provider") == 3


def test_reference_editor_suggests_a_free_id_and_creates(staff_client):
    make_cluster("dev")
    page = html(staff_client.get("/clusters/create/reference/local-dev/"))
    assert 'value="dev-2"' in page
    spec = architecture_get("local-dev").build_spec("dev-2")
    response = staff_client.post(
        "/clusters/create/reference/local-dev/",
        {"cluster_id": "mine", "spec_text": json.dumps(spec)},
    )
    assert response.status_code == 302 and response.url == "/clusters/mine/"
    assert (
        Cluster.objects.get(cluster_id="mine").spec["node_pools"][1]["scaling_spec"][
            "min_node_count"
        ]
        == 4
    )


def test_reference_editor_shows_errors_beside_fields(staff_client):
    spec = architecture_get("local-dev").build_spec()
    spec["orchestrator_spec"]["slurm_spec"]["partitions"][0]["node_pool_ids"] = ["nope"]
    response = staff_client.post(
        "/clusters/create/reference/local-dev/",
        {"cluster_id": "Not Valid", "spec_text": json.dumps(spec)},
    )
    assert 'data-field="cluster_id"' in html(response) and "has-error" in html(response)
    response = staff_client.post(
        "/clusters/create/reference/local-dev/", {"cluster_id": "ok", "spec_text": json.dumps(spec)}
    )
    page = html(response)
    assert 'data-path="orchestrator_spec.slurm_spec.partitions[0].node_pool_ids[0]"' in page
    assert "No node pool with id &#x27;nope&#x27;" in page
    response = staff_client.post(
        "/clusters/create/reference/local-dev/", {"cluster_id": "ok", "spec_text": "{oops"}
    )
    assert "Invalid JSON" in html(response)
    assert Cluster.objects.count() == 0


# --- create: the wizard ----------------------------------------------------------
BASICS = {
    "cluster_id": "wiz",
    "display_name": "Wizard cluster",
    "provider": "local",
    "zone": "",
    "labels": "team=llm\nenv=dev",
}
POOLS = {
    "login-login_pool_id": "login",
    "login-login_machine_type": "local-2",
    "pools-TOTAL_FORMS": "1",
    "pools-INITIAL_FORMS": "1",
    "pools-MIN_NUM_FORMS": "1",
    "pools-MAX_NUM_FORMS": "16",
    "pools-0-pool_id": "gpu",
    "pools-0-machine_type": "local-2",
    "pools-0-accelerator_type": "NVIDIA_H200_141GB",
    "pools-0-accelerator_count": "8",
    "pools-0-node_count": "2",
    "pools-0-provisioning_model": "STANDARD",
    "pools-0-reservation": "",
}
SLURM = {"partitions": "gpu = gpu", "config_overrides": "", "prolog": "", "epilog": ""}


def wizard(step: str) -> str:
    return reverse("clusters:wizard_step", args=[step])


def walk_wizard(client, *, basics=None, pools=None, network=None, storage=None, slurm=None):
    steps = [
        ("basics", basics or BASICS),
        ("pools", pools or POOLS),
        ("network", network or {}),
        ("storage", storage or {}),
        ("slurm", slurm or SLURM),
    ]
    for step, data in steps:
        response = client.post(wizard(step), data)
        assert response.status_code == 302, (step, html(response)[:2000])


def test_wizard_defaults_make_a_local_cluster_in_a_few_clicks(staff_client):
    page = html(staff_client.get(wizard("basics")))
    assert 'value="demo"' in page
    pools = html(staff_client.get(wizard("basics")))
    assert pools
    # Take every default: only the id is needed.
    for step, data in (("basics", {"cluster_id": "demo", "provider": "local"}),):
        assert staff_client.post(wizard(step), data).status_code == 302
    page = html(staff_client.get(wizard("pools")))
    for value in (
        'value="login"',
        'value="local-2"',
        'value="NVIDIA_H200_141GB"',
        'value="8"',
        'value="2"',
        'value="gpu"',
    ):
        assert value in page
    staff_client.post(wizard("pools"), POOLS)
    staff_client.post(wizard("network"), {})
    staff_client.post(wizard("storage"), {"lustre_mount_point": "/mnt/lustre"})
    page = html(staff_client.get(wizard("slurm")))
    assert "gpu = gpu" in page
    staff_client.post(wizard("slurm"), SLURM)
    review = staff_client.get(wizard("review"))
    spec = json.loads(review.context["spec_json"])
    assert spec["node_pools"][1]["machine_spec"] == {
        "machine_type": "local-2",
        "accelerator_type": "NVIDIA_H200_141GB",
        "accelerator_count": 8,
    }
    assert spec["orchestrator_spec"]["slurm_spec"]["partitions"] == [
        {"id": "gpu", "node_pool_ids": ["gpu"], "default": True}
    ]
    assert "storage" not in spec and "network" not in spec
    validate_cluster_spec(spec)


def test_wizard_steps_show_field_errors_and_create_nothing(staff_client):
    make_cluster("taken")
    response = staff_client.post(
        wizard("basics"),
        {"cluster_id": "Bad_ID", "provider": "gce", "zone": "", "labels": "Team=LLM\nnoequals"},
    )
    page = html(response)
    assert response.status_code == 200
    assert 'data-field="cluster_id"' in page and "Lowercase letters, digits and -" in page
    assert "A zone is required on the gce provider." in page
    assert "Line 1: &#x27;Team&#x27; is not a valid key" in page
    assert "Line 2: write key=value." in page
    response = staff_client.post(wizard("basics"), {**BASICS, "cluster_id": "taken"})
    assert "already exists" in html(response)
    # Later steps cannot be skipped to.
    assert staff_client.get(wizard("slurm")).url == wizard("basics")

    assert staff_client.post(wizard("basics"), BASICS).status_code == 302
    bad_pools = {
        **POOLS,
        "pools-TOTAL_FORMS": "2",
        "pools-0-accelerator_count": "99",
        "pools-0-provisioning_model": "RESERVATION",
        "pools-1-pool_id": "login",
        "pools-1-machine_type": "local-2",
        "pools-1-accelerator_type": "",
        "pools-1-accelerator_count": "0",
        "pools-1-node_count": "1",
        "pools-1-provisioning_model": "STANDARD",
    }
    page = html(staff_client.post(wizard("pools"), bad_pools))
    assert "Ensure this value is less than or equal to 16." in page
    assert "Name the reservation to provision from." in page
    assert "The login pool already uses this id." not in page  # pool 0 invalid: checked later
    bad_pools.update({"pools-0-accelerator_count": "8", "pools-0-provisioning_model": "STANDARD"})
    page = html(staff_client.post(wizard("pools"), bad_pools))
    assert "The login pool already uses this id." in page
    too_many = {**POOLS, "pools-0-node_count": "65"}
    assert "At most 64 nodes" in html(staff_client.post(wizard("pools"), too_many))
    assert staff_client.post(wizard("pools"), POOLS).status_code == 302

    page = html(staff_client.post(wizard("network"), {"network": "Bad Net", "mtu": "9000"}))
    assert "A VPC network name." in page and "less than or equal to 8896" in page
    assert staff_client.post(wizard("network"), {}).status_code == 302

    page = html(
        staff_client.post(
            wizard("storage"),
            {
                "home_ip": "10.0.0.300",
                "lustre_filesystem": "lfs",
                "lustre_mount_point": "/mnt/l",
                "gcs_mount_point": "/gcs/x",
            },
        )
    )
    assert "An IPv4 address." in page and "Required for a Lustre mount." in page
    assert "Name the bucket to mount." in page
    assert staff_client.post(wizard("storage"), {}).status_code == 302

    page = html(
        staff_client.post(
            wizard("slurm"),
            {
                "partitions": "gpu = gpu, cpu\nlog = login",
                "config_overrides": "SlurmctldPort=1\nx y",
            },
        )
    )
    assert "no compute pool &#x27;cpu&#x27;" in page
    assert "&#x27;login&#x27; is the login pool" in page
    assert "mtc manages &#x27;SlurmctldPort&#x27; itself." in page
    assert "Line 2: write key=value." in page
    assert Cluster.objects.filter(cluster_id="wiz").count() == 0
    assert Cluster.objects.count() == 1


def test_wizard_full_spec_with_storage_pools_and_scripts(staff_client, staff_user):
    pools = {
        **POOLS,
        "pools-TOTAL_FORMS": "2",
        "pools-1-pool_id": "cpu",
        "pools-1-machine_type": "local-4",
        "pools-1-accelerator_type": "",
        "pools-1-accelerator_count": "0",
        "pools-1-node_count": "1",
        "pools-1-provisioning_model": "SPOT",
    }
    storage = {
        "home_type": "filestore",
        "home_ip": "10.0.0.2",
        "home_share": "home",
        "lustre_ip": "10.1.0.5",
        "lustre_filesystem": "lfs",
        "lustre_mount_point": "/mnt/lustre",
        "lustre_tier": "500",
        "lustre_capacity_gib": "36000",
        "gcs_bucket": "my-data",
    }
    slurm = {
        "partitions": "gpu = gpu\ncpu* = cpu",
        "config_overrides": "SlurmdTimeout=30",
        "prolog": "#!/bin/bash\necho start\n",
        "epilog": "",
    }
    walk_wizard(
        staff_client,
        pools=pools,
        storage=storage,
        slurm=slurm,
        network={"network": "default", "subnetwork": "default", "mtu": "8896"},
    )
    spec = json.loads(staff_client.get(wizard("review")).context["spec_json"])
    assert spec["labels"] == {"team": "llm", "env": "dev"}
    assert spec["network"] == {"network": "default", "subnetwork": "default", "mtu": 8896}
    assert spec["storage"]["lustre"][0]["performance_tier_mbps_per_tib"] == 500
    assert spec["storage"]["gcs_fuse"] == [{"bucket": "my-data", "mount_point": "/gcs/my-data"}]
    slurm_spec = spec["orchestrator_spec"]["slurm_spec"]
    assert slurm_spec["partitions"][1] == {"id": "cpu", "node_pool_ids": ["cpu"], "default": True}
    assert slurm_spec["config_overrides"] == {"SlurmdTimeout": "30"}
    assert slurm_spec["prolog_bash_scripts"] == ["#!/bin/bash\necho start\n"]
    assert spec["node_pools"][2]["provisioning_model"] == "SPOT"

    # Create: the cluster is recorded with the spec and the wizard forgets its answers.
    response = staff_client.post(wizard("review"), {"create": "1"})
    assert response.status_code == 302 and response.url == "/clusters/wiz/"
    cluster = Cluster.objects.get(cluster_id="wiz")
    assert cluster.owner == staff_user and cluster.display_name == "Wizard cluster"
    assert cluster.spec["storage"]["home"]["ip"] == "10.0.0.2"
    assert staff_client.get(wizard("review")).url == wizard("basics")


def test_wizard_review_maps_spec_errors_to_steps(staff_client):
    walk_wizard(staff_client)
    # The id was free at step 1, but someone took it since.
    make_cluster("wiz")
    response = staff_client.post(wizard("review"), {"create": "1"})
    page = html(response)
    assert response.status_code == 200
    assert "already exists" in page and "Fix in step “Basics”" in page
    assert f'href="{wizard("basics")}"' in page
    assert Cluster.objects.count() == 1
    # A stored answer the validator refuses is sent back to its step as well.
    session = staff_client.session
    session["mtc_cluster_wizard"]["pools"]["compute"][0]["node_count"] = 500
    session.save()
    page = html(staff_client.get(wizard("review")))
    assert "<code>node_pools[1].scaling_spec.min_node_count</code>" in page
    assert "Fix in step “Node pools”" in page


def test_wizard_back_keeps_answers_and_start_over_forgets_them(staff_client):
    staff_client.post(wizard("basics"), BASICS)
    response = staff_client.post(wizard("pools"), {**POOLS, "back": "1"})
    assert response.url == wizard("basics")
    assert 'value="wiz"' in html(staff_client.get(wizard("basics")))
    assert 'value="gpu"' in html(staff_client.get(wizard("pools")))
    staff_client.post(reverse("clusters:wizard_reset"))
    assert 'value="demo"' in html(staff_client.get(wizard("basics")))


def test_wizard_recovers_from_damaged_answers(staff_client):
    walk_wizard(staff_client)
    session = staff_client.session
    del session["mtc_cluster_wizard"]["pools"]["compute"]
    session.save()
    response = staff_client.get(wizard("review"), follow=True)
    assert response.redirect_chain[-1][0] == wizard("basics")
    assert "could not be read" in html(response)


def test_wizard_switching_provider_offers_provider_defaults(staff_client):
    staff_client.post(wizard("basics"), BASICS)
    staff_client.post(wizard("pools"), POOLS)
    staff_client.post(wizard("basics"), {**BASICS, "provider": "gce", "zone": "us-central1-a"})
    page = html(staff_client.get(wizard("pools")))
    assert 'value="a3-ultragpu-8g"' in page and 'value="n2-standard-8"' in page
    page = html(staff_client.post(wizard("pools"), POOLS))
    assert "local-N machine types exist only on local." in page


@pytest.mark.parametrize(
    "path, step",
    [
        ("cluster_id", "basics"),
        ("labels.team", "basics"),
        ("zone", "basics"),
        ("node_pools[1].scaling_spec.min_node_count", "pools"),
        ("orchestrator_spec.slurm_spec.login_node_pool_id", "pools"),
        ("orchestrator_spec.slurm_spec.partitions[0].id", "slurm"),
        ("network.mtu", "network"),
        ("storage.lustre[0].ip", "storage"),
        ("non_field_errors", None),
    ],
)
def test_spec_paths_map_to_wizard_steps(path, step):
    assert wizard_step_for_path(path) == step


@pytest.mark.parametrize(
    "state, group",
    [
        ("IDLE", "idle"),
        ("ALLOCATED", "busy"),
        ("MIXED", "busy"),
        ("COMPLETING", "busy"),
        ("DRAINING", "drain"),
        ("DRAINED", "drain"),
        ("DOWN", "down"),
        ("DOWN*", "down"),
        ("IDLE*", "down"),
        ("FAIL", "down"),
        ("UNKNOWN", "unknown"),
        ("", "unknown"),
    ],
)
def test_node_state_colours(state, group):
    assert node_group(state) == group


# --- with real Slurm -------------------------------------------------------------
@pytest.mark.slurm
def test_json_upload_creates_a_real_cluster_and_delete_page_removes_it(
    staff_client, settings, django_capture_on_commit_callbacks
):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    try:
        with django_capture_on_commit_callbacks(execute=True):
            response = staff_client.post(
                "/clusters/create/json/", {"spec_text": json.dumps(local_spec("pages-real"))}
            )
        assert response.status_code == 302
        page = html(staff_client.get("/clusters/pages-real/"))
        assert 'data-testid="cluster-state">RUNNING<' in page
        assert page.count('data-state="IDLE"') == 2
        with django_capture_on_commit_callbacks(execute=True):
            response = staff_client.post(
                "/clusters/pages-real/delete/", {"confirm": "pages-real"}, follow=True
            )
        # The delete ran when the request's transaction committed (after the view).
        assert "Deleting cluster pages-real" in html(response)
        assert not Cluster.objects.filter(cluster_id="pages-real").exists()
    finally:
        for cluster in Cluster.objects.all():
            with django_capture_on_commit_callbacks(execute=True):
                services.cluster_delete(cluster=cluster)
