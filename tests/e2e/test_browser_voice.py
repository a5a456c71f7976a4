"""The race page's voice and speed controls, in headless Chromium against a
``myna serve`` with a second Piper voice: the voice picker is filled from ``GET /v1/voices``, and
each turn carries the picked voice and speed (the lane's audio length shows which were used).

The second voice is the bundled model under another name with its config's ``length_scale`` at
1.6 (a slower reader). Run as tests/e2e/test_browser.py says (loopback namespace)."""

from __future__ import annotations

import pytest

from test_browser import _connected, _fresh, _lane, _number, _race_done, _race_id, browser  # noqa: F401

pytestmark = [pytest.mark.network, pytest.mark.browser]

SLOW = "en_GB-slow-medium"


@pytest.fixture(scope="module")
def server(start_worker, slow_voice):
    """``myna serve`` with the bundled voice and the slow second voice (no phrase cache: quick to start)."""
    worker = start_worker("--offer-rate", "0", "--max-sessions-per-client", "0", "--max-sessions", "32",
                          "--piper-voice", slow_voice, "--piper-seed", "0", "--phrase-cache-mb", "0", timeout=120)
    yield worker.url
    worker.stop()


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
