"""The page against a worker with keys: a token from ``?token=``, or the field it shows when asked."""

from __future__ import annotations

import datetime
import os

import pytest

from myna.server.auth import mint_token

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.network, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--allow-loopback-in-peer-connection", "--use-fake-ui-for-media-stream", "--disable-gpu",
        "--disable-dev-shm-usage", "--disable-quic", "--disable-sync", "--no-first-run",
        "--autoplay-policy=no-user-gesture-required"]
KEY, SECRET = "page-key", "a-page-test-secret-long-enough-for-hs256!"

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)


def test_the_page_asks_for_a_token_and_connects_with_one(start_worker):
    worker = start_worker("--api-key", KEY, "--api-secret", SECRET, "--max-sessions", "16", "--offer-rate", "0",
                           "--engine", "piper")
    token = mint_token(KEY, SECRET, "page-user", datetime.timedelta(hours=1))
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            try:
                asked = browser.new_page()
                asked.goto(worker.url)
                asked.wait_for_selector("#token", timeout=20_000)  # the worker needs one: a field
                asked.fill("#token", token)
                asked.dispatch_event("#token", "change")
                asked.wait_for_selector('#status[data-state="connected"]', timeout=30_000)
                given = browser.new_page()
                given.goto(f"{worker.url}/?token={token}")
                given.wait_for_selector('#status[data-state="connected"]', timeout=30_000)
                assert given.query_selector("#token") is None
            finally:
                browser.close()
    finally:
        worker.stop()
