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


def add_parser(subparsers) -> None:
    """Register ``speech`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("speech", help="time to first audio byte: the OpenAI speech endpoint vs the WebSocket",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20, help="requests per door (default: %(default)s)")
    p.add_argument("--engine", default="piper", help="engine (default: %(default)s)")
    p.add_argument("--text", default=REPLY, help="the reply, sent whole (default: three sentences)")
    p.add_argument("--url", help="an already running worker instead of starting one")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)


async def speech_once(http, url: str, engine: str, text: str) -> tuple[float, float, int]:
    """One ``POST /v1/audio/speech`` (pcm): (first byte s, last byte s, bytes).

    Raises:
        RuntimeError: the request was refused.
    """
    body = {"model": engine, "voice": "alloy", "input": text, "response_format": "pcm"}
    t0 = time.perf_counter()
    first = None
    total = 0
    async with http.post(f"{url}/v1/audio/speech", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"speech refused: {resp.status} {await resp.text()}")
        async for chunk in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - t0
            total += len(chunk)
    return first, time.perf_counter() - t0, total


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

