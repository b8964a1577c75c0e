"""Find a node, in headless Chromium: the answer comes in place (HTMX) on the claims
page, and "claim here" opens the claim form filled in; the save lands on the node."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from tests.browser.conftest import BROKEN, GONE, HEALTHY, HOT, log_in
from tests.factories import gpu_uuid

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_it_finds_a_node_in_place_and_claims_there(page, fleet, operator):
    log_in(page, operator)
    page.goto("/claims/")
    page.evaluate("window.sameDocument = true")
    form = page.locator("form.placement-form")
    form.get_by_label("GPUs", exact=True).fill("8")
    form.get_by_label("Model").fill("h200")
    form.get_by_label("Free VRAM per GPU (GiB)").fill("100")
    form.get_by_role("button", name="Find a node").click()

    result = page.locator("#placement-result")
    fits = result.locator("table.placement-fits tbody tr")
    expect(fits.filter(has_text=HEALTHY)).to_have_count(1)
    ruled = result.locator("table.placement-ruled-out")
    expect(ruled.locator("tr", has_text=BROKEN).locator("td")).to_have_text("failing")
    expect(ruled.locator("tr", has_text=GONE).locator("td")).to_have_text("offline")
    expect(ruled.locator("tr", has_text=HOT)).to_contain_text("not enough free VRAM")
    # Answered without leaving the page.
    assert page.evaluate("window.sameDocument") is True

    fits.filter(has_text=HEALTHY).get_by_role("link", name="Claim here").click()
    page.wait_for_url(f"**/claims/nodes/{HEALTHY}/new/**")
    claim_form = page.locator("#claim-form")
    expect(claim_form.get_by_label("These GPUs")).to_be_checked()
    expect(claim_form.locator("input[name=devices]:checked")).to_have_count(8)
    claim_form.get_by_label("Name").fill("big-run")
    claim_form.get_by_label("Contact").fill("#llm")
    claim_form.get_by_role("button", name="Add claim").click()
    page.wait_for_url(f"**/nodes/{HEALTHY}/")

    saved = Claim.objects.get(name="big-run")
    assert saved.device_ids == [gpu_uuid(HEALTHY, i) for i in range(8)]
    assert (saved.owner, saved.contact) == (operator, "#llm")
    assert Node.objects.get(name=HEALTHY).gpus_reserved == 8
