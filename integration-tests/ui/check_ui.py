"""Drives the web UI in a real headless Chromium (Debian's, through Playwright) as a
person would, against the GMV scenario the Rust test (tests/ui.rs) set up: the
order table has committed, the payments are late.

    check_ui.py BASE_URL VIEWER_TOKEN OPERATOR_TOKEN PUSH_URL PUSH_TOKEN SHOTS_DIR

Prints what it checked; exits non-zero (with the reason) at the first thing that
is not as a user should see it. Screenshots go to SHOTS_DIR.
"""

import json
import re
import os
import sys
import urllib.request

from playwright.sync_api import expect, sync_playwright

from browser import launch, sign_in

BASE, VIEWER, OPERATOR, PUSH_URL, PUSH_TOKEN, SHOTS = sys.argv[1:7]
DEP = "dwd_trade_event_fact"


def step(text):
    print(f"[ui] {text}", flush=True)


def shot(page, name):
    page.screenshot(path=os.path.join(SHOTS, f"{name}.png"))


def push(asset, seq):
    body = json.dumps({"asset_key": asset, "format": "iceberg", "snapshot_id": 5000 + seq,
                       "sequence": seq, "commit_time_ms": 1764547200000 + seq,
                       "operation": "append"}).encode()
    req = urllib.request.Request(PUSH_URL, data=body, method="POST", headers={
        "Authorization": f"Bearer {PUSH_TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status < 300, r.status


def main():
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1400, "height": 860})
        page.set_default_timeout(15_000)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))

        step("a viewer signs in and sees the asset graph: 5 assets, 3 dependencies")
        sign_in(page, BASE, VIEWER)
        page.goto(f"{BASE}/ui/#/graph")
        expect(page.locator("#graph .node.asset")).to_have_count(5)
        expect(page.locator("#graph .node.dep")).to_have_count(3)
        expect(page.locator('#graph .node[data-id="lake.ods.order_latest"]')).to_have_attribute("data-state", "fresh")
        expect(page.locator('#graph .node[data-id="lake.ods.payment_latest"]')).to_have_attribute("data-state", "waiting")
        expect(page.locator("#live")).to_have_text("● live")
        shot(page, "graph")

        step("an asset's page: its state, commits and what its readers wait for")
        page.click('#graph .node[data-id="lake.ods.order_latest"]')
        expect(page.locator("#readers")).to_contain_text("dwd_trade_event_fact")
        expect(page.locator("#readers")).to_contain_text("lake.ods.payment_latest")
        expect(page.locator("table")).to_contain_text(re.compile("push", re.IGNORECASE))
        page.goto(f"{BASE}/ui/#/graph")

        step("the graph filters by name")
        page.fill("#filter", "gmv_daily")
        page.keyboard.press("Enter")
        expect(page.locator("#graph .node.dep")).to_have_count(2)
        page.goto(f"{BASE}/ui/#/graph")
        expect(page.locator("#graph .node.dep")).to_have_count(3)

        step(f"opening {DEP} while the payments are late shows the blocking leaf and why")
        page.click(f'#graph .node[data-id="{DEP}"]')
        expect(page).to_have_url(f"{BASE}/ui/#/dep/{DEP}")
        late = page.locator('#explain li[data-asset="lake.ods.payment_latest"] .leaf')
        expect(late).to_have_class("leaf no")
        expect(late.locator(".reason")).not_to_be_empty()
        reason = late.locator(".reason").inner_text()
        expect(page.locator('#explain li[data-asset="lake.ods.order_latest"] .leaf')).to_have_class("leaf ok")
        step(f"  blocked by lake.ods.payment_latest: {reason}")
        for label in ["pause", "run-now"]:
            button = page.locator(f'button[data-action="{label}"]')
            expect(button).to_be_disabled()
            expect(button).to_have_attribute("title", "needs operator in gmv")
        shot(page, "dependency-blocked")

        step("the payment commit shows without a reload: the dependency triggers")
        page.evaluate("window.__sameDocument = true")
        push("lake.ods.payment_latest", 1)
        expect(page.locator("#runs tr")).to_have_count(2, timeout=30_000)
        expect(page.locator("#explain")).to_contain_text("last trigger")
        assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
        shot(page, "dependency-triggered")

        step("an operator pauses, resumes and runs it now")
        page.click("#signout")
        sign_in(page, BASE, OPERATOR)
        page.goto(f"{BASE}/ui/#/dep/{DEP}")
        page.fill("#reason", "maintenance window")
        page.click('button[data-action="pause"]')
        expect(page.locator("#toast")).to_contain_text("paused")
        expect(page.locator('button[data-action="resume"]')).to_be_enabled()
        page.goto(f"{BASE}/ui/#/graph")
        expect(page.locator(f'#graph .node[data-id="{DEP}"]')).to_have_attribute("data-state", "paused")
        page.goto(f"{BASE}/ui/#/dep/{DEP}")
        page.click('button[data-action="resume"]')
        expect(page.locator("#toast")).to_contain_text("resumed")
        page.fill("#reason", "re-publish after the fix")
        page.click('button[data-action="run-now"]')
        expect(page.locator("#toast")).to_contain_text("requested")
        expect(page.locator("#runs tr")).to_have_count(3, timeout=30_000)
        expect(page.locator("#runs")).to_contain_text("manual")

        step("a backfill of two partitions from the page, with its progress")
        page.fill("#backfill-partitions", "dt=2026-11-01,dt=2026-11-02")
        page.click('button[data-action="backfill"]')
        expect(page.locator("#toast")).to_contain_text("2 items")
        expect(page.locator("#backfills tr")).to_have_count(2)
        expect(page.locator("#backfills .progress")).to_contain_text("/2 succeeded")

        step("a run's page: its snapshot combination and transitions")
        page.locator("#runs a").last.click()
        expect(page.locator("#inputs")).to_contain_text("lake.ods.payment_latest")
        expect(page.locator("#transitions tr")).not_to_have_count(1)
        shot(page, "run")

        step("the runs page lists every run")
        page.click('a[data-nav="runs"]')
        expect(page.locator("table tr")).to_have_count(5)  # two runs and two backfill items
        page.fill("#runs-dependency", "ads_gmv_dashboard")
        page.keyboard.press("Enter")
        expect(page.locator("table tr")).to_have_count(1)
        shot(page, "runs")
        assert not errors, f"script errors in the page: {errors}"
        browser.close()
    step("all as a user should see it")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the reason, for the Rust test to show
        print(f"[ui] FAILED: {e}", flush=True)
        sys.exit(1)
