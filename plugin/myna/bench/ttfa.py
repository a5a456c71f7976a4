"""``myna bench ttfa``: the headless latency race, time to first audio over WebRTC.

Every figure is measured the same way for every system: an aiortc client
(:mod:`myna.bench.systems`) streams a reply's text as LLM-like token chunks (or sends it whole)
and TTFA is read on the received audio (first text chunk sent → first audible
sample received), two ways (:mod:`myna.rtc.client`): **arrival** TTFA, when the packet carrying
the first audible sample arrives (decoded on arrival, no receive jitter buffer: the convention
of Coval's benchmarks; the headline figure, and the one ratios use), and **perceived** TTFA,
when aiortc's receiver hands that audio out after its jitter buffer has held 4 packets (what
this benchmark reported before; ~60–80 ms later). With ``--client chromium`` every cell is also measured in real Chromium
(:mod:`myna.bench.chromium`): the race page's own Lane and onset tap give **render** TTFA, first
text chunk sent → first audible sample rendered by WebAudio, what a listener hears; those turns
run in their own sessions right after the aiortc client's, and are reported beside the arrival and
server figures. Systems are Myna's engines on a worker this benchmark starts (or
``--server``), the same engines on other running workers (``--compare LABEL=URL``, e.g. an
older build, labelled ``LABEL:engine``), and with ``--peer pipecat`` Pipecat's own Piper
pipeline with sentence and with token aggregation (:mod:`myna.bench.pipecat_peer`).

Three parts, in one run:

1. **Cells.** For each concurrency level N, turn by turn, each system in a rotating order opens
   N sessions, warms each up with one unmeasured turn, has them speak the same reply at once
   (once per ``--token-rate``; 0: sent whole) and closes them. So systems are interleaved and
   share the host's load alike, and no system's idle sessions load the host while another is
   measured. With ``--keep-sessions`` each system keeps its N sessions for the level: every
   measured turn is then a later turn of one long session. Per cell (system × sessions × rate): arrival TTFA p50,
   IQR, p95; perceived TTFA p50; server TTFA p50; pre-roll max (``first_audio.pre_roll_ms``); gaps (each turn's
   ``turn_done.gap_ms.total``: p95 over turns, and the sum); underruns; RTF; with ``--wer``,
   Whisper WER of what was heard.
2. **Races** (``--races R``). The lanes of one worker start the same reply at the same instant,
   one session each, as the page's race does; the first to be heard wins. Wins per lane.
3. **Join** (``--join R``). On each worker, a session starts the reply while two others speak a
   long one (:data:`LONG_REPLY`: its first clause is 21 words without a comma), 2 s into theirs;
   against the same session alone, interleaved trial by trial.

4. **Phrase cache** (``--phrase-cache``). Each engine also runs on a second worker with the phrase
   cache on (``--phrase-cache-mb 64``, the default warm-up list), as lane ``ENGINE+cache``, in the
   same cells; the default replies are openings from the warm-up list. Per engine, sessions and
   rate: server TTFA on a hit, and perceived TTFA on a hit against a miss (the same text on the
   worker without the cache), with the hits and misses the cache worker counted (``/metrics``).

``--load N`` keeps N busy processes on the CPU for the whole run, so a loaded host is
reproducible. RTF is the worker's engine busy time (wall seconds with at least one synthesis
running) per second of audio it produced during a cell (compute ÷ audio; above 1 the engine
cannot keep up); only workers started by :mod:`myna.bench.worker` report it.

Beside it, the same text is synthesised whole in-process, the way a non-streaming pipeline
would: its synthesis time and the TTFA such a pipeline would have (the whole reply written
first, then synthesised).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np

from myna.bench.systems import System, engine_stats, open_clients
from myna.engines.build import SERVE_ENGINES

DEFAULT_TEXT = "Sure, I can help with that: your table for four is booked at seven tonight."
#: The replies of ``--phrase-cache`` (without ``--text``): openings from the default warm-up
#: list, the second followed by a sentence the list does not hold (synthesised while the
#: cached opening plays; cached after its first turn).
CACHE_TEXTS = ("Okay, let me check that for you.", "Thanks for calling! Your table for four is booked at seven tonight.")
#: Lane suffix of an engine on the worker with the phrase cache on.
CACHE_SUFFIX = "+cache"
#: The long replies of ``--join``: a first clause of 21 words without a comma, then more.
LONG_REPLY = ("I went through the whole order history this morning and the package you asked about left our "
              "warehouse on Monday evening, and it should reach you by Thursday, so somebody should be at home "
              "to sign for it when the courier rings the bell.")
#: Quiet received audio after a peer's end of turn, before the turn counts as heard (s).
PEER_QUIET_TAIL_S = 0.6
#: The TTFA figure tables, ratios, races and joins use (see the module docstring).
HEADLINE = "arrival_ttfa_ms"


def add_parser(subparsers) -> None:
    """Register ``ttfa`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("ttfa", help="headless latency race: perceived TTFA, gaps and RTF per system and concurrency",
                              description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--server", metavar="URL", help="a running worker (default: start one on 127.0.0.1); "
                   "RTF then shows as —: only a worker started here reports its engines' busy time")
    p.add_argument("--engines", "--engine", dest="engines", default=SERVE_ENGINES,
                   help="comma-separated engines (strategies) to race (default: %(default)s)")
    p.add_argument("--concurrency", default="1,4", help="comma-separated session counts (default: %(default)s)")
    p.add_argument("--turns", type=int, default=2, help="measured turns per session and cell (default: %(default)s)")
    p.add_argument("--token-rate", default="30",
                   help="tokens per second, 0 for all at once; comma-separated for one cell each (default: %(default)s)")
    p.add_argument("--text", action="append", help="a reply to speak (repeatable: turns cycle through them)")
    p.add_argument("--load", type=int, default=0, metavar="N", help="N busy CPU processes for the run (default: 0)")
    p.add_argument("--races", type=int, default=0, metavar="R", help="R headless races between each worker's lanes")
    p.add_argument("--join", type=int, default=0, metavar="R",
                   help="R trials of a session starting while two others speak long replies")
    p.add_argument("--client", choices=["aiortc", "chromium"], default="aiortc",
                   help="aiortc (default): arrival TTFA of the first audible packet; chromium: also, in the same "
                        "cells, render TTFA in real Chromium (/usr/bin/chromium via Playwright): first chunk sent → "
                        "first audible sample rendered by WebAudio, measured by the race page's onset tap; peers too")
    p.add_argument("--peer", choices=["pipecat"], action="append", default=[],
                   help="also measure a peer's own stack in the same run (pipecat: SmallWebRTC + PiperTTSService)")
    p.add_argument("--compare", action="append", default=[], metavar="LABEL=URL",
                   help="also measure the same engines on another running worker (repeatable)")
    p.add_argument("--wer", action="store_true", help="Whisper tiny.en WER per cell (needs the dev extra)")
    p.add_argument("--phrase-cache", action="store_true",
                   help="also run each engine on a worker with the phrase cache on (lanes ENGINE+cache): TTFA on a "
                        "hit against a miss; default replies: openings from the warm-up list")
    p.add_argument("--keep-sessions", action="store_true",
                   help="keep each system's sessions for the whole level (default: new sessions for every turn)")
    p.add_argument("--baseline-repeats", type=int, default=5,
                   help="whole-reply syntheses for the non-streaming baseline, 0 to skip (default: %(default)s)")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="plot TTFA and RTF against concurrency (needs matplotlib)")
    p.add_argument("--transport", choices=["webrtc", "livekit"], default="webrtc",
                   help="livekit: through a LiveKit room beside the direct path, same run (myna.bench.room)")
    from myna.bench.room import add_arguments as add_livekit_arguments

    add_livekit_arguments(p)
    p.set_defaults(func=run)


@dataclass
class Plan:
    """What one run measures (from the command line)."""

    engines: list[str]
    levels: list[int]
    turns: int
    rates: list[float]
    texts: list[str]
    load: int = 0
    races: int = 0
    join: int = 0
    wer: bool = False
    baseline_repeats: int = 0
    keep_sessions: bool = False
    phrase_cache: bool = False
    #: ``chromium``: each cell also measured in Chromium (render TTFA); ``aiortc``: not.
    client: str = "aiortc"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Plan":
        try:
            levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
            rates = [float(r) for r in str(args.token_rate).split(",") if r.strip()]
        except ValueError as exc:
            raise SystemExit(f"bench ttfa: {exc}") from None
        engines = [e.strip() for e in args.engines.split(",") if e.strip()]
        if not engines or not levels or not rates or min(levels) < 1 or args.turns < 1 or min(rates) < 0 or args.load < 0:
            raise SystemExit("bench ttfa: need engines, concurrency levels ≥ 1, --turns ≥ 1, rates ≥ 0 and --load ≥ 0")
        phrase_cache = getattr(args, "phrase_cache", False)
        texts = args.text or list(CACHE_TEXTS if phrase_cache else [DEFAULT_TEXT])
        return cls(engines, levels, args.turns, rates, texts, args.load, args.races, args.join,
                   args.wer, args.baseline_repeats, args.keep_sessions, phrase_cache,
                   getattr(args, "client", "aiortc"))


def run(args: argparse.Namespace) -> int:
    plan = Plan.from_args(args)
    if args.transport == "livekit":  # one text at one rate, through a room and direct
        if plan.client != "aiortc":
            raise SystemExit("bench ttfa: --client chromium measures the direct WebRTC path, not --transport livekit")
        from myna.bench import room as bench

        return bench.run(argparse.Namespace(**{**vars(args), "text": plan.texts[0], "token_rate": plan.rates[0]}))
    if args.plot:
        _require_matplotlib()
    if plan.client == "chromium":
        from myna.bench.chromium import unavailable

        if unavailable():
            raise SystemExit(f"bench ttfa --client chromium: {unavailable()}")
    compares = [_label_url(c) for c in args.compare]
    from myna.bench.processes import BusyLoad, Server
    from myna.rtc.ice import enable_loopback_candidates

    enable_loopback_candidates()  # our client talks to servers on loopback
    servers: list[Server] = []
    try:
        if args.server:
            url = args.server.rstrip("/")
        else:
            servers.append(Server(["myna.bench.worker", "--engine", ",".join(plan.engines)], "worker"))
            url = servers[-1].url
        systems = [System(e, url, e, server="myna") for e in plan.engines]
        if plan.phrase_cache:
            servers.append(Server(["myna.bench.worker", "--engine", ",".join(plan.engines), "--phrase-cache-mb",
                                   "64"], "worker with the phrase cache"))
            systems += [System(e + CACHE_SUFFIX, servers[-1].url, e, server="cache") for e in plan.engines]
        for label, other in compares:
            systems += [System(f"{label}:{e}", other, e, server=label) for e in plan.engines]
        for peer in args.peer:
            servers.append(Server([f"myna.bench.{peer}_peer"], f"{peer} peer"))
            systems += [System(f"{peer}-{mode}", servers[-1].url, mode, server=peer, peer=True,
                               quiet_tail_s=PEER_QUIET_TAIL_S) for mode in ("sentence", "token")]
        with BusyLoad(plan.load):
            result = asyncio.run(_measure(plan, systems))
    finally:
        for server in servers:
            server.stop()
    if plan.wer:
        _add_wer(result)
    if plan.baseline_repeats > 0 and any(e.startswith("piper") for e in plan.engines):
        result["whole_reply"] = asyncio.run(_whole_reply_baseline(plan))
    _drop_audio(result)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0


def _label_url(value: str) -> tuple[str, str]:
    label, sep, url = value.partition("=")
    if not sep:
        label, url = "compare", value
    if not url.startswith("http"):
        raise SystemExit(f"bench ttfa: --compare wants LABEL=URL, got {value!r}")
    return label, url.rstrip("/")


async def _measure(plan: Plan, systems: list[System]) -> dict:
    from myna.rtc.client import wait_until_ready

    for url in {s.url for s in systems}:
        await wait_until_ready(url, timeout=180.0)
    if plan.client == "chromium":
        from myna.bench import chromium

        async with chromium.ChromiumHost() as host:
            chromium.using(host)
            try:
                result = await _measure_ready(plan, systems)
            finally:
                chromium.using(None)
            result["chromium_page_errors"] = host.page_errors
        return result
    return await _measure_ready(plan, systems)


async def _measure_ready(plan: Plan, systems: list[System]) -> dict:
    t0 = time.monotonic()
    result = {
        "benchmark": "ttfa",
        "engines": plan.engines,
        "systems": [s.label for s in systems],
        "concurrency": plan.levels,
        "turns_per_session": plan.turns,
        "token_rates": plan.rates,
        "texts": plan.texts,
        "words": len(plan.texts[0].split()),
        "load": plan.load,
        "cpus": os.cpu_count(),
        "client": plan.client,
    }
    cached = next((s.url for s in systems if s.server == "cache"), None)
    counts = await _cache_counts(cached) if cached else None
    result["rows"] = await run_cells(plan, systems)
    if cached:
        after = await _cache_counts(cached)
        result["phrase_cache"] = {"hits": after["hits"] - counts["hits"], "misses": after["misses"] - counts["misses"],
                                  "cells": phrase_cache_cells(result["rows"])}
    racers = [s for s in systems if not s.peer]
    if plan.races:
        result["races"] = await run_races(racers, plan.races, plan.texts[0], plan.rates[0])
    if plan.join:
        result["join"] = await run_join(racers, plan.join, plan.texts[0], plan.rates[0])
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return result


async def _cache_counts(url: str) -> dict:
    """The phrase cache's ``hits`` and ``misses`` on a worker, from its ``/metrics``."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            text = await resp.text()
    counts = {"hits": 0.0, "misses": 0.0}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("myna_phrase_cache_hits_total", "myna_phrase_cache_misses_total"):
            counts[name.split("_")[3]] = float(value)
    return counts


def phrase_cache_cells(rows: list[dict]) -> list[dict]:
    """Per engine, sessions and rate: the ``+cache`` lane (hits) against the plain lane (misses,
    the same text): server TTFA p50 on a hit, arrival TTFA p50 on each, and hit ÷ miss."""
    plain = {(r["system"], r["sessions"], r["token_rate"]): r for r in rows}
    out = []
    for hit in (r for r in rows if r["system"].endswith(CACHE_SUFFIX)):
        miss = plain.get((hit["system"].removesuffix(CACHE_SUFFIX), hit["sessions"], hit["token_rate"]))
        if miss is None:
            continue
        h, m = hit[HEADLINE].get("p50"), miss[HEADLINE].get("p50")
        out.append({"engine": miss["system"], "sessions": hit["sessions"], "token_rate": hit["token_rate"],
                    "server_ttfa_hit_ms_p50": hit["server_ttfa_ms"].get("p50"),
                    "server_ttfa_miss_ms_p50": miss["server_ttfa_ms"].get("p50"),
                    "ttfa_hit_ms_p50": h, "ttfa_miss_ms_p50": m,
                    "hit_over_miss": round(h / m, 2) if h and m else None})
    return out


# -- what one turn left ---------------------------------------------------------------------
@dataclass
class Heard:
    """One turn as measured: the client's view and the worker's ``first_audio``/``turn_done``."""

    text: str
    perceived_ms: float | None
    server_ms: float | None
    pre_roll_ms: float | None
    gap_ms: float | None  # the turn's total (None from a system that does not report gaps)
    underruns: int | None
    audio_ms: float | None
    errors: int
    arrival_ms: float | None = None  # (None: silent, as perceived_ms)
    pcm: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def of(cls, result, text: str) -> "Heard":
        first = next((e for e in result.events if e["type"] == "first_audio"), {})
        done = next((e for e in result.events if e["type"] == "turn_done"), {})
        gaps = done.get("gap_ms")
        return cls(text, result.perceived_ttfa_ms, result.server_ttfa_ms, first.get("pre_roll_ms"),
                   gaps["total"] if isinstance(gaps, dict) else None, done.get("underruns"), done.get("audio_ms"),
                   sum(e["type"] == "error" for e in result.events), result.arrival_ttfa_ms, result.pcm)


def summarise(turns: list[Heard]) -> dict:
    """A cell's figures (see the module docstring)."""
    perceived = _known(t.perceived_ms for t in turns)
    gaps = _known(t.gap_ms for t in turns)
    pre_roll = _known(t.pre_roll_ms for t in turns)
    underruns = _known(t.underruns for t in turns)
    audio = _known(t.audio_ms for t in turns)
    return {
        "turns": len(turns),
        "arrival_ttfa_ms": _stats(_known(t.arrival_ms for t in turns)),
        "perceived_ttfa_ms": _stats(perceived),
        "server_ttfa_ms": _stats(_known(t.server_ms for t in turns)),
        "pre_roll_ms_max": round(max(pre_roll), 1) if pre_roll else None,
        "gap_ms_p95": round(float(np.percentile(gaps, 95)), 1) if gaps else None,
        "gap_ms_total": round(sum(gaps), 1) if gaps else None,
        "underruns": int(sum(underruns)) if underruns else None,
        "silent_turns": len(turns) - len(perceived),
        "errors": sum(t.errors for t in turns),
        "audio_ms_p50": round(float(np.median(audio)), 1) if audio else None,
    }


def summarise_render(turns: list[Heard]) -> dict:
    """A cell's Chromium turns (``--client chromium``): ``render_ttfa_ms`` (first chunk sent →
    first audible sample rendered by WebAudio; the client's ``perceived_ms``), the same turns'
    ``server_ttfa_ms``, silent turns (nothing audible rendered), errors, and the least
    render − server over turns that have both (ms; the render comes after the server sent)."""
    pairs = [(t.perceived_ms, t.server_ms) for t in turns if t.perceived_ms is not None and t.server_ms is not None]
    render = _known(t.perceived_ms for t in turns)
    return {
        "turns": len(turns),
        "render_ttfa_ms": _stats(render),
        "server_ttfa_ms": _stats(_known(t.server_ms for t in turns)),
        "render_minus_server_ms_min": round(min(r - s for r, s in pairs), 1) if pairs else None,
        "silent_turns": len(turns) - len(render),
        "errors": sum(t.errors for t in turns),
    }


def _known(values) -> list:
    return [v for v in values if v is not None]


# -- 1. cells ----------------------------------------------------------------------------
async def run_cells(plan: Plan, systems: list[System]) -> list[dict]:
    """Every system × concurrency level × rate, systems interleaved turn by turn."""
    rows: dict[tuple, dict] = {}
    # --client chromium: each system's twin in Chromium, measured right after it (own sessions).
    twins = {s: replace(s, transport="chromium") for s in systems} if plan.client == "chromium" else {}
    for n in plan.levels:
        kept = ({s: await _warm_sessions(s, n) for s in [*systems, *twins.values()]} if plan.keep_sessions else {})
        try:
            for i in range(plan.turns):
                text = plan.texts[i % len(plan.texts)]
                for rate in plan.rates:
                    k = i % len(systems)
                    for s in systems[k:] + systems[:k]:
                        row = rows.setdefault((s.label, n, rate), {"system": s.label, "engine": s.engine, "peer": s.peer,
                                                                   "sessions": n, "token_rate": rate, "heard": [],
                                                                   "busy_s": 0.0, "audio_s": 0.0})
                        await _turn(s, kept.get(s) or await _warm_sessions(s, n), text, rate, row, close=not kept)
                        if s in twins:
                            twin = twins[s]
                            browser = {"heard": row.setdefault("chromium_heard", []), "busy_s": 0.0, "audio_s": 0.0}
                            await _turn(twin, kept.get(twin) or await _warm_sessions(twin, n), text, rate, browser,
                                        close=not kept)
                    print(f"  turn {i + 1}/{plan.turns} ×{n} at {_rate(rate)} done", file=sys.stderr, flush=True)
        finally:
            await asyncio.gather(*(c.close() for cs in kept.values() for c in cs), return_exceptions=True)
    out = []
    for row in rows.values():
        busy, audio = row.pop("busy_s"), row.pop("audio_s")
        row.update(summarise(row["heard"]), rtf=round(busy / audio, 4) if audio > 0 else None)
        if "chromium_heard" in row:
            row["chromium"] = summarise_render(row["chromium_heard"])
        out.append(row)
    return out


async def _warm_sessions(s: System, n: int) -> list:
    """``n`` new sessions with ``s``, each past one unmeasured turn, so that no fresh-session
    cost (a new Pipecat voice's first inference) is measured."""
    clients = await open_clients(s, n)
    await asyncio.gather(*(c.speak("Hello.", None) for c in clients))
    return clients


async def _turn(s: System, clients: list, text: str, rate: float, row: dict, close: bool) -> None:
    """One measured turn: ``clients`` speak ``text`` at once; into ``row``; then ``close`` them.

    By default sessions live only for their turn: another system's idle sessions would load
    the host while this one is measured (a Pipecat session sends silence every 10 ms).
    ``--keep-sessions`` keeps them for the level instead, so that each measured turn is a later
    turn of a long session (what a rule that learns across turns does to them shows).
    """
    try:
        before = None if s.peer else await engine_stats(s.url)
        results = await asyncio.gather(*(c.speak(text, rate or None) for c in clients))
        after = None if s.peer else await engine_stats(s.url)
    finally:
        if close:
            await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    row["heard"] += [Heard.of(r, text) for r in results]
    if before and after and s.engine in before and s.engine in after:
        row["busy_s"] += after[s.engine]["busy_s"] - before[s.engine]["busy_s"]
        row["audio_s"] += after[s.engine]["audio_s"] - before[s.engine]["audio_s"]


# -- 2. races ----------------------------------------------------------------------------
async def run_races(systems: list[System], races: int, text: str, rate: float) -> list[dict]:
    """Per server: its lanes start ``text`` at the same instant, ``races`` times; wins per lane."""
    by_server: dict[str, list[System]] = {}
    for s in systems:
        by_server.setdefault(s.server, []).append(s)
    clients = {s: (await open_clients(s, 1))[0] for s in systems}
    heard: dict[System, list[Heard]] = {s: [] for s in systems}
    wins: dict[System, int] = {s: 0 for s in systems}
    try:
        for lanes in by_server.values():
            await asyncio.gather(*(clients[s].speak("Hello.", None) for s in lanes))  # warm-up
        for r in range(races):
            for lanes in by_server.values():
                results = await asyncio.gather(*(clients[s].speak(text, rate or None) for s in lanes))
                times = {}
                for s, result in zip(lanes, results):
                    heard[s].append(Heard.of(result, text))
                    if result.arrival_ttfa_ms is not None:
                        times[s] = result.arrival_ttfa_ms
                if times:
                    wins[min(times, key=times.get)] += 1
            print(f"  race {r + 1}/{races} done", file=sys.stderr, flush=True)
    finally:
        await asyncio.gather(*(c.close() for c in clients.values()), return_exceptions=True)
    return [{"server": server, "races": races, "token_rate": rate,
             "lanes": [{"system": s.label, "wins": wins[s], **summarise(heard[s])} for s in lanes]}
            for server, lanes in by_server.items()]


# -- 3. join -----------------------------------------------------------------------------
async def run_join(systems: list[System], trials: int, text: str, rate: float, lead_s: float = 2.0) -> list[dict]:
    """Per server, on its clause lane (the first engine): first audio of a session alone, and of
    the same session starting ``lead_s`` after two others began :data:`LONG_REPLY`."""
    out = []
    lanes = {}
    for s in systems:
        lanes.setdefault(s.server, s)
    for server, s in lanes.items():
        newcomer, *talkers = await open_clients(s, 3)
        alone, joined = [], []
        try:
            await asyncio.gather(*(c.speak("Hello.", None) for c in (newcomer, *talkers)))
            for t in range(trials):
                alone.append(Heard.of(await newcomer.speak(text, rate or None), text))
                talking = [asyncio.ensure_future(c.speak(LONG_REPLY, None)) for c in talkers]
                await asyncio.sleep(lead_s)
                joined.append(Heard.of(await newcomer.speak(text, rate or None), text))
                await asyncio.gather(*talking)
                print(f"  join {t + 1}/{trials} on {server} done", file=sys.stderr, flush=True)
        finally:
            await asyncio.gather(*(c.close() for c in (newcomer, *talkers)), return_exceptions=True)
        a, j = summarise(alone), summarise(joined)
        ratio = (j[HEADLINE]["p50"] / a[HEADLINE]["p50"] if a[HEADLINE].get("p50") and j[HEADLINE].get("p50") else None)
        out.append({"server": server, "system": s.label, "trials": trials, "alone": a, "joined": j,
                    "ratio_p50": None if ratio is None else round(ratio, 2)})
    return out


# -- WER, baseline -----------------------------------------------------------------------
def _add_wer(result: dict) -> None:
    """Whisper WER of each cell's turns against their text (after the run: transcribing is not
    measured and does not load the run)."""
    from myna.bench.wer import load_whisper, transcribe, word_error_rate

    model = load_whisper()
    for row in result["rows"]:
        turns = [t for t in row["heard"] if t.pcm is not None and len(t.pcm)]
        row["wer"] = (round(word_error_rate([t.text for t in turns], [transcribe(model, t.pcm) for t in turns]), 3)
                      if turns else None)


def _drop_audio(result: dict) -> None:
    for row in result["rows"]:
        row.pop("heard", None)
        row.pop("chromium_heard", None)


async def _whole_reply_baseline(plan: Plan) -> dict:
    from myna.rtc.client import token_chunks

    times = await _whole_reply(plan.texts[0], plan.baseline_repeats)
    rate = plan.rates[0]
    text_ms = 1000.0 * (len(token_chunks(plan.texts[0])) - 1) / rate if rate else 0.0
    return {"synthesis_ms": _stats(times), "text_stream_ms": round(text_ms, 1),
            "ttfa_ms_p50": round(text_ms + float(np.median(times)), 1)}


async def _whole_reply(text: str, repeats: int) -> list[float]:
    """Milliseconds to synthesise ``text`` in one piece, in-process (one synthesis thread)."""
    from myna.engines.piper import PiperEngine

    engine = PiperEngine(workers=1)
    await engine.start()
    times = []
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            await engine.scheduler.run(engine.synthesize_unit, text)
            times.append(1000.0 * (time.perf_counter() - t0))
    finally:
        await engine.close()
    return times


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    p25, p50, p75, p95 = np.percentile(values, [25, 50, 75, 95])
    return {"n": len(values), "p50": round(float(p50), 1), "p25": round(float(p25), 1), "p75": round(float(p75), 1),
            "iqr": round(float(p75 - p25), 1), "p95": round(float(p95), 1)}


# -- the report --------------------------------------------------------------------------
def _fmt(value, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _rate(rate: float) -> str:
    return f"{rate:g} tok/s" if rate else "whole"


def format_table(result: dict) -> str:
    """Cells as a serving table, then ratios, races, join and the non-streaming baseline."""
    lines = [
        f"TTFA over WebRTC on loopback: {result['words']}-word reply, {result['turns_per_session']} measured "
        f"turn(s) per session and cell, {result['cpus']} CPUs, --load {result['load']}",
        f"{'system':<22} {'sess':>4} {'text':>10} {'TTFA p50':>9} {'IQR (p25–p75)':>17} {'p95':>7} {'jb p50':>7} {'server':>7} "
        f"{'pre-roll':>8} {'gap p95':>8} {'gap sum':>8} {'under':>5} {'RTF':>6} {'WER':>5} {'n':>3} {'silent':>6}",
    ]
    for row in result["rows"]:
        p = row[HEADLINE]
        head = f"{row['system']:<22} {row['sessions']:>4} {_rate(row['token_rate']):>10}"
        tail = (f"{_fmt(row['pre_roll_ms_max']):>8} {_fmt(row['gap_ms_p95']):>8} {_fmt(row['gap_ms_total']):>8} "
                f"{_fmt(row['underruns']):>5} {_fmt(row['rtf'], 3):>6} {_fmt(row.get('wer'), 3):>5} {p['n']:>3} "
                f"{row['silent_turns']:>6}")
        if not p["n"]:
            lines.append(f"{head} {'no audio':>9} {'':>17} {'':>7} {'':>7} {'':>7} {tail}")
            continue
        iqr = f"{p['iqr']:.0f} ({p['p25']:.0f}–{p['p75']:.0f})"
        lines.append(f"{head} {p['p50']:>6.0f} ms {iqr:>17} {p['p95']:>7.0f} "
                     f"{_fmt(row['perceived_ttfa_ms'].get('p50')):>7} {_fmt(row['server_ttfa_ms'].get('p50')):>7} {tail}")
    lines.append("TTFA: first text chunk sent → arrival of the packet with the first audible sample (ms; decoded on "
                 "arrival, no jitter buffer); jb: the same sample out of aiortc's jitter buffer (4 packets); server: the worker's first_audio "
                 "(ms); pre-roll: max first_audio.pre_roll_ms; gap: each turn's total gap_ms (p95 over turns, sum); "
                 "under: underruns; RTF: engine busy s per audio s (lower is better); WER: Whisper tiny.en.")
    lines += _render_lines(result)
    if any(row["rtf"] is None and not row.get("peer") for row in result["rows"]):
        lines.append("RTF —: not measured; only a worker this benchmark starts itself reports its engines' busy "
                     "time (not one given with --server or --compare).")
    lines += _ratios(result)
    for race in result.get("races", []):
        wins = ", ".join(f"{lane['system']} {lane['wins']}" for lane in race["lanes"])
        lines.append(f"Races on {race['server']} ({race['races']} × {_rate(race['token_rate'])}): first heard: {wins}")
        for lane in race["lanes"]:
            p = lane[HEADLINE]
            lines.append(f"  {lane['system']:<22} TTFA p50 {_fmt(p.get('p50'))} ms, p95 {_fmt(p.get('p95'))} ms, "
                         f"pre-roll max {_fmt(lane['pre_roll_ms_max'])} ms, gap sum {_fmt(lane['gap_ms_total'])} ms, "
                         f"underruns {_fmt(lane['underruns'])}")
    for join in result.get("join", []):
        a, j = join["alone"][HEADLINE], join["joined"][HEADLINE]
        lines.append(f"Join on {join['server']} ({join['system']}, {join['trials']} trials): a session starting while two "
                     f"others speak long replies: TTFA p50 {_fmt(j.get('p50'))} ms against {_fmt(a.get('p50'))} ms alone "
                     f"(× {_fmt(join['ratio_p50'], 2)}); pre-roll max {_fmt(join['joined']['pre_roll_ms_max'])} ms")
    cache = result.get("phrase_cache")
    if cache:
        lines.append(f"Phrase cache: {cache['hits']:.0f} hits, {cache['misses']:.0f} misses on the cache worker "
                     "(warm-up turns included). Targets: server TTFA on a hit ≤ 20 ms p50; arrival TTFA hit ≤ 0.5 × miss.")
        for c in cache["cells"]:
            lines.append(f"  {c['engine']:<16} ×{c['sessions']} {_rate(c['token_rate']):>10}: server TTFA hit "
                         f"{_fmt(c['server_ttfa_hit_ms_p50'])} ms (miss {_fmt(c['server_ttfa_miss_ms_p50'])} ms); "
                         f"TTFA hit {_fmt(c['ttfa_hit_ms_p50'])} ms / miss {_fmt(c['ttfa_miss_ms_p50'])} ms "
                         f"= × {_fmt(c['hit_over_miss'], 2)}")
    w = result.get("whole_reply")
    if w and w["synthesis_ms"].get("n"):
        lines.append(f"Whole-reply synthesis of the first text in-process: p50 {w['synthesis_ms']['p50']:.0f} ms "
                     f"(n={w['synthesis_ms']['n']}); a non-streaming pipeline's TTFA ≈ {w['ttfa_ms_p50']:.0f} ms "
                     f"(text written, then synthesised).")
    return "\n".join(lines)


def _render_lines(result: dict) -> list[str]:
    """``--client chromium``: per cell, render TTFA in Chromium beside the server figure (of the
    same Chromium turns) and the aiortc client's arrival figure."""
    rows = [r for r in result["rows"] if "chromium" in r]
    if not rows:
        return []
    lines = ["In Chromium (--client chromium; the race page's Lane and onset tap, own sessions after the aiortc ones):",
             f"{'system':<22} {'sess':>4} {'text':>10} {'render p50':>10} {'p95':>7} {'server':>7} {'arrival':>7} "
             f"{'n':>3} {'silent':>6} {'errors':>6}"]
    for row in rows:
        c = row["chromium"]
        r = c["render_ttfa_ms"]
        lines.append(f"{row['system']:<22} {row['sessions']:>4} {_rate(row['token_rate']):>10} "
                     f"{(_fmt(r.get('p50')) + ' ms') if r['n'] else 'no audio':>10} {_fmt(r.get('p95')):>7} "
                     f"{_fmt(c['server_ttfa_ms'].get('p50')):>7} {_fmt(row[HEADLINE].get('p50')):>7} {r['n']:>3} "
                     f"{c['silent_turns']:>6} {c['errors']:>6}")
    lines.append("render: first text chunk sent → first audible sample rendered by WebAudio in Chromium (ms; true ≤ "
                 "reading ≤ true + 10 ms); server: first_audio of the same Chromium turns; arrival: the aiortc "
                 "client's TTFA p50 of the cell.")
    return lines


def _ratios(result: dict) -> list[str]:
    """p50 at N sessions / at the fewest, per system and rate; each Myna system / each peer."""
    cells = {(r["system"], r["sessions"], r["token_rate"]): r[HEADLINE].get("p50") for r in result["rows"]}
    levels, lines = result["concurrency"], []
    for system in result["systems"]:
        for rate in result["token_rates"]:
            base = cells.get((system, levels[0], rate))
            parts = [f"{n}: × {cells[(system, n, rate)] / base:.2f}" for n in levels[1:]
                     if base and cells.get((system, n, rate))]
            if parts:
                lines.append(f"  {system:<22} {_rate(rate):>10}: p50 against {levels[0]} session(s): {', '.join(parts)}")
    peers = [r for r in result["rows"] if r["peer"]]
    for row in (r for r in result["rows"] if not r["peer"]):
        ours = row[HEADLINE].get("p50")
        parts = [f"/ {p['system']} = {ours / p[HEADLINE]['p50']:.2f}" for p in peers
                 if ours and p[HEADLINE].get("p50") and (p["sessions"], p["token_rate"]) == (row["sessions"], row["token_rate"])]
        if parts:
            lines.append(f"  {row['system']:<22} ×{row['sessions']} {_rate(row['token_rate'])}: TTFA p50 {' '.join(parts)}")
    return lines


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("bench ttfa: --plot needs matplotlib: run `bash scripts/setup.sh bench`") from None


def plot(result: dict, path: str) -> None:
    """Two panels against concurrency, at the first token rate: perceived TTFA (p50, IQR band,
    p95) and RTF, one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rate = result["token_rates"][0]
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for system in result["systems"]:
        rows = [r for r in result["rows"] if r["system"] == system and r["token_rate"] == rate and r["perceived_ttfa_ms"].get("n")]
        if not rows:
            continue
        x = [r["sessions"] for r in rows]
        line, = ax_t.plot(x, [r["perceived_ttfa_ms"]["p50"] for r in rows], marker="o", label=system)
        ax_t.fill_between(x, [r["perceived_ttfa_ms"]["p25"] for r in rows], [r["perceived_ttfa_ms"]["p75"] for r in rows],
                          color=line.get_color(), alpha=0.18, linewidth=0)
        ax_t.plot(x, [r["perceived_ttfa_ms"]["p95"] for r in rows], linestyle=":", color=line.get_color())
        rtf = [(r["sessions"], r["rtf"]) for r in rows if r["rtf"] is not None]
        if rtf:
            ax_r.plot([a for a, _ in rtf], [b for _, b in rtf], marker="o", color=line.get_color(), label=system)
    w = result.get("whole_reply")
    if w:
        ax_t.axhline(w["ttfa_ms_p50"], color="grey", linestyle="--", linewidth=1, label="non-streaming (whole reply)")
    ax_t.set(xlabel="concurrent sessions", ylabel="perceived TTFA (ms)", title="First audio: p50, IQR band, p95 dotted")
    ax_r.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax_r.set(xlabel="concurrent sessions", ylabel="RTF (compute s / audio s)", title="Real-time factor (lower is better)")
    for ax in (ax_t, ax_r):
        ax.set_xscale("log", base=2)
        ax.set_xticks(result["concurrency"], [str(c) for c in result["concurrency"]])
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_t.legend(fontsize=8)
    fig.suptitle(f"myna bench ttfa · {result['words']} words at {_rate(rate)} · {result['cpus']} CPUs · "
                 f"--load {result['load']}", fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)
