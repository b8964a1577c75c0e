"""The node page's calendar, in headless Chromium on a phone's width: it scrolls inside
itself, never the page, and a free span opens the claim form filled in, in place."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from gpufleet import gpu
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from tests.browser.conftest import log_in
from tests.claims.helpers import make_node, uuid

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_free_span_books_in_place_on_a_phone(browser, live_server, operator, artifacts):
    node = make_node("alpha", 2)
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(days=1)
    services.save_claim(node, gpu.Claim("train", device_ids=(uuid(node, 0),)), operator,
                        terms=services.Terms(owner=operator, starts_at=start, ends_at=start + timedelta(hours=8)))
    context = browser.new_context(viewport={"width": 375, "height": 800}, base_url=live_server.url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    log_in(page, operator)
    page.goto("/nodes/alpha/")
    page.evaluate("window.sameDocument = true")
    calendar = page.locator("#node-calendar")
    expect(calendar.locator("td.calendar-held")).to_have_text("train · lab · otto")
    assert page.evaluate("document.documentElement.scrollWidth") <= 375, "the page itself never scrolls sideways"
    page.screenshot(path=str(artifacts / "calendar-phone.png"), full_page=True)

    # GPU 1's first free span: from now until the calendar's end.
    calendar.locator("tr", has_text="GPU 1").locator("td.calendar-free a").first.click()
    form = page.locator("#claim-form")
    expect(form.get_by_label("These GPUs")).to_be_checked()
    expect(form.locator(f'input[value="{uuid(node, 1)}"]')).to_be_checked()
    expect(form.get_by_label("Ends")).not_to_have_value("")
    assert page.evaluate("window.sameDocument") is True
    form.get_by_label("Name").fill("eval")
    form.get_by_role("button", name="Add claim").click()
    expect(page.locator(".claims-notice")).to_contain_text("Claim eval added")
    # The calendar follows the change.
    expect(calendar.locator("tr", has_text="GPU 1").locator("td.calendar-held")).to_have_text("eval · lab · otto")
    saved = Claim.objects.get(name="eval")
    assert saved.device_ids == [uuid(node, 1)] and saved.ends_at is not None
    context.close()
