"""Headless Chromium (Debian's, driven by Playwright) against the live test server.

Missing Chromium skips these tests on a developer's machine and fails them in CI.
Screenshots go to GPUFLEET_ARTIFACTS (default test-artifacts/ in the checkout)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import missing_service

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests
# make around it are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("GPUFLEET_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(os.environ.get("GPUFLEET_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))


@pytest.fixture(scope="session")
def browser():
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        missing_service(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True,
                                  base_url=live_server.url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


def log_in(page, user, password: str | None = None):
    """Log in through the real login form."""
    page.goto("/accounts/login/")
    page.fill("#id_username", user.get_username())
    page.fill("#id_password", password or "pw-" + user.get_username())
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)
    return page
