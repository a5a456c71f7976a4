"""The Chromium client of ``myna bench ttfa --client chromium``: TTFA as a listener hears it.

Real Chromium (Debian's ``/usr/bin/chromium``, driven by Python Playwright with the flags the
browser tests use; never ``playwright install``) opens the page hook ``/static/bench.html``
(``web/myna/web/bench.js``): each session is the race page's own :js:`Lane` (``lane.js``) on one
shared AudioContext, and a turn's **render TTFA** is the Lane's measurement, first text chunk
sent → first audible sample rendered by WebAudio (the AudioWorklet onset tap,
``onset-worklet.js`` and ``onset.js``; error bound: true ≤ reading ≤ true + one 10 ms render
callback, see ``lane.js``). It includes the network, Chromium's jitter buffer, Opus decoding and
the WebRTC → WebAudio FIFO, but not the output device's latency.

The page is served by :class:`ChromiumHost`'s own loopback HTTP server (this checkout's
``myna.web`` files), which also relays each session's ``POST /api/offer`` to its server
(``/upstream/K/api/offer``): every system, a Myna worker, an older build given with
``--compare`` or the Pipecat peer, is then same-origin to the page, and no server needs CORS.
Only signaling passes the relay; media and the data channel go straight from Chromium to the
server over loopback host candidates (``iceServers: []``: no STUN).

Use::

    async with ChromiumHost() as host:
        client = await host.open(system)       # a SpeechClient
        result = await client.speak("Hi.", 30)  # a TurnResult: render TTFA in perceived_ttfa_ms
"""

from __future__ import annotations

import asyncio
import os
from importlib.resources import files

import numpy as np

from myna.rtc.client import TurnResult

CHROMIUM = "/usr/bin/chromium"
#: Chromium's flags here and in the browser tests (tests/e2e/): loopback peer connections,
#: autoplay without a gesture, no background traffic.
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
#: The page hook, under the host's /static/.
PAGE = "bench.html"
#: A peer that reports its turn's end before its transport sends the audio (the Pipecat peer):
#: how long after ``turn_done`` a turn with nothing heard yet waits for its onset (ms), as long as
#: the aiortc client waits (:meth:`myna.rtc.client.MynaClient._until_quiet`, ``silent_s``).
PEER_ONSET_GRACE_MS = 10_000
#: A Myna turn is final once its lane has been quiet this long after turn_done (lane.js's own rule).
QUIET_MS = 250


def unavailable() -> str | None:
    """Why the Chromium client cannot run here (None: it can)."""
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is not installed (apt-get install chromium)"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "Python Playwright is not installed (the dev extra: bash scripts/setup.sh dev)"
    return None


class ChromiumHost:
    """One headless Chromium with the page hook open, and the loopback server that serves it and
    relays signaling. An async context manager; :meth:`open` gives sessions.

    Raises (on enter):
        SystemExit: Chromium or Playwright missing (:func:`unavailable` says which).
    """

    def __init__(self):
        self._upstreams: list[str] = []
        self._runner = None
        self._playwright = None
        self._browser = None
        self._page = None
        self._errors: list[str] = []

    async def __aenter__(self) -> "ChromiumHost":
        why = unavailable()
        if why:
            raise SystemExit(f"bench ttfa --client chromium: {why}")
        from aiohttp import web
        from playwright.async_api import async_playwright

        app = web.Application()
        app.router.add_post("/upstream/{k}/api/offer", self._relay)
        app.router.add_static("/static/", path=str(files("myna.web")), show_index=False)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = self._runner.addresses[0][1]
        self._playwright = await async_playwright().start()
        self._browser = await self._playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                               args=CHROMIUM_ARGS)
        self._page = await self._browser.new_page()
        self._page.on("pageerror", lambda e: self._errors.append(str(e)))
        await self._page.goto(f"http://127.0.0.1:{port}/static/{PAGE}")
        await self._page.wait_for_function("() => window.mynaBench !== undefined", timeout=30_000)
        return self

    async def __aexit__(self, *exc) -> None:
        for closing in (self._browser and self._browser.close(), self._playwright and self._playwright.stop(),
                        self._runner and self._runner.cleanup()):
            if closing is not None:
                try:
                    await closing
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass

    @property
    def page_errors(self) -> list[str]:
        """Uncaught exceptions of the page so far."""
        return list(self._errors)

    async def _relay(self, request):
        """``POST /upstream/K/api/offer`` → the K-th server's ``/api/offer``, status and body as given."""
        import aiohttp
        from aiohttp import web

        try:
            upstream = self._upstreams[int(request.match_info["k"])]
        except (ValueError, IndexError):
            return web.json_response({"error": {"code": "unknown_upstream", "message": "no such server"}}, status=404)
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{upstream}/api/offer", data=await request.read(),
                                 headers={"Content-Type": "application/json"},
                                 timeout=aiohttp.ClientTimeout(total=60)) as resp:
                return web.Response(status=resp.status, body=await resp.read(), content_type="application/json")

    async def open(self, system) -> "ChromiumSession":
        """A connected session with ``system`` (a :class:`myna.bench.systems.System`) in the page.

        Raises:
            RuntimeError: the page could not connect (the server's error, as the page saw it).
        """
        if system.url not in self._upstreams:
            self._upstreams.append(system.url)
        base = f"/upstream/{self._upstreams.index(system.url)}"
        try:
            lane = await self._page.evaluate("([b, e, g]) => window.mynaBench.open(b, e, g)",
                                             [base, system.engine, PEER_ONSET_GRACE_MS if system.quiet_tail_s else None])
        except Exception as exc:  # playwright.Error: the page's exception, as text
            raise RuntimeError(f"Chromium could not open a session with {system.label} at {system.url}: {exc}") from None
        quiet_ms = max(QUIET_MS, 1000.0 * (system.quiet_tail_s or 0.0))
        return ChromiumSession(self._page, lane, quiet_ms)


class ChromiumSession:
    """One Lane in the page: a :class:`myna.bench.systems.SpeechClient`."""

    def __init__(self, page, lane: int, quiet_ms: float):
        self._page, self._lane, self._quiet_ms = page, lane, quiet_ms

    async def speak(self, text: str, tokens_per_s: float | None) -> TurnResult:
        """One turn; its render TTFA (ms, None if nothing audible was rendered) is the result's
        ``perceived_ttfa_ms``; ``arrival_ttfa_ms`` is None (Chromium does not expose packet
        arrival), ``pcm`` empty; ``events`` are ``first_audio``/``turn_done``/``error`` rebuilt
        from the page's turn record."""
        turn = await self._page.evaluate("([id, t, r, q]) => window.mynaBench.speak(id, t, r, q)",
                                         [self._lane, text, tokens_per_s or 0, self._quiet_ms])
        events = []
        if turn["server_ttfa_ms"] is not None:
            events.append({"type": "first_audio", "server_ttfa_ms": turn["server_ttfa_ms"],
                           "pre_roll_ms": turn["pre_roll_ms"]})
        if turn["status"] in ("done", "interrupted"):
            events.append({"type": "turn_done", "audio_ms": turn["audio_ms"], "underruns": turn["underruns"],
                           "gap_ms": turn["gap_ms"]})
        if turn["error"] or turn["status"] in ("error", "timeout"):
            events.append({"type": "error", **(turn["error"] or {"code": turn["status"]})})
        return TurnResult(f"chromium-{self._lane}", events, np.zeros(0, dtype=np.int16), turn["render_ttfa_ms"],
                          turn["server_ttfa_ms"], None)

    async def close(self) -> None:
        await self._page.evaluate("(id) => window.mynaBench.close(id)", self._lane)


#: The host :func:`open_session` uses (set by :func:`using`).
_current: ChromiumHost | None = None


def using(host: ChromiumHost | None) -> None:
    """Make ``host`` the one ``System(transport="chromium")`` sessions open in (None: none)."""
    global _current
    _current = host


async def open_session(system) -> ChromiumSession:
    """The ``chromium`` entry of :data:`myna.bench.systems.TRANSPORTS`.

    Raises:
        RuntimeError: no host is running (:func:`using`), or the page could not connect.
    """
    if _current is None:
        raise RuntimeError("no Chromium host is running (myna.bench.chromium.using)")
    return await _current.open(system)
