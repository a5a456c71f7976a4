"""Headless Chromium drives the page against a running ``myna serve`` (issue 2, item 7).

Run inside a loopback-only network namespace (DESIGN.md §5), as root::

    unshare -n sh -c 'ip link set lo up; . .venv/bin/activate; python -m pytest tests/e2e/test_browser.py -q -x'

Chromium is Debian's (``/usr/bin/chromium``), driven by Python Playwright; never ``playwright
install``. The page uses no STUN (``iceServers: []``), so nothing leaves loopback.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.network, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--allow-loopback-in-peer-connection",
    "--use-fake-ui-for-media-stream",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--disable-sync",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--autoplay-policy=no-user-gesture-required",
]
SENTENCE = "Thanks for calling! Your table for four is booked at seven tonight."

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _myna_command() -> list[str]:
    script = Path(sys.executable).with_name("myna")
    if script.exists():
        return [str(script)]
    found = shutil.which("myna")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from myna.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A ``myna serve`` on a free loopback port; yields its base URL once /healthz says ready."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*_myna_command(), "serve", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90  # engine load + warm-up take a few seconds
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
                pytest.fail(f"myna serve was not ready within 90 s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Debian's Chromium, headless, with a fresh profile."""
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


class Console:
    """Collects console errors and uncaught exceptions of a page."""

    def __init__(self, page):
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))


@pytest.fixture
def page(browser, server):
    page = browser.new_page()
    console = Console(page)
    page.goto(server)
    yield page, console
    page.close()


def _connected(page, timeout_ms: int = 20_000) -> None:
    page.wait_for_selector('#status[data-state="connected"]', timeout=timeout_ms)


def _number(page, selector: str) -> float | None:
    value = page.get_attribute(selector, "data-value")
    return float(value) if value else None


# -- the onset detector (web/onset.js) ----------------------------------------------------
ONSET_JS = """async ([kind, args]) => {
  const { firstAudibleSample, OnsetDetector } = await import("/static/onset.js");
  const sr = 48000;
  let seed = 12345;
  const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648) * 2 - 1;
  const x = new Float32Array(args.n);
  if (kind === "tone") {
    for (let i = args.at; i < args.n; i++) x[i] = args.amp * Math.sin((2 * Math.PI * args.hz * (i - args.at)) / sr + (args.phase || 0));
  } else if (kind === "noise") {
    // Uniform noise of the given RMS (uniform on [-a, a] has RMS a / sqrt 3), on a DC offset.
    for (let i = 0; i < args.n; i++) x[i] = (args.dc || 0) + rand() * args.rms * Math.sqrt(3);
  }
  // The streaming path in 128-frame render quanta, as the AudioWorklet feeds it.
  const d = new OnsetDetector(sr);
  let streamed = null;
  for (let i = 0; i < x.length && streamed === null; i += 128) streamed = d.push(x.subarray(i, i + 128));
  return { whole: firstAudibleSample(x, sr), streamed };
}"""


@pytest.mark.parametrize(
    "amp, hz, phase, at",
    [(0.5, 440.0, 0.0, 14_417), (0.05, 1000.0, 0.0, 24_001), (0.3, 220.0, 1.5707963, 9_600)],
)
def test_onset_detects_tone_within_1ms(page, amp, hz, phase, at):
    pg, _ = page
    got = pg.evaluate(ONSET_JS, ["tone", {"n": 48_000, "at": at, "amp": amp, "hz": hz, "phase": phase}])
    for key in ("whole", "streamed"):
        assert got[key] is not None, got
        assert abs(got[key] - at) <= 48, f"{key}: onset at {got[key]}, tone starts at {at} (1 ms = 48 samples)"


@pytest.mark.parametrize("rms, dc", [(0.005, 0.0), (0.008, 0.0), (0.005, 0.4)])
def test_onset_ignores_noise_under_threshold(page, rms, dc):
    pg, _ = page
    got = pg.evaluate(ONSET_JS, ["noise", {"n": 48_000, "rms": rms, "dc": dc}])
    assert got == {"whole": None, "streamed": None}


def test_silence_has_no_onset(page):
    pg, _ = page
    assert pg.evaluate(ONSET_JS, ["silence", {"n": 4800}]) == {"whole": None, "streamed": None}


def test_token_chunks_match_the_python_client(page):
    from myna.rtc.client import token_chunks

    pg, _ = page
    text = "Hello wonderful world, the reference implementation streams extraordinarily long words."
    chunks = pg.evaluate('async (t) => (await import("/static/tokens.js")).tokenChunks(t)', text)
    assert chunks == token_chunks(text)
    assert "".join(chunks) == text


# -- the page against the worker ----------------------------------------------------------
def test_page_speaks_and_shows_perceived_ttfa(page):
    pg, console = page
    _connected(pg)
    assert pg.input_value("#text").strip() == SENTENCE
    assert pg.input_value("#rate") == "30"
    engines = pg.eval_on_selector_all("#engine option", "els => els.map(e => e.value)")
    assert "piper" in engines

    pg.click("#speak")
    row = '#turns tbody tr:first-child[data-status="done"]'
    pg.wait_for_selector(row, timeout=30_000)
    pg.wait_for_function("() => document.querySelector('#perceived').dataset.value !== ''", timeout=10_000)

    perceived = _number(pg, "#perceived")
    server_ttfa = _number(pg, "#server")
    assert perceived is not None and server_ttfa is not None
    assert pg.inner_text("#perceived").strip().isdigit()
    assert 0 < server_ttfa <= perceived < 5_000, (server_ttfa, perceived)

    words = pg.eval_on_selector_all("#captions .word", "els => els.map(e => e.textContent)")
    assert len(words) >= 6, words
    assert "table" in [w.strip(".,!").lower() for w in words]

    cells = pg.eval_on_selector_all(f"{row} td", "els => els.map(e => e.textContent.trim())")
    assert cells[0] == "1" and cells[1] == SENTENCE
    assert cells[2] == f"{perceived:.0f} ms" and cells[3] == f"{server_ttfa:.0f} ms"
    assert cells[4].endswith(" ms") and float(cells[4].split()[0]) > 1000  # a 12-word sentence
    assert cells[5].isdigit()
    assert "n\u00a0=\u00a01" in pg.inner_text("#summary")

    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "browser.png"), full_page=True)
    pg.set_viewport_size({"width": 380, "height": 800})
    pg.screenshot(path=str(ARTIFACTS / "browser-phone.png"), full_page=True)
    assert console.errors == []


def test_keyboard_enter_speaks_and_escape_interrupts(page):
    pg, console = page
    _connected(pg)
    long_text = " ".join(["This sentence keeps going so that there is time to interrupt it."] * 4)
    pg.fill("#text", long_text)
    pg.focus("#text")
    pg.keyboard.press("Enter")
    assert pg.input_value("#text") == long_text  # Enter spoke instead of adding a line
    pg.wait_for_function("() => document.querySelector('#server').dataset.value !== ''", timeout=20_000)
    pg.keyboard.press("Escape")
    pg.wait_for_selector('#turns tbody tr:first-child[data-status="interrupted"]', timeout=10_000)
    # The session stays usable after the barge-in.
    pg.fill("#text", "Still here.")
    pg.click("#speak")
    pg.wait_for_selector('#turns tbody tr:first-child[data-status="done"]', timeout=30_000)
    assert pg.locator("#turns tbody tr").count() == 2
    assert console.errors == []


def test_unknown_engine_shows_engine_missing(browser, server):
    pg = browser.new_page()
    try:
        pg.goto(f"{server}/?engine=no-such-engine")
        pg.wait_for_selector('#status[data-state="missing"]', timeout=10_000)
        assert "Engine missing" in pg.inner_text("#status")
        assert pg.is_disabled("#speak")
    finally:
        pg.close()
