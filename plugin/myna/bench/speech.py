"""``myna bench speech``: time to the first audio byte, OpenAI speech endpoint vs WebSocket.

One worker (``myna.bench.worker``: the phrase cache off, so both doors synthesise), the same
text sent whole to both doors, alternating, the same number of times:

- **speech**: ``POST /v1/audio/speech`` (``response_format`` ``pcm``: 24 kHz s16le) on a kept-alive
  HTTP connection; from sending the request to the first byte of the body;
- **websocket**: ``/v1/tts/stream`` with ``config.sample_rate`` 24000, a new connection each round
  (a new session, as each speech request is; a turn queued behind a long one on the same
  connection would wait for the synthesis horizon), connected and configured beforehand; from
  sending the ``text`` message (the whole reply) and ``end_turn`` to the first binary message.

It also reports, for the speech endpoint, when the last byte came (synthesis of the whole reply
has ended by then: the output is unpaced) and how much audio there was. Run it in a loopback-only
namespace: ``unshare -n sh -c 'ip link set lo up; myna bench speech'``.

``--file``: whole files beside paced sessions. A speech request has no listener through Myna
(the client keeps the file), so it is synthesised ahead of real time in what the paced sessions
leave (:mod:`myna.engines.scheduler`, ahead jobs). For each load in ``--loads`` (0, 1, 2: paced
WebRTC sessions, :class:`myna.rtc.client.MynaClient`, each warmed up with one unmeasured turn),
``--rounds`` times:

- **alone**: the paced sessions speak :data:`PACED_REPLY` at once (sent whole): arrival TTFA
  (first text sent → arrival of the packet with the first audible sample), underruns and gaps
  (each turn's ``turn_done``);
- **beside**: a whole-file request (:data:`FILE_REPLY`, ~800 characters of agent prose, ~38 s of
  audio, ``response_format`` ``--format``, mp3 by default) starts, and once its first byte has
  come the same sessions speak the same reply: their TTFA, underruns and gaps, and the file's
  total time (request sent → last byte).

Beside it, ``myna say``'s time for the file's text on this machine: the same engine built as
``myna serve`` builds it, in this process, synthesising as fast as it can (the worker idle
meanwhile). Reported per load: file time ÷ say time (target ≤ 3), TTFA p50 beside ÷ alone
(target ≤ 1.2), and underruns/gaps beside (target none).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

#: Three sentences, sent whole.
REPLY = ("The weather today is sunny with a light breeze from the west. "
         "Please remember to bring your notebook to the meeting tomorrow morning. "
         "Our train leaves at seven, so we should pack tonight.")
#: ``--file``'s whole file: ~800 characters of agent prose (~38 s of Piper's audio).
FILE_REPLY = ("Thanks for holding while I looked into this. Your order left our warehouse on Monday evening "
              "and is now with the courier, who expects to deliver it on Thursday between nine in the morning "
              "and one in the afternoon. Someone will need to sign for it, so if nobody is at home that day "
              "you can choose a neighbour or a collection point from the link in your confirmation email. "
              "The replacement charger you asked about is in the same parcel, and the refund for the damaged "
              "one has been approved; it usually reaches your card within three to five working days. "
              "I have also added a note to your account so that the next agent you speak to can see all of "
              "this at a glance. Is there anything else I can help you with today, or would you like me to "
              "send a summary of our conversation to your email address?")
#: ``--file``'s paced sessions' reply, sent whole.
PACED_REPLY = "Sure, I can help with that: your table for four is booked at seven tonight."


def add_parser(subparsers) -> None:
    """Register ``speech`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("speech", help="time to first audio byte: the OpenAI speech endpoint vs the WebSocket",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=None, help="requests per door (default: 20; --file: 3 per load)")
    p.add_argument("--engine", default="piper", help="engine (default: %(default)s)")
    p.add_argument("--text", default=REPLY, help="the reply, sent whole (default: three sentences)")
    p.add_argument("--url", help="an already running worker instead of starting one")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.add_argument("--file", action="store_true",
                   help="whole files beside paced WebRTC sessions (total time vs myna say; the sessions' TTFA "
                        "and underruns alone vs beside a file) instead of first-byte times")
    p.add_argument("--loads", default="0,1,2", help="--file: paced sessions beside the file (default: %(default)s)")
    p.add_argument("--format", default="mp3", help="--file: the file's response_format (default: %(default)s)")
    p.add_argument("--file-text", default=FILE_REPLY, help="--file: the file's text (default: ~800 characters)")
    p.set_defaults(func=run)


async def speech_once(http, url: str, engine: str, text: str) -> tuple[float, float, int]:
    """One ``POST /v1/audio/speech`` (pcm): (first byte s, last byte s, bytes).

    Raises:
        RuntimeError: the request was refused.
    """
    first, last, data = await file_once(http, url, engine, text, "pcm")
    return first, last, len(data)


async def websocket_once(ws, turn_id: str, text: str) -> float:
    """One turn on an open ``/v1/tts/stream`` connection: first binary message (s).

    Raises:
        RuntimeError: the turn reported an error.
    """
    import aiohttp

    t0 = time.perf_counter()
    await ws.send_json({"type": "text", "turn_id": turn_id, "text": text})
    await ws.send_json({"type": "end_turn", "turn_id": turn_id})
    first = None
    async with asyncio.timeout(60):
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY and first is None:
                first = time.perf_counter() - t0
            elif msg.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(msg.data)
                if event["type"] == "error":
                    raise RuntimeError(f"websocket turn failed: {event}")
                if event["type"] == "turn_done" and event["turn_id"] == turn_id:
                    return first
    raise RuntimeError("the websocket closed before turn_done")


async def measure(url: str, engine: str, text: str, rounds: int) -> dict:
    """Alternate the two doors ``rounds`` times each; the figures in ms."""
    import aiohttp

    speech, speech_last, ws_first, audio_s = [], [], [], []
    ws_url = url.replace("http", "ws", 1) + "/v1/tts/stream"
    async with aiohttp.ClientSession() as http:

        async def websocket_round(turn_id: str, text: str) -> float:
            async with http.ws_connect(ws_url) as ws:  # a new session, as each speech request is
                await ws.receive_json()  # ready
                await ws.send_json({"type": "config", "engine": engine, "sample_rate": 24_000})
                await ws.receive_json()
                return await websocket_once(ws, turn_id, text)

        await speech_once(http, url, engine, "Warm up.")  # the HTTP connection, kept alive
        await websocket_round("warm", "Warm up.")
        for i in range(rounds):
            for door in ((0, 1) if i % 2 == 0 else (1, 0)):
                if door == 0:
                    first, last, n = await speech_once(http, url, engine, text)
                    speech.append(1000 * first)
                    speech_last.append(1000 * last)
                    audio_s.append(n / 2 / 24_000)
                else:
                    ws_first.append(1000 * await websocket_round(f"t{i}", text))
    diffs = [s - w for s, w in zip(speech, ws_first)]
    return {"rounds": rounds, "engine": engine, "text_chars": len(text),
            "speech_first_byte_ms": _summary(speech), "websocket_first_byte_ms": _summary(ws_first),
            "speech_minus_websocket_ms": _summary(diffs), "speech_last_byte_ms": _summary(speech_last),
            "audio_s": statistics.median(audio_s)}


def _summary(xs: list[float]) -> dict:
    ordered = sorted(xs)
    return {"median": statistics.median(ordered), "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
            "min": ordered[0], "max": ordered[-1]}


def run(args) -> int:
    """``myna bench speech``: prints a table (and writes ``--json``)."""
    if args.rounds is None:
        args.rounds = 3 if args.file else 20
    if args.file:
        return run_file(args)
    from myna.bench.processes import Server

    server = None if args.url else Server(["myna.bench.worker", "--engine", args.engine], "worker")
    try:
        figures = asyncio.run(measure(args.url or server.url, args.engine, args.text, args.rounds))
    finally:
        if server is not None:
            server.stop()
    print(f"{args.engine}, {figures['text_chars']} characters sent whole, {args.rounds} rounds per door, "
          f"{figures['audio_s']:.1f} s of audio")
    print(f"{'ms':<34}{'median':>8}{'p95':>8}{'min':>8}{'max':>8}")
    for key, label in (("speech_first_byte_ms", "speech endpoint, first byte"),
                       ("websocket_first_byte_ms", "websocket, first binary message"),
                       ("speech_minus_websocket_ms", "speech - websocket (same round)"),
                       ("speech_last_byte_ms", "speech endpoint, last byte")):
        s = figures[key]
        print(f"{label:<34}{s['median']:>8.1f}{s['p95']:>8.1f}{s['min']:>8.1f}{s['max']:>8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0



# -- --file: whole files beside paced sessions ------------------------------------------------
async def file_once(http, url: str, engine: str, text: str, fmt: str,
                    first_byte: asyncio.Event | None = None) -> tuple[float, float, int]:
    """One whole-file ``POST /v1/audio/speech``: (first byte s, last byte s, bytes); sets
    ``first_byte`` when the first byte comes.

    Raises:
        RuntimeError: the request was refused.
    """
    body = {"model": engine, "voice": "alloy", "input": text, "response_format": fmt}
    t0 = time.perf_counter()
    first, data = None, bytearray()
    async with http.post(f"{url}/v1/audio/speech", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"speech refused: {resp.status} {await resp.text()}")
        async for chunk in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - t0
                if first_byte is not None:
                    first_byte.set()
            data += chunk
    return first, time.perf_counter() - t0, bytes(data)


def audio_seconds(data: bytes) -> float:
    """Duration of an encoded file (s), decoded by PyAV."""
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        return sum(frame.samples for frame in container.decode(stream)) / stream.rate


async def say_seconds(engine_name: str, text: str, repeats: int) -> list[float]:
    """``myna say``'s synthesis time for ``text`` (s, one per repeat): the engine built as
    ``myna serve`` builds it, one stream with no group (nobody listens in real time), from
    the text to its last audio, as ``myna say`` times it."""
    from myna.engines import AudioChunk
    from myna.engines.build import EngineOptions, build_engines

    engines = build_engines(EngineOptions(engines=engine_name))
    engine = engines[engines.default]
    times = []
    try:
        await engines.start()
        for _ in range(repeats):
            t0 = time.monotonic()
            stream = engine.stream(engines.voice_for(engine.name))
            stream.push_text(text)
            stream.end_input()
            async for item in stream:
                if isinstance(item, AudioChunk):
                    pass
            times.append(time.monotonic() - t0)
    finally:
        await engines.close()
    return times


def _turn_figures(result) -> dict:
    """Arrival TTFA (ms), underruns and gaps of one paced turn (a :class:`myna.rtc.client.TurnResult`)."""
    done = next((e for e in result.events if e.get("type") == "turn_done"), {})
    return {"ttfa_ms": result.arrival_ttfa_ms, "underruns": int(done.get("underruns", 0)),
            "gaps": int((done.get("gap_ms") or {}).get("count", 0))}


def _paced_summary(turns: list[dict]) -> dict | None:
    if not turns:
        return None
    ttfa = sorted(t["ttfa_ms"] for t in turns if t["ttfa_ms"] is not None)
    return {"turns": len(turns), "ttfa_ms_p50": round(statistics.median(ttfa), 1) if ttfa else None,
            "ttfa_ms_max": round(ttfa[-1], 1) if ttfa else None,
            "underruns": sum(t["underruns"] for t in turns), "gaps": sum(t["gaps"] for t in turns)}


async def measure_file(url: str, engine: str, text: str, fmt: str, loads: list[int], rounds: int,
                       say_s: float) -> dict:
    """Whole files at each load (see the module docstring); times in s, TTFA in ms."""
    import aiohttp

    from myna.bench.systems import System, open_clients

    rows, audio_s = [], None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        await file_once(http, url, engine, "Warm up.", fmt)
        for load in loads:
            clients = await open_clients(System(engine, url, engine, "worker"), load) if load else []
            try:
                await asyncio.gather(*(c.speak("Warm up.", None) for c in clients))
                alone, beside, files = [], [], []
                for _ in range(rounds):
                    if clients:
                        alone += [_turn_figures(r) for r in await asyncio.gather(*(c.speak(PACED_REPLY, None)
                                                                                   for c in clients))]
                    first_byte = asyncio.Event()
                    download = asyncio.ensure_future(file_once(http, url, engine, text, fmt, first_byte))
                    await asyncio.wait([download, asyncio.ensure_future(first_byte.wait())],
                                       return_when=asyncio.FIRST_COMPLETED)
                    if clients:
                        beside += [_turn_figures(r) for r in await asyncio.gather(*(c.speak(PACED_REPLY, None)
                                                                                    for c in clients))]
                    first, last, data = await download
                    files.append(last)
                    if audio_s is None:
                        audio_s = audio_seconds(data)
            finally:
                await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
            file_s = statistics.median(files)
            row = {"paced_sessions": load, "file_s": round(file_s, 3), "file_s_max": round(max(files), 3),
                   "file_over_say": round(file_s / say_s, 2),
                   "paced_alone": _paced_summary(alone), "paced_beside": _paced_summary(beside)}
            if alone and beside and row["paced_alone"]["ttfa_ms_p50"] and row["paced_beside"]["ttfa_ms_p50"]:
                row["ttfa_beside_over_alone"] = round(row["paced_beside"]["ttfa_ms_p50"] / row["paced_alone"]["ttfa_ms_p50"], 2)
            rows.append(row)
            _progress(f"load {load}: file {file_s:.2f} s ({row['file_over_say']}x say)")
    return {"engine": engine, "format": fmt, "text_chars": len(text), "audio_s": round(audio_s or 0.0, 2),
            "say_s": round(say_s, 3), "rounds": rounds, "loads": rows}


def _progress(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


def format_file_table(figures: dict) -> str:
    """``--file``'s table."""
    lines = [f"{figures['engine']}, a {figures['text_chars']}-character reply as one {figures['format']} file "
             f"({figures['audio_s']:.1f} s of audio), {figures['rounds']} rounds per load; "
             f"myna say: {figures['say_s']:.2f} s",
             f"{'paced':>5} {'file s':>8} {'/ say':>6} {'TTFA alone':>11} {'beside':>8} {'ratio':>6} "
             f"{'underruns alone/beside':>23} {'gaps alone/beside':>18}"]

    def get(summary, key):
        return "-" if summary is None or summary.get(key) is None else summary[key]

    for row in figures["loads"]:
        a, b = row["paced_alone"], row["paced_beside"]
        lines.append(f"{row['paced_sessions']:>5} {row['file_s']:>8.2f} {row['file_over_say']:>6.2f} "
                     f"{str(get(a, 'ttfa_ms_p50')):>11} {str(get(b, 'ttfa_ms_p50')):>8} "
                     f"{str(row.get('ttfa_beside_over_alone', '-')):>6} "
                     f"{str(get(a, 'underruns')) + '/' + str(get(b, 'underruns')):>23} "
                     f"{str(get(a, 'gaps')) + '/' + str(get(b, 'gaps')):>18}")
    lines.append("TTFA: arrival p50 (ms) of the paced WebRTC sessions; targets: file ≤ 3× say, TTFA beside ≤ 1.2× "
                 "alone, no underrun beside")
    return "\n".join(lines)


def run_file(args) -> int:
    """``myna bench speech --file``: prints a table and the JSON (and writes ``--json``)."""
    from myna.bench.processes import Server
    from myna.rtc.ice import enable_loopback_candidates

    enable_loopback_candidates()  # our WebRTC clients talk to the worker on loopback
    loads = [int(x) for x in args.loads.split(",") if x.strip()]
    say = asyncio.run(say_seconds(args.engine, args.file_text, max(1, min(args.rounds, 3))))
    say_s = statistics.median(say)
    _progress(f"myna say: {say_s:.2f} s")
    server = None if args.url else Server(["myna.bench.worker", "--engine", args.engine], "worker")
    try:
        figures = asyncio.run(measure_file(args.url or server.url, args.engine, args.file_text, args.format, loads,
                                           args.rounds, say_s))
    finally:
        if server is not None:
            server.stop()
    figures["say_s_all"] = [round(x, 3) for x in say]
    print(json.dumps(figures, indent=2))
    print(format_file_table(figures))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0
