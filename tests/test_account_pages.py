"""The Slurm account pages as an operator uses them (Django's test client, asserting on
the HTML): list, create, bad input beside its field, edit, members, delete, a Slurm
that cannot be reached said on the form; users get 403. Database-only: an account
reaches slurmdbd with its first job (tests/test_accounts.py covers that part)."""

import pytest
from django.test import Client
from django.urls import reverse

from clusters.models import Cluster, SlurmAccount, SlurmAssociation
from clusters.providers import get_provider
from mtc.devstack import free_port

from .conftest import make_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def op(operator) -> Client:
    client = Client()
    client.force_login(operator)
    return client


def field_errors(html: str, field: str) -> str:
    """The text of the field's block (its errors sit inside it)."""
    start = html.index(f'data-field="{field}"')
    return html[start : html.index("</div>", start)]


def test_operators_create_edit_and_delete_accounts(op, user):
    listing = op.get(reverse("clusters:account_list"))
    assert listing.status_code == 200
    assert "No accounts yet" in listing.content.decode()

    created = op.post(
        reverse("clusters:account_list"),
        {
            "name": "llm",
            "description": "LLM team",
            "shares": "3",
            "qos": "normal",
            "grp_tres": "gres/gpu=16",
            "max_tres_per_user": "gres/gpu=8",
            "grp_tres_mins": "gres/gpu=6000",
        },
        follow=True,
    )
    html = created.content.decode()
    assert created.status_code == 200 and "Account llm created." in html
    account = SlurmAccount.objects.get(name="llm")
    assert (account.shares, account.grp_tres_mins) == (3, "gres/gpu=6000")

    row = op.get(reverse("clusters:account_list")).content.decode()
    row = row[row.index('data-account="llm"') : row.index("</tr>", row.index('data-account="llm"'))]
    for shown in ("llm", "LLM team", ">3<", "normal", "gres/gpu=16", "gres/gpu=8", "gres/gpu=6000"):
        assert shown in row, (shown, row)
    assert "none" in row  # no members yet

    # Bad input: 400, each message beside its field, nothing stored.
    bad = op.post(
        reverse("clusters:account_list"),
        {"name": "Bad name!", "shares": "0", "grp_tres": "gpus=4"},
    )
    html = bad.content.decode()
    assert bad.status_code == 400
    assert "Lower-case letters" in field_errors(html, "name")
    assert "A whole number from 1" in field_errors(html, "shares")
    assert "TRES=count pairs" in field_errors(html, "grp_tres")
    assert "field-errors" not in field_errors(html, "qos")
    assert not_a_number_is_refused(op)
    again = op.post(reverse("clusters:account_list"), {"name": "llm"})
    assert again.status_code == 400
    assert "exists already" in field_errors(again.content.decode(), "name")
    assert SlurmAccount.objects.count() == 1

    # Edit: the form shows the stored limits; emptying one clears it.
    edit_url = reverse("clusters:account_edit", args=["llm"])
    form = op.get(edit_url).content.decode()
    assert 'value="gres/gpu=16"' in form and 'value="gres/gpu=6000"' in form
    saved = op.post(
        edit_url,
        {"description": "LLM team", "shares": "5", "qos": "", "grp_tres": "gres/gpu=32"},
        follow=True,
    )
    assert "Account llm saved." in saved.content.decode()
    account.refresh_from_db()
    assert (account.shares, account.grp_tres, account.grp_tres_mins) == (5, "gres/gpu=32", "")
    wrong = op.post(edit_url, {"shares": "5", "max_tres_per_user": "gpu"})
    assert wrong.status_code == 400
    assert "TRES=count pairs" in field_errors(wrong.content.decode(), "max_tres_per_user")

    # Members: add by user name (an unknown one is an error beside the field), remove.
    added = op.post(
        reverse("clusters:account_member_add", args=["llm"]), {"username": "uma"}, follow=True
    )
    assert "uma added to llm." in added.content.decode()
    assert list(account.members.values_list("username", flat=True)) == ["uma"]
    listing = op.get(reverse("clusters:account_list")).content.decode()
    assert ">uma<" in listing or "uma</td>" in listing
    nobody = op.post(reverse("clusters:account_member_add", args=["llm"]), {"username": "zed"})
    assert nobody.status_code == 400
    assert "No user" in field_errors(nobody.content.decode(), "username")
    removed = op.post(reverse("clusters:account_member_remove", args=["llm", "uma"]), follow=True)
    assert "uma removed from llm." in removed.content.decode()
    assert not account.members.exists()

    deleted = op.post(reverse("clusters:account_delete", args=["llm"]), follow=True)
    assert "Account llm deleted." in deleted.content.decode()
    assert not SlurmAccount.objects.exists()
    assert op.get(edit_url).status_code == 404


def not_a_number_is_refused(op: Client) -> bool:
    response = op.post(reverse("clusters:account_list"), {"name": "ok", "shares": "lots"})
    return response.status_code == 400 and "field-errors" in field_errors(
        response.content.decode(), "shares"
    )


def test_a_slurm_that_cannot_be_reached_is_said_on_the_form(op):
    """The account is on a cluster whose slurmdbd is gone (its slurm.conf points at a
    port nobody listens on): the change is refused on the form, nothing stored, not a
    500."""
    SlurmAccount.objects.create(name="vision", grp_tres="gres/gpu=8")
    cluster = Cluster.objects.create(cluster_id="gone", spec=make_spec("gone"), state="RUNNING")
    SlurmAssociation.objects.create(cluster=cluster, account="vision", user="")
    conf = get_provider(cluster.provider).conf_path(cluster)
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(
        "ClusterName=gone\nSlurmctldHost=localhost\nAuthType=auth/munge\n"
        "AccountingStorageType=accounting_storage/slurmdbd\n"
        f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={free_port()}\n"
    )
    response = op.post(
        reverse("clusters:account_edit", args=["vision"]), {"grp_tres": "gres/gpu=16"}
    )
    html = response.content.decode()
    assert response.status_code == 400
    assert "Slurm did not take the change" in html
    assert SlurmAccount.objects.get(name="vision").grp_tres == "gres/gpu=8"


def test_only_operators_see_the_pages(user, operator):
    SlurmAccount.objects.create(name="llm")
    client = Client()
    assert client.get(reverse("clusters:account_list")).status_code == 302  # to the login
    client.force_login(user)
    for url in (
        reverse("clusters:account_list"),
        reverse("clusters:account_edit", args=["llm"]),
    ):
        response = client.get(url)
        assert response.status_code == 403
        assert "Only operators" in response.content.decode()
    assert client.post(reverse("clusters:account_list"), {"name": "mine"}).status_code == 403
    assert client.post(reverse("clusters:account_delete", args=["llm"])).status_code == 403
    member_add = reverse("clusters:account_member_add", args=["llm"])
    assert client.post(member_add, {"username": "uma"}).status_code == 403
    assert list(SlurmAccount.objects.values_list("name", flat=True)) == ["llm"]
    nav = client.get(reverse("clusters:dashboard")).content.decode()
    assert reverse("clusters:account_list") not in nav
    client.force_login(operator)
    nav = client.get(reverse("clusters:dashboard")).content.decode()
    assert reverse("clusters:account_list") in nav
    assert client.get(reverse("clusters:account_edit", args=["nope"])).status_code == 404
