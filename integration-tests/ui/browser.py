"""What the UI checks share: Debian's Chromium launched through Playwright as this
offline machine needs it, and signing in."""

import os

from playwright.sync_api import expect

# Chromium's own connections have nowhere to go on an offline machine.
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def launch(playwright):
    """The system Chromium, headless (a test tool's own browser download cannot work here)."""
    return playwright.chromium.launch(
        executable_path=os.environ.get("SLUICE_TEST_CHROMIUM", "/usr/bin/chromium"),
        headless=True, args=ARGS)


def sign_in(page, base, token):
    page.goto(f"{base}/ui/#/signin")
    page.fill("#token", token)
    page.click("#signin")
    expect(page.locator("#who")).not_to_be_empty()
