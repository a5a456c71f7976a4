"""``myna bench race``: the race page's own figures, from real Chromium, as JSON and a table.

The page (``web/myna/web``) is what most people judge Myna by; this benchmark reads its numbers
rather than re-measuring them: it starts ``myna serve`` on loopback (no per-client limits, the phrase
cache not warmed unless asked for; or uses ``--url``), opens ``/?lanes=…&preset=…&rate=…`` in Debian's
Chromium (driven by Playwright, the browser tests' flags: :data:`myna.bench.chromium.CHROMIUM_ARGS`),
waits until every lane has connected (the page's race button says so), presses "Race" ``--races``
times, each once the last has finished, and reports the page's own history
(``window.myna.historySummary()``): perceived TTFA per lane, first text chunk sent → first audible
sample rendered (p50, p25–p75, p95, n, wins), the server's TTFA, and for the first lane named,
its p50 ÷ each other lane's and in how many races it spoke first of the two.

Lanes are the page's: Myna's engines (``piper`` by clause, ``piper-sentence``, ``piper-whole``),
Pipecat's own SmallWebRTC + PiperTTSService on the same voice (``pipecat``, its default sentence
aggregation; ``pipecat-token``; they need ``bash scripts/setup.sh race``), and ``openai`` (any
``/v1/audio/speech``; ``--openai-url``, default the worker's own). The phrase cache is off in
the page unless ``--phrase-cache``. Run inside a loopback-only network namespace::

    unshare -rn sh -c 'ip link set lo up && .venv/bin/myna bench race --lanes piper,pipecat --preset long'

It needs Playwright and Debian's Chromium (``bash scripts/setup.sh dev``).
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.parse

PRESETS = ("short", "long", "numbers", "opening")


def add_parser(subparsers) -> None:
    """Register ``race`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("race", help="the race page's own TTFA figures per lane, from real Chromium",
                              description=__doc__.split("\n\n")[0] + " Needs Playwright and Debian's Chromium "
                                                                       "(bash scripts/setup.sh dev).")
    p.add_argument("--lanes", default="piper,piper-sentence,pipecat,pipecat-token",
                   help="the page's lanes, comma-separated; the first is compared with the others (default: %(default)s)")
    p.add_argument("--preset", choices=PRESETS, default="short", help="the page's preset reply (default: %(default)s)")
    p.add_argument("--text", help="a reply of your own instead of a preset")
    p.add_argument("--rate", type=int, default=30, help="tokens/s the page streams the text at; 0: sent whole (default: %(default)s)")
    p.add_argument("--races", type=int, default=10, help="races, one after another (default: %(default)s)")
    p.add_argument("--phrase-cache", action="store_true", help="tick the page's phrase cache box (default: off)")
    p.add_argument("--openai-url", help="the openai lane's base URL (default: the worker's own /v1)")
    p.add_argument("--url", help="an already running myna serve instead of starting one")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.add_argument("--chart", metavar="OUT.svg", help="write the page's own chart of the races (SVG)")
    p.add_argument("--screenshot", metavar="OUT.png", help="write a screenshot of the page after the last race")
    p.set_defaults(func=run)


def page_url(base: str, args) -> str:
    """The race page's address for these settings (the page's permalink parameters)."""
    query = {"lanes": args.lanes, "rate": str(args.rate)}
    if args.text:
        query["text"] = args.text
    else:
        query["preset"] = args.preset
    if args.phrase_cache:
        query["cache"] = "1"
    if args.openai_url:
        query["openai_url"] = args.openai_url
    return f"{base}/?{urllib.parse.urlencode(query)}"


def head_to_head(history: list[dict], first: str, other: str) -> tuple[int, int]:
    """In how many races ``first`` spoke before ``other`` (both heard), and in how many both were heard."""
    ahead = both = 0
    for run in history:
        a, b = run["lanes"].get(first, {}), run["lanes"].get(other, {})
        if a.get("perceived_ttfa_ms") is not None and b.get("perceived_ttfa_ms") is not None:
            both += 1
            ahead += a["perceived_ttfa_ms"] < b["perceived_ttfa_ms"]
    return ahead, both


def race_in_chromium(url: str, races: int, chart: str | None = None, screenshot: str | None = None) -> dict:
    """Open the page at ``url``, race ``races`` times, return ``{"summary", "history", "user_agent"}``.

    Raises:
        SystemExit: Chromium or Playwright is missing, or a lane never connected (the page's words).
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit("myna bench race needs Playwright (bash scripts/setup.sh dev)") from None
    from myna.bench.chromium import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(url)
            page.evaluate("localStorage.clear()")
            page.reload()
            try:  # every lane connected (or failed: it is then left out, and named on the page)
                page.wait_for_function("() => { const b = document.getElementById('race'); "
                                       "return !b.disabled && !b.textContent.startsWith('Waiting'); }", timeout=120_000)
            except Exception:
                raise SystemExit(f"the page's lanes did not connect: {page.inner_text('#status-text')}") from None
            for i in range(races):
                before = page.evaluate("() => window.myna.race ? window.myna.race.id : null")
                page.click("#race")
                page.wait_for_function("(id) => window.myna.race && window.myna.race.id !== id && !window.myna.race.running",
                                       arg=before, timeout=180_000)
                print(f"  race {i + 1}/{races}: {page.inner_text('#race-status')}", flush=True)
            result = {"summary": page.evaluate("() => window.myna.historySummary()"),
                      "history": page.evaluate("() => window.myna.history()"),
                      "user_agent": page.evaluate("() => navigator.userAgent")}
            if chart:
                with open(chart, "w") as f:
                    f.write(page.evaluate("() => window.myna.chartSVG()"))
            if screenshot:
                page.screenshot(path=screenshot, full_page=True)
            return result
        finally:
            browser.close()


def run(args) -> int:
    """Run the benchmark described by ``args`` (see :func:`add_parser`); print a table, write JSON."""
    from myna.bench.processes import Server

    lanes = [name.strip() for name in args.lanes.split(",") if name.strip()]
    server = None
    if args.url is None:
        warm = [] if args.phrase_cache else ["--phrase-cache-warm", "none"]  # (its common openings: only for the cache)
        server = Server(["myna.cli", "serve", *warm, "--max-sessions", "32", "--offer-rate", "0",
                         "--max-sessions-per-client", "0"], "worker")
    base = args.url or server.url
    url = page_url(base, args)
    print(f"myna bench race: {url}", flush=True)
    t0 = time.monotonic()
    try:
        result = race_in_chromium(url, args.races, args.chart, args.screenshot)
    finally:
        if server is not None:
            server.stop()
    summary, history = result["summary"], result["history"]
    first = lanes[0]
    rows = []
    for name in sorted(summary, key=lambda n: summary[n]["perceived_ttfa_ms"]["p50"] or float("inf")):
        s = summary[name]
        p = s["perceived_ttfa_ms"]
        row = {"lane": name, "n": s["n"], "p50": p["p50"], "p25": p["p25"], "p75": p["p75"], "p95": p["p95"],
               "server_p50": s["server_ttfa_ms_p50"], "wins": s["wins"]}
        if name != first and first in summary and summary[first]["perceived_ttfa_ms"]["p50"] and p["p50"]:
            row[f"p50_over_{first}"] = round(p["p50"] / summary[first]["perceived_ttfa_ms"]["p50"], 2)
            row[f"{first}_ahead"] = "{}/{}".format(*head_to_head(history, first, name))
        rows.append(row)
    f = lambda v: "—" if v is None else f"{v:.0f}"  # noqa: E731
    print(f"\nperceived TTFA in Chromium (first text chunk sent → first audible sample rendered), ms; "
          f"{len(history)} races, {args.rate or 'whole'} tokens/s, {time.monotonic() - t0:.0f} s")
    print(f"{'lane':<16}{'p50':>7}{'p25–p75':>13}{'p95':>7}{'server':>8}{'n':>4}{'wins':>6}   vs " + first)
    for r in rows:
        vs = f"{r[f'p50_over_{first}']:.2f}× its p50, {first} first in {r[f'{first}_ahead']}" if f"p50_over_{first}" in r else ""
        iqr = f"{f(r['p25'])}–{f(r['p75'])}" if r["p25"] is not None else "—"
        print(f"{r['lane']:<16}{f(r['p50']):>7}{iqr:>13}{f(r['p95']):>7}{f(r['server_p50']):>8}{r['n']:>4}{r['wins']:>6}   {vs}")
    missing = [name for name in lanes if name not in summary]
    if missing:
        print(f"not raced (not available or never connected): {', '.join(missing)}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"url": url, "races": len(history), "rate": args.rate, "lanes": rows,
                       "user_agent": result["user_agent"], "history": history,
                       "spread_ms_p50": statistics.median([r["start_spread_ms"] for r in history if r.get("start_spread_ms") is not None] or [0])},
                      out, indent=2)
    return 0
