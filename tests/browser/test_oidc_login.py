"""OpenID Connect login in headless Chromium: the button on the login page, the real test
provider's own login form (tests/sso/provider.py), and back on the site with the role the
person's directory groups give. Takes the login page's picture that docs/sso.md shows."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from gpufleet.api.models import ApiToken
from gpufleet.claims.models import Claim
from gpufleet.sso import oidc, oidc_settings
from tests.browser.conftest import SPEC
from tests.claims.helpers import lab_team
from tests.sso import provider

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "images"

openid_provider = provider.openid_provider


@pytest.fixture
def oidc_site(settings, openid_provider, live_server):
    """The live server with OpenID Connect login at the test provider, which knows its callback."""
    for name, value in openid_provider.settings(GPUFLEET_OIDC_PROVIDER_NAME="Example Corp").items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, oidc.OIDC_BACKEND]
    settings.CONTENT_SECURITY_POLICY = oidc_settings.allow_logout_at_provider(settings.CONTENT_SECURITY_POLICY,
                                                                              openid_provider.issuer)
    openid_provider.allow_redirect(live_server.url)
    return openid_provider


def log_in_at_the_provider(page, site, username: str) -> None:
    """From the site's login page: the button, then the provider's own form."""
    page.get_by_role("link", name="Log in with Example Corp").click()
    page.wait_for_url(f"{site.url}/accounts/login/**")
    expect(page.get_by_role("heading", level=1)).to_have_text("Test directory")
    page.fill("#id_username", username)
    page.fill("#id_password", provider.PEOPLE[username][2])
    page.get_by_role("button", name="Sign in").click()


def test_an_operator_logs_in_at_the_provider_edits_claims_and_may_not_apply_fixes(page, fleet, oidc_site,
                                                                                   live_server, artifacts):
    complaints = []
    page.on("console", lambda message: complaints.append(message.text))
    page.goto(f"/nodes/{SPEC}/")
    page.wait_for_url("**/accounts/login/?next=**")
    button = page.get_by_role("link", name="Log in with Example Corp")
    expect(button).to_be_visible()
    expect(page.locator("#id_password")).to_be_visible()  # passwords still work beside it
    page.screenshot(path=artifacts / "login-oidc.png", full_page=True)

    log_in_at_the_provider(page, oidc_site, "olivia")

    page.wait_for_url(f"{live_server.url}/nodes/{SPEC}/")
    expect(page.locator(".whoami span")).to_have_text("olivia")
    user = get_user_model().objects.get(username="olivia")
    assert list(user.groups.values_list("name", flat=True)) == ["operator"]

    # An operator of a team edits its claims (an admin puts them in one: tests/claims/test_rights.py)...
    lab_team().memberships.create(user=user)
    page.reload()
    form = page.locator("#claim-form")
    form.get_by_label("Name").fill("train-llm")
    form.get_by_label("How many GPUs").fill("2")
    form.get_by_role("button", name="Add claim").click()
    expect(page.locator("#claims-panel .claims-notice")).to_have_text("Claim train-llm added: 2 GPUs.")
    assert Claim.objects.get(name="train-llm").created_by == user
    # ...but applies no fix, though this node allows one (an admin sees the button).
    expect(page.locator("#findings li.finding", has_text="CDI spec")).to_be_visible()
    expect(page.get_by_role("link", name="Apply fix…")).to_have_count(0)

    # Logging out ends the session here and at the provider, and comes back to the login page.
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{live_server.url}/accounts/login/")
    page.get_by_role("link", name="Log in with Example Corp").click()
    page.wait_for_url(f"{oidc_site.url}/accounts/login/**")  # asked to log in again there
    assert not [text for text in complaints if "Content Security Policy" in text], complaints

    assert (artifacts / "login-oidc.png").stat().st_size > 10_000
    if os.environ.get("GPUFLEET_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(artifacts / "login-oidc.png", SCREENSHOTS / "login-oidc.png")


def test_out_of_the_group_the_next_login_gets_no_access_and_the_tokens_stop(page, fleet, oidc_site, live_server):
    page.goto("/accounts/login/")
    log_in_at_the_provider(page, oidc_site, "olivia")
    page.wait_for_url(f"{live_server.url}/")
    user = get_user_model().objects.get(username="olivia")
    _, secret = ApiToken.issue(user, "ci", ApiToken.Scope.READ)
    api = {"Authorization": f"Bearer {secret}"}
    assert page.request.get("/api/nodes/", headers=api).status == 200
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{live_server.url}/accounts/login/")

    oidc_site.set_groups("olivia", [])
    log_in_at_the_provider(page, oidc_site, "olivia")

    page.wait_for_url(f"{live_server.url}/accounts/no-access/")
    expect(page.get_by_role("heading", level=1)).to_have_text("No access to gpufleet")
    expect(page.locator(".error")).to_contain_text("olivia")
    user.refresh_from_db()
    assert not user.is_active
    assert page.request.get("/api/nodes/", headers=api).status == 401
    page.goto(f"/nodes/{SPEC}/")  # not logged in: the login page sends them back to why
    page.wait_for_url(f"{live_server.url}/accounts/no-access/")
