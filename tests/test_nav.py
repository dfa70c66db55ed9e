"""Every page the navigation bar links to renders with no query string, for a user and
for an operator (the Usage page once answered 500 unless ``start`` was in its query)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from clusters.models import Cluster
from clusters.spec import validate_cluster_spec

from .conftest import make_spec

pytestmark = pytest.mark.django_db
NAV_LINK_RE = re.compile(r'<a class="(?:nav-link|brand)[^"]*" href="([^"]+)"')


@pytest.fixture
def cluster(db):
    spec = validate_cluster_spec(make_spec("nav", nodes=2))
    return Cluster.objects.create(cluster_id="nav", spec=spec, state="RUNNING")


@pytest.mark.parametrize("persona", ["user", "operator"])
def test_every_page_the_nav_links_to_renders(cluster, persona, request):
    client = Client()
    client.force_login(request.getfixturevalue(persona))
    home = client.get("/")
    assert home.status_code == 200
    links = sorted(set(NAV_LINK_RE.findall(home.content.decode())))
    assert any("usage" in link for link in links), links
    answers = {link: client.get(link).status_code for link in links}
    assert answers and set(answers.values()) == {200}, answers
