"""A person of the directory's operator group logs in through LDAP (a real slapd,
tests/sso/ldap_server.py) in Chromium: they edit claims but see no fix button; taken out
of the group, their next login ends on the no-access page and their open page is logged out."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from gpufleet.audit.models import AuditEntry
from gpufleet.claims.models import Claim
from gpufleet.ingest.services import ingest_snapshot
from tests.browser.conftest import SPEC, cdi_spec_snapshot
from tests.claims.helpers import lab_team
from tests.sso import ldap_server
from tests.sso.ldap_server import CONTACT, PEOPLE_ENTRIES

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

directory, ldap_site = ldap_server.directory, ldap_server.ldap_site


@pytest.fixture
def node(transactional_db):
    """One 8-GPU node whose "cdi" finding has a fix its agent allows: an admin sees
    "Apply fix…" at it."""
    assert ingest_snapshot(cdi_spec_snapshot(SPEC)).outcome == "accepted"
    return SPEC


def log_in_as(page, uid: str) -> None:
    page.goto("/accounts/login/")
    page.fill("#id_username", uid)
    page.fill("#id_password", PEOPLE_ENTRIES[uid][2])
    page.click("button[type=submit]")


def test_a_directory_operator_edits_claims_but_applies_no_fix(page, browser, live_server, ldap_site, directory, node):
    log_in_as(page, "alice")
    expect(page.locator(".whoami")).to_contain_text("alice")
    # Booking is a team's: an admin puts her in one (tests/claims/test_rights.py).
    lab_team().memberships.create(user=get_user_model().objects.get(username="alice"))

    page.goto(f"/nodes/{node}/")
    expect(page.get_by_role("heading", level=1)).to_have_text(node)
    expect(page.locator("#findings")).to_contain_text("CDI spec")
    expect(page.get_by_role("link", name="Apply fix…")).to_have_count(0)

    form = page.locator("#claim-form")
    form.get_by_label("Name").fill("alice-train")
    form.get_by_label("How many GPUs").fill("2")
    form.get_by_role("button", name="Add claim").click()
    expect(page.locator("#claims-panel .claims-notice")).to_have_text("Claim alice-train added: 2 GPUs.")
    claim = Claim.objects.get(name="alice-train")
    assert claim.created_by.username == "alice" and claim.count == 2
    assert AuditEntry.objects.filter(action="claim.create", username="alice").exists()

    # Out of the group: the next login (another browser) ends on the no-access page...
    directory.remove_member("gpu-operators", "alice")
    other = browser.new_context(base_url=live_server.url)
    again = other.new_page()
    log_in_as(again, "alice")
    expect(again).to_have_url(re.compile(r"/accounts/no-access/$"))
    expect(again.get_by_role("alert")).to_contain_text("alice")
    expect(again.locator("main")).to_contain_text(CONTACT)
    other.close()

    # ...and the page she still had open is logged out at its next request.
    page.goto(f"/nodes/{node}/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))
