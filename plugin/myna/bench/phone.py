"""``myna bench phone``: a real phone call to Myna through LiveKit's SIP service, timed at the caller.

Each call is what a caller and an agent do: Debian's ``baresip`` dials a number on
``livekit-sip``; the dispatch rule puts the call in a room of its own and dispatches ``myna
worker``; the agent's side (here an aiortc-free LiveKit participant of kind agent, as an LLM agent
would be) joins, and sends the reply's text the moment Myna is ready, as a greeting would be
(here the bridge has usually answered by then: it answers ~0.1 s after Myna's track is
subscribed); the caller hangs up after the reply.

Per call it reports, from the same text in the same room:

- **caller TTFA**: the reply's first chunk sent → its first audible sample arriving at the
  caller (baresip's decoded G.711, timed by the recording's growth: :class:`~myna.bench.sip_caller.Caller`);
- **listener TTFA**: the same text → its first audible sample out of a WebRTC listener in the room
  (the agent's own subscription to Myna's track);
- **the bridge's share**: their difference: LiveKit to the bridge, Opus decoding, resampling to
  8 kHz, G.711 and RTP to the phone. When the text comes before the call is up, Myna holds its
  one track for both, so the hold is in both figures and not in their difference;
- **after hang-up**: the caller's BYE → Myna gone from the room.

Everything runs on this host, inside a loopback-only network namespace::

    unshare -rn sh -c 'ip link set lo up && .venv/bin/myna bench phone --calls 10'

It needs ``livekit-server``, ``livekit-sip``, Redis and baresip (``bash scripts/setup.sh dev``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from myna.audio.onset import first_audible_sample
from myna.bench.sip_caller import PHONE_RATE, Caller

NUMBER = "+15550100"
AGENT_NAME = "myna-phone"
DEFAULT_TEXT = ("Thanks for calling the corner bakery. Your birthday cake is ready, and you can pick it up "
                "any time this afternoon.")


@dataclass
class CallResult:
    """One call, as the caller and the room's WebRTC listener had it.

    Attributes:
        room: the call's room.
        caller_ttfa_ms: first text chunk sent → first audible sample arrived at the caller.
        listener_ttfa_ms: the same, out of the WebRTC listener's jitter buffer.
        server_ttfa_ms: Myna's own (its ``first_audio`` event).
        answered_ms: dial → the call answered (baresip's "Call established").
        gone_ms: the caller's hang-up → Myna left the room (None: it had not within 5 s).
        heard: what the caller heard, int16 mono at 8 kHz ``[n]``, from the text sent on.
        listened: what the WebRTC listener heard of the reply, int16 mono at 48 kHz ``[n]``
            (empty when the caller hung up mid-reply).
    """

    room: str
    caller_ttfa_ms: float | None
    listener_ttfa_ms: float | None
    server_ttfa_ms: float | None
    answered_ms: float
    gone_ms: float | None
    heard: np.ndarray = field(repr=False)
    listened: np.ndarray = field(repr=False)


class PhoneRig:
    """Redis, ``livekit-server``, ``livekit-sip`` and a phone line on this host (a worker is the
    caller's to start: :attr:`node` ``.url``, agent name :data:`AGENT_NAME`).

    Args:
        log_dir: where every process's log, and each call's folder, go.
    """

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self.node = self.bridge = self.redis = None
        self._calls = 0

    def start(self) -> "PhoneRig":
        """Start everything and open the line (:func:`~myna.bench.livekit_sip.open_phone_line`).

        Raises:
            RuntimeError: a server could not start (the message says what to install).
        """
        from myna.bench.livekit_server import LiveKitServer, RedisServer, media_address
        from myna.bench.livekit_sip import SipBridge

        self.address = media_address()
        try:
            self.redis = RedisServer(log_dir=self.log_dir).start()
            self.node = LiveKitServer(node_ip=self.address, redis=self.redis, log_dir=self.log_dir).start()
            self.bridge = SipBridge(self.node, address=self.address, log_dir=self.log_dir).start()
        except BaseException:
            self.stop()  # (what did start must not outlive the failure)
            raise
        return self

    async def open_line(self) -> None:
        from myna.bench.livekit_sip import open_phone_line

        async with self._api() as lk:
            await open_phone_line(lk, NUMBER, AGENT_NAME)

    def _api(self):
        from livekit import api

        from myna.bench.livekit_server import DEV_KEY, DEV_SECRET

        return api.LiveKitAPI(self.node.http_url, DEV_KEY, DEV_SECRET)

    async def _new_room(self, before: set[str], timeout: float) -> str:
        from livekit import api

        deadline = time.monotonic() + timeout
        async with self._api() as lk:
            while time.monotonic() < deadline:
                rooms = {r.name for r in (await lk.room.list_rooms(api.ListRoomsRequest())).rooms}
                if new := sorted(rooms - before):
                    return new[0]
                await asyncio.sleep(0.05)
        raise TimeoutError(f"no room for the call within {timeout:g} s:\n{self.bridge.log_tail()}")

    async def call(self, text: str = DEFAULT_TEXT, tokens_per_s: float | None = None, dtmf: str = "",
                   on_dtmf=None, hang_up_after: float | None = None) -> CallResult:
        """Place one call: dial, send ``text`` as the agent once Myna is ready, press ``dtmf`` after
        the reply, hang up, and measure (module docstring).

        Args:
            on_dtmf: called with each ``rtc.SipDTMF`` the agent's side receives.
            hang_up_after: hang up this many seconds after the caller first heard Myna, mid-reply
                (None: after the reply; the listener's and the server's TTFA are then None).

        Raises:
            TimeoutError: the call was not answered, got no room, Myna never came, or (with
                ``hang_up_after``) the caller heard nothing within 10 s.
        """
        from livekit import api

        from myna.bench.livekit_server import DEV_KEY, DEV_SECRET
        from myna.room.client import RoomClient
        from myna.room.tokens import participant_token

        self._calls += 1
        async with self._api() as lk:
            before = {r.name for r in (await lk.room.list_rooms(api.ListRoomsRequest())).rooms}
        caller = Caller(self.log_dir / f"call-{os.getpid()}-{self._calls}", address=self.address)
        dialled = time.monotonic()
        caller.dial(self.bridge.uri(NUMBER))
        caller.watch()
        answer = asyncio.get_running_loop().create_task(caller.established())
        try:
            room = await self._new_room(before, timeout=20.0)
            token = participant_token(DEV_KEY, DEV_SECRET, room, f"agent-{self._calls}", agent=True)
            async with RoomClient(self.node.url, token) as client:
                if on_dtmf is not None:
                    client.room.on("sip_dtmf_received", on_dtmf)
                t0 = time.monotonic()  # (the turn's stream opens at once)
                if hang_up_after is None:
                    result = await client.speak(text, tokens_per_s=tokens_per_s)
                    await asyncio.sleep(0.5)  # the reply's tail is still on its way to the phone
                else:
                    result = None
                    *_, sender = await client.start_turn(text, tokens_per_s=tokens_per_s)
                    await self._heard_for(caller, hang_up_after)
                    await asyncio.gather(sender, return_exceptions=True)
                answered = 1000.0 * (await answer - dialled)
                heard = caller.heard()
                onset = first_audible_sample(heard, PHONE_RATE)
                arrived = caller.arrival(onset) if onset is not None else None
                if dtmf:
                    caller.press(dtmf)
                    await asyncio.sleep(1.0)  # each digit lasts ~100 ms and is sent as RTP events
                hung_up = time.monotonic()
                caller.hang_up()
                gone = None
                while time.monotonic() < hung_up + 5.0:
                    if client.left:
                        gone = 1000.0 * (time.monotonic() - hung_up)
                        break
                    await asyncio.sleep(0.005)
            return CallResult(room=room, caller_ttfa_ms=None if arrived is None else 1000.0 * (arrived - t0),
                              listener_ttfa_ms=result and result.perceived_ttfa_ms,
                              server_ttfa_ms=result and result.server_ttfa_ms,
                              answered_ms=answered, gone_ms=gone, heard=heard,
                              listened=result.pcm if result is not None else np.zeros(0, np.int16))
        finally:
            answer.cancel()
            await asyncio.gather(answer, return_exceptions=True)
            await caller.close()

    @staticmethod
    async def _heard_for(caller: Caller, seconds: float, timeout: float = 10.0) -> None:
        """Wait until the caller has heard Myna for ``seconds``."""
        deadline = time.monotonic() + timeout
        while (onset := first_audible_sample(caller.heard(), PHONE_RATE)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the caller heard nothing within {timeout:g} s")
            await asyncio.sleep(0.02)
        while len(caller.heard()) < onset + seconds * PHONE_RATE:
            await asyncio.sleep(0.02)

    def stop(self) -> None:
        for part in (self.bridge, self.node, self.redis):
            if part is not None:
                part.stop()


# -- the benchmark --------------------------------------------------------------------------------
def add_parser(subparsers) -> None:
    """Register ``phone`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("phone", help="phone calls to Myna through LiveKit's SIP service: TTFA at the caller",
                              description=__doc__.split("\n\n")[0] + " Needs livekit-server, livekit-sip, Redis "
                                                                       "and baresip (bash scripts/setup.sh dev).")
    p.add_argument("--calls", type=int, default=10, help="calls, one after another (default: %(default)s)")
    p.add_argument("--text", default=DEFAULT_TEXT, help="the reply the agent sends on each call")
    p.add_argument("--rate", type=float, default=0, help="tokens/s the reply is streamed at; 0: sent whole (default)")
    p.add_argument("--wer", action="store_true", help="also transcribe what each caller heard (Whisper tiny.en)")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)


def _stats(values: list[float]) -> dict:
    values = sorted(v for v in values if v is not None)
    if not values:
        return {"n": 0, "p50": None, "p95": None}
    return {"n": len(values), "p50": round(statistics.median(values), 1),
            "p95": round(values[min(len(values) - 1, round(0.95 * (len(values) - 1)))], 1)}


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args``; print a table, write JSON."""
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    from myna.bench.livekit_server import DEV_KEY, DEV_SECRET

    log_dir = Path(tempfile.mkdtemp(prefix="myna-bench-phone-"))
    rig = PhoneRig(log_dir).start()
    env = {**os.environ, "LIVEKIT_API_KEY": DEV_KEY, "LIVEKIT_API_SECRET": DEV_SECRET, "PYTHONUNBUFFERED": "1"}
    with open(log_dir / "myna-worker.log", "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "myna.cli", "worker", "--url", rig.node.url, "--agent-name",
                                   AGENT_NAME, "--departure-timeout", "0"], stdout=log, stderr=subprocess.STDOUT, env=env)
    calls: list[CallResult] = []
    try:
        await rig.open_line()
        deadline = time.monotonic() + 120
        while "registered as agent" not in (log_dir / "myna-worker.log").read_text(errors="replace"):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"myna worker did not register:\n{(log_dir / 'myna-worker.log').read_text()[-2000:]}")
            await asyncio.sleep(0.1)
        print(f"myna bench phone: {args.calls} calls to {rig.bridge.uri(NUMBER)} (logs in {log_dir})", flush=True)
        for i in range(args.calls):
            call = await rig.call(args.text, tokens_per_s=args.rate or None)
            calls.append(call)
            print(f"  call {i + 1}: caller {_ms(call.caller_ttfa_ms)}, WebRTC listener {_ms(call.listener_ttfa_ms)}, "
                  f"answered after {_ms(call.answered_ms)}, Myna gone {_ms(call.gone_ms)} after the hang-up", flush=True)
    finally:
        worker.terminate()
        worker.wait(30)
        rig.stop()
    share = [c.caller_ttfa_ms - c.listener_ttfa_ms for c in calls
             if c.caller_ttfa_ms is not None and c.listener_ttfa_ms is not None]
    result = {"calls": len(calls), "text": args.text, "rate": args.rate or None,
              "caller_ttfa_ms": _stats([c.caller_ttfa_ms for c in calls]),
              "caller_ttfa_ms_after_first": _stats([c.caller_ttfa_ms for c in calls[1:]]),
              "listener_ttfa_ms": _stats([c.listener_ttfa_ms for c in calls]),
              "server_ttfa_ms": _stats([c.server_ttfa_ms for c in calls]),
              "bridge_share_ms": _stats(share), "answered_ms": _stats([c.answered_ms for c in calls]),
              "gone_after_hangup_ms": _stats([c.gone_ms for c in calls]),
              "per_call": [{k: v for k, v in c.__dict__.items() if k not in ("heard", "listened")} for c in calls]}
    if args.wer:
        from myna.bench.wer import load_whisper, transcribe, word_error_rate

        model = load_whisper()
        references = [args.text] * len(calls)
        result["wer"] = {
            "caller": round(word_error_rate(references, [_transcribe(model, c.heard) for c in calls]), 3),
            "myna_g711": round(word_error_rate(references, [_transcribe(model, myna_g711(c.listened)) for c in calls]), 3),
            "listener_48k": round(word_error_rate(references, [transcribe(model, c.listened) for c in calls]), 3)}
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


def _transcribe(model, pcm8: np.ndarray) -> str:
    """What Whisper hears in int16 mono 8 kHz audio (resampled to its 16 kHz)."""
    import soxr

    audio = soxr.resample(pcm8.astype(np.float32) / 32768.0, PHONE_RATE, 16_000)
    segments, _ = model.transcribe(audio, beam_size=1, language="en", vad_filter=False)
    return " ".join(s.text for s in segments)


def myna_g711(pcm48: np.ndarray) -> np.ndarray:
    """``pcm48`` as Myna's own phone-band output makes it (``pcm_mulaw`` on its WebSocket and
    ``/v1/audio/speech``: soxr's HQ resampler to 8 kHz, FFmpeg's µ-law), decoded again: int16 at
    8 kHz ``[n]``. The other place the phone band can be made; the bridge makes it for SIP calls."""
    from myna.audio.encode import FORMATS, StreamEncoder
    from myna.audio.resample import TurnResampler

    resampler = TurnResampler(PHONE_RATE)
    x = np.concatenate([resampler.resample(pcm48.astype(np.float32) / 32768.0, 48_000), resampler.flush()])
    pcm8 = np.clip(np.round(x * 32767.0), -32768, 32767).astype("<i2")
    encoder = StreamEncoder(FORMATS["pcm_mulaw"])
    coded = np.frombuffer(encoder.encode(pcm8.tobytes()) + encoder.finish(), np.uint8)
    return _ulaw_decode(coded)


def _ulaw_decode(coded: np.ndarray) -> np.ndarray:
    """G.711 µ-law bytes to int16 (ITU-T G.711, the inverse of its segment encoding)."""
    u = ~coded.astype(np.int32) & 0xFF
    magnitude = (((u & 0x0F) << 3) + 0x84) << ((u >> 4) & 0x07)
    return np.where(u & 0x80, 0x84 - magnitude, magnitude - 0x84).astype(np.int16)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} ms"


def format_table(result: dict) -> str:
    """The figures as a table (p50 / p95 over the calls, ms)."""
    rows = [("caller TTFA (text → first audible sample at the phone)", result["caller_ttfa_ms"]),
            ("  the same, calls after the first", result["caller_ttfa_ms_after_first"]),
            ("WebRTC listener TTFA, same text, same room", result["listener_ttfa_ms"]),
            ("Myna's server TTFA", result["server_ttfa_ms"]),
            ("the bridge's share (caller − listener)", result["bridge_share_ms"]),
            ("dial → answered", result["answered_ms"]),
            ("hang-up → Myna gone from the room", result["gone_after_hangup_ms"])]
    pace = "sent whole" if not result["rate"] else f"streamed at {result['rate']:g} tokens/s"
    lines = [f"\n{result['calls']} calls, the reply {pace}",
             f"{'':<58}{'p50':>8}{'p95':>8}{'n':>4}"]
    for name, s in rows:
        lines.append(f"{name:<58}{_fmt(s['p50']):>8}{_fmt(s['p95']):>8}{s['n']:>4}")
    if "wer" in result:
        w = result["wer"]
        lines.append(f"WER (Whisper tiny.en): the caller, resampled to 8 kHz by the bridge {w['caller']:.3f}; "
                     f"the listener's audio through Myna's own 8 kHz G.711 {w['myna_g711']:.3f}; "
                     f"the listener at 48 kHz {w['listener_48k']:.3f}")
    return "\n".join(lines)


def _fmt(value) -> str:
    return "—" if value is None else f"{value:.0f}"
