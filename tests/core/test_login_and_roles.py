"""Login everywhere, roles decide, outsiders see nothing."""

import pytest
from django.urls import reverse

from tests.factories import hx

PAGES = [
    ("fleet:overview", {}),
    ("fleet:summary", {}),
    ("fleet:node_detail", {"name": "alpha"}),
    ("fleet:node_findings", {"name": "alpha"}),
    ("fleet:node_report", {"name": "alpha", "fmt": "json"}),
    ("fleet:report", {"fmt": "csv"}),
    ("audit:log", {}),
]


@pytest.mark.django_db
@pytest.mark.parametrize("name,kwargs", PAGES)
def test_it_redirects_anonymous_to_login(client, alpha, name, kwargs):
    url = reverse(name, kwargs=kwargs)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")


@pytest.mark.django_db
def test_it_answers_anonymous_htmx_with_hx_redirect(client, alpha):
    response = client.get(reverse("fleet:overview"), **hx(hx_current_url="http://testserver/?health=warn"))
    assert response.status_code == 200  # htmx follows HX-Redirect, never swaps the body
    assert response["HX-Redirect"] == reverse("login") + "?next=/?health=warn"


@pytest.mark.django_db
@pytest.mark.parametrize("name,kwargs", PAGES)
def test_it_refuses_outsider_on_pages(client, outsider, alpha, name, kwargs):
    client.force_login(outsider)
    assert client.get(reverse(name, kwargs=kwargs)).status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize("name,kwargs", PAGES)
def test_it_shows_pages_to_viewer(viewer_client, alpha, name, kwargs):
    assert viewer_client.get(reverse(name, kwargs=kwargs)).status_code == 200


@pytest.mark.django_db
def test_it_refuses_outsider_on_job_status(client, outsider, alpha, sent_tasks):
    from gpufleet.jobs.services import request_diagnosis

    job = request_diagnosis(alpha, None)
    client.force_login(outsider)
    assert client.get(reverse("jobs:status", args=[job.pk])).status_code == 403


@pytest.mark.django_db
def test_it_links_admin_only_for_those_the_admin_site_lets_in(viewer_client, admin_role_client, admin_user, alpha):
    assert 'href="/admin/"' not in viewer_client.get("/").content.decode()
    # The admin group opens the admin site (within its limits, gpufleet/core/admin_site.py).
    page = admin_role_client.get("/").content.decode()
    assert 'href="/admin/"' in page and ">Claims</a>" in page and ">Audit</a>" in page
    assert admin_role_client.get("/admin/").status_code == 200
    admin_user.groups.clear()
    assert 'href="/admin/"' not in admin_role_client.get("/").content.decode()
    assert admin_role_client.get("/admin/").status_code == 302


@pytest.mark.django_db
def test_it_puts_the_csrf_header_on_body(viewer_client, alpha):
    page = viewer_client.get("/").content.decode()
    assert "hx-headers='{\"x-csrftoken\": \"" in page
    assert "/static/django_htmx/htmx-2" in page  # vendored, no CDN
    assert "<script>" not in page  # no inline scripts
