"""Headless Chromium drives the latency-race page against a running ``myna serve`` (issues 2 and 6).

Run inside a loopback-only network namespace (DESIGN.md §5), as root::

    unshare -n sh -c 'ip link set lo up; . .venv/bin/activate; python -m pytest tests/e2e/test_browser.py -q -x'

Chromium is Debian's (``/usr/bin/chromium``), driven by Python Playwright; never ``playwright
install``. The page uses no STUN (``iceServers: []``), so nothing leaves loopback.
"""

from __future__ import annotations

import json
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
            # Many lanes from one address on a busy machine: no per-client limits, a fixed session cap.
            [*_myna_command(), "serve", "--host", "127.0.0.1", "--port", str(port), "--offer-rate", "0",
             "--max-sessions-per-client", "0", "--max-sessions", "32"],
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
STRATEGIES = ["piper", "piper-sentence", "piper-whole"]


def _lane(name: str) -> str:
    return f'#lanes .lane[data-lane="{name}"]'


def _race_done(page, timeout_ms: int = 90_000, after: str | None = None) -> None:
    """Wait until the race (a newer one than race id ``after``, if given) has finished."""
    page.wait_for_function("(after) => window.myna.race && window.myna.race.id !== after && !window.myna.race.running",
                           arg=after, timeout=timeout_ms)


def _race_id(page) -> str | None:
    return page.evaluate("() => window.myna.race ? window.myna.race.id : null")


def _fresh(page, url: str) -> None:
    """Open ``url`` with an empty race history (it persists in localStorage)."""
    page.goto(url)
    page.evaluate("localStorage.clear()")
    page.reload()


def _history(page) -> dict:
    rows = page.eval_on_selector_all(
        "#history tbody tr", "rows => rows.map(r => [r.dataset.lane, [...r.cells].map(c => c.textContent.trim())])")
    return {lane: cells for lane, cells in rows}


def test_page_speaks_and_shows_perceived_ttfa(page, server):
    """One lane (?lanes=piper): the race folds into a plain Speak, as the issue-2 page did."""
    pg, console = page
    _fresh(pg, f"{server}/?lanes=piper")
    _connected(pg)
    assert pg.input_value("#text").strip() == SENTENCE
    assert pg.input_value("#rate") == "30"
    assert pg.inner_text("#race").strip() == "Speak"
    assert pg.get_attribute(f'{_lane("piper-whole")} .lane-toggle', "aria-checked") == "false"

    pg.click("#race")
    _race_done(pg)
    lane = _lane("piper")
    assert pg.get_attribute(lane, "data-state") == "done"
    perceived = _number(pg, f"{lane} .ttfa")
    server_ttfa = _number(pg, f"{lane} .server")
    assert perceived is not None and server_ttfa is not None
    assert pg.inner_text(f"{lane} .ttfa").strip().isdigit()
    assert 0 < server_ttfa <= perceived < 30_000, (server_ttfa, perceived)  # a shared 2-core machine is slow at times

    words = pg.eval_on_selector_all(f"{lane} .captions .word", "els => els.map(e => e.textContent)")
    assert len(words) >= 6, words
    assert "table" in [w.strip(".,!").lower() for w in words]
    assert "wins" in pg.inner_text("#race-status")
    rows = _history(pg)
    assert list(rows) == ["piper"]
    # p50 and n: the history shows the same whole milliseconds as the lane (not Python's
    # round-half-even of the 0.1 ms data value, which differs from the page's at .5)
    assert rows["piper"][1] == pg.inner_text(f"{lane} .ttfa").strip() and rows["piper"][4] == "1"
    assert console.errors == []


def test_race_every_lane_finishes(page, server):
    """Issue 6: a race across the embedded voice's strategies, each lane its own session."""
    pg, console = page
    _fresh(pg, server)
    _connected(pg)
    # No DSM engine is loaded here: its lane says so and stays out of the race.
    dsm = _lane("dsm")
    assert pg.get_attribute(dsm, "data-state") == "missing"
    assert pg.get_attribute(f"{dsm} .lane-toggle", "aria-checked") == "false"
    assert pg.inner_text("#race").strip() == "Race 3 lanes"

    for run in (1, 2):
        previous = _race_id(pg)
        pg.click("#race")
        _race_done(pg, after=previous)
        for name in STRATEGIES:
            lane = _lane(name)
            assert pg.get_attribute(lane, "data-state") == "done", (run, name, pg.inner_text(lane))
            perceived = _number(pg, f"{lane} .ttfa")
            server_ttfa = _number(pg, f"{lane} .server")
            assert perceived is not None and server_ttfa is not None, (run, name)
            assert 0 < server_ttfa <= perceived < 30_000, (run, name, server_ttfa, perceived)
            assert _number(pg, f"{lane} .preroll") is not None
            words = pg.eval_on_selector_all(f"{lane} .captions .word", "els => els.map(e => e.textContent)")
            assert len(words) >= 6 and "table" in [w.lower() for w in words], (run, name, words)
        ranks = sorted(pg.get_attribute(_lane(n), "data-rank") for n in STRATEGIES)
        assert ranks == ["1", "2", "3"]
        assert pg.locator("#lanes .lane.winner").count() == 1
        rows = _history(pg)
        assert sorted(rows) == sorted(STRATEGIES)
        assert all(cells[4] == str(run) for cells in rows.values()), rows  # n per lane
        assert sum(int(cells[6]) for cells in rows.values()) == run  # one win per race

    with pg.expect_download() as download:
        pg.click("#export")
    exported = json.loads(Path(download.value.path()).read_text())
    assert len(exported["runs"]) == 2 and set(exported["summary"]) == set(STRATEGIES)
    assert all(run["start_spread_ms"] < 20 for run in exported["runs"])  # lanes start at the same instant
    for name, s in exported["summary"].items():
        assert s["n"] == 2 and s["perceived_ttfa_ms"]["p25"] <= s["perceived_ttfa_ms"]["p50"] <= s["perceived_ttfa_ms"]["p95"]

    ARTIFACTS.mkdir(exist_ok=True)
    pg.wait_for_timeout(300)
    pg.screenshot(path=str(ARTIFACTS / "race.png"), full_page=True)
    pg.set_viewport_size({"width": 380, "height": 800})
    pg.wait_for_timeout(300)
    pg.screenshot(path=str(ARTIFACTS / "race-phone.png"), full_page=True)
    assert pg.evaluate("document.documentElement.scrollWidth") <= 380  # nothing overflows the phone
    assert console.errors == []


def test_keyboard_enter_races_and_escape_stops(page, server):
    pg, console = page
    _fresh(pg, f"{server}/?lanes=piper,piper-whole")
    _connected(pg)
    long_text = " ".join(["This sentence keeps going so that there is time to interrupt it."] * 4)
    pg.fill("#text", long_text)
    pg.focus("#text")
    pg.keyboard.press("Enter")
    assert pg.input_value("#text") == long_text  # Enter raced instead of adding a line
    pg.wait_for_function(
        "() => document.querySelector('.lane[data-lane=\"piper\"] .server').dataset.value !== ''", timeout=30_000)
    pg.keyboard.press("Escape")
    _race_done(pg, 20_000)
    assert pg.get_attribute(_lane("piper"), "data-state") == "stopped"
    # The sessions stay usable after the barge-in.
    pg.click('[data-preset="short"]')
    assert pg.input_value("#text") == SENTENCE
    stopped = _race_id(pg)
    pg.click("#race")
    _race_done(pg, after=stopped)
    assert pg.get_attribute(_lane("piper"), "data-state") == "done"
    assert pg.get_attribute(_lane("piper-whole"), "data-state") == "done"
    assert console.errors == []


def test_unknown_engine_shows_engine_missing(browser, server):
    pg = browser.new_page()
    try:
        pg.goto(f"{server}/?engine=no-such-engine")
        pg.wait_for_selector('#status[data-state="missing"]', timeout=10_000)
        assert "Engine missing" in pg.inner_text("#status")
        assert pg.get_attribute(_lane("no-such-engine"), "data-state") == "missing"
        assert pg.is_disabled("#race")
    finally:
        pg.close()


def test_server_down_is_shown(browser, server):
    pg = browser.new_page()
    try:
        pg.goto(server)
        pg.wait_for_selector('#status[data-state="connected"]', timeout=20_000)
        pg.route("**/healthz", lambda route: route.abort())  # the worker stops answering
        pg.wait_for_selector('#status[data-state="down"]', timeout=10_000)
        assert "Server down" in pg.inner_text("#status")
        assert pg.is_disabled("#race")
        assert pg.get_attribute(_lane("piper"), "data-state") == "offline"
        pg.unroute("**/healthz")  # back: the lanes reconnect by themselves
        pg.wait_for_selector('#status[data-state="connected"]', timeout=30_000)
        assert pg.is_enabled("#race")
    finally:
        pg.close()
