import pytest

from .pages import assert_loads_nothing_remote

pytestmark = pytest.mark.django_db


def test_readyz_reports_each_check(client):
    # Redis runs (make test starts it) but no worker does in this process.
    response = client.get("/readyz")
    body = response.json()
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["redis"] == "ok"
    assert body["checks"]["worker"].startswith("error")
    assert response.status_code == 503


def test_api_docs_need_login_and_work_offline(client, admin_user):
    response = client.get("/api/docs/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    client.force_login(admin_user)
    page = client.get("/api/docs/").content.decode()
    assert "swagger-ui" in page
    assert_loads_nothing_remote(page)


def test_plotly_served_from_the_package(client, admin_user):
    client.force_login(admin_user)
    response = client.get("/vendor/plotly.min.js")
    assert response.status_code == 200 and len(response.content) > 1_000_000
