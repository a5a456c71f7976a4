"""The race page's "via LiveKit room" lane in headless Chromium, against a real livekit-server.

``myna serve --livekit-url`` serves the page, opens a room with Myna in it for the lane, and
serves livekit-client from the set-up's npm install. The lane races a direct lane and is
measured with the same onset rule. Chromium reaches the server's media address over the veth
pair inside the test namespace (myna.bench.livekit_server).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from inprocess import quick_start_args
from myna.bench.livekit_server import DEV_KEY, DEV_SECRET
from myna.bench.processes import free_port
from myna.server.room_lane import client_bundle
from tests.e2e.test_browser import CHROMIUM, CHROMIUM_ARGS, Console, _connected, _fresh, _lane, _number, _race_done
from tests.room.support import ARTIFACTS

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.network, pytest.mark.browser]


@pytest.fixture(scope="module")
def lane_server(livekit_node):
    if client_bundle() is None:
        if shutil.which("npm"):
            pytest.fail("livekit-client is not installed: run `bash scripts/setup.sh dev` (it uses the npm found here)")
        pytest.skip("livekit-client is not installed and npm is missing: install npm, then run scripts/setup.sh dev")
    port = free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / f"serve-livekit-{port}.log", "wb")
    env = {**os.environ, "LIVEKIT_API_KEY": DEV_KEY, "LIVEKIT_API_SECRET": DEV_SECRET}
    args = ["--port", str(port), "--engine", "piper", "--livekit-url", livekit_node.url, "--max-sessions", "8"]
    proc = subprocess.Popen([sys.executable, "-m", "myna.cli", "serve", *args, *quick_start_args("serve", args)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, f"myna serve exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "myna serve was not ready within 90 s"
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=20)
    log.close()


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(tmp_path_factory.mktemp("chromium-lk")), executable_path=CHROMIUM,
                                                       headless=True, args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 900})
        yield context
        context.close()


def test_the_room_lane_races_a_direct_lane_and_is_measured_the_same_way(chromium, lane_server):
    """About 70 s: Chromium joins a LiveKit room and a direct lane, and races them twice at 1×."""
    page = chromium.new_page()
    console = Console(page)
    try:
        _fresh(page, f"{lane_server}/?lanes=piper,livekit")
        _connected(page, timeout_ms=40_000)
        room = _lane("livekit")
        assert "Via LiveKit room" in page.inner_text(room)
        assert page.inner_text("#race").strip() == "Race 2 lanes"
        for run in (1, 2):
            previous = page.evaluate("() => window.myna.race ? window.myna.race.id : null")
            page.click("#race")
            _race_done(page, after=previous)
            for name in ("piper", "livekit"):
                lane = _lane(name)
                assert page.get_attribute(lane, "data-state") == "done", (run, name, page.inner_text(lane))
                perceived, server_ttfa = _number(page, f"{lane} .ttfa"), _number(page, f"{lane} .server")
                assert perceived is not None and server_ttfa is not None, (run, name)
                assert 0 < server_ttfa <= perceived < 30_000, (run, name, server_ttfa, perceived)
                words = page.eval_on_selector_all(f"{lane} .captions .word", "els => els.map(e => e.textContent)")
                assert "table" in [w.lower() for w in words], (run, name, words)
        summary = page.evaluate("() => window.myna.historySummary()")
        assert summary["livekit"]["n"] == 2 and summary["piper"]["n"] == 2
        page.screenshot(path=str(ARTIFACTS / "race-livekit.png"), full_page=True)
        assert console.errors == []
    finally:
        page.close()
