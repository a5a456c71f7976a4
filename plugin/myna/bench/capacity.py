"""``myna bench capacity``: how many conversations one machine holds at a latency bound.

An open-loop, conversation-shaped load against a worker on this machine, ramped in steps. Each
conversation is one WebRTC session (the same signaling and data-channel messages as
:mod:`myna.rtc.client`) that joins at a random moment and talks the way a voice agent does:

- the user speaks for a random 2–6 s (the agent is silent), then the LLM's first token comes a
  random 150–600 ms later and the reply, 8–40 words, streams at 30 tokens/s;
- one reply in ten is barged in on (``interrupt``) 0.5–2 s after its ``first_audio``;
- after 3–8 replies the caller hangs up, and a new one joins in its place a moment later, so
  session set-up is part of the load as it is on a real worker.

The number of conversations rises in steps (``--levels``); each step is held until it has
``--replies`` measured replies (those whose first token was sent once every conversation of the
step had joined). Per step: **arrival TTFA** of every reply (first chunk sent → arrival of the
packet that carries the first audible sample) p50/p95/p99; the worker's own
``server_ttfa_ms``; **gaps** per minute of speech (the pauses of a frame or more the worker
reports in ``turn_done.gaps``, plus every stall the client saw: packets more than :data:`STALL_S` apart while a reply plays);
**underruns** (``turn_done.underruns``); **barge-in to silence** (``interrupt`` sent → arrival of
the packet with the last audible sample); the CPU of the worker and of the load generator (% of
one core, both on this machine).

The load generator keeps its own cost small: its clients never decode a whole stream. Each RTP
packet's arrival and payload are noted and dropped (no jitter buffer, no decoder); a reply's onset
is found by decoding only from its first packet larger than an idle one (:data:`IDLE_BYTES`) until
the first audible sample, by the onset rule of :mod:`myna.audio.onset`, and a barge-in's silence
by decoding the second after the ``interrupt``. With ``--wer``, one conversation per step is also
decoded whole and its replies transcribed by Whisper tiny.en after the run.

**Capacity** is the largest step that held the bound: reply TTFA p95 ≤ ``--bound-ms`` (250), no
underrun, no lost reply, and gaps ≤ 1 per minute of speech. A system's ramp stops once ``--past``
+ 1 steps in a row have broken the bound (a p95 of 40 replies moves by a few tens of ms from one
step to the next: one step past the bound is not yet the end).

Systems are measured one after another in one run: Myna's engine on a worker started here,
``--compare LABEL=DIR`` (the same benchmark worker from another checkout, e.g. today's main) or
``LABEL=URL`` (a running worker), and ``--peer pipecat``: Pipecat's own SmallWebRTC +
PiperTTSService (:mod:`myna.bench.pipecat_peer`), its default sentence aggregation and token
aggregation. With ``--transport livekit`` Myna's callers each join a LiveKit room of their own
(a ``livekit-server`` started here) and Myna is dispatched into it, as ``myna worker`` serves
rooms (:class:`RoomListener`: the SDK decodes every frame, so there TTFA is read on decoded
frames, after its jitter buffer).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from myna.audio.onset import first_audible_sample
from myna.audio.playout import SAMPLE_RATE
from myna.rtc.client import MynaClient

#: Reply lengths (words), first-token delays (s), user turns (s), the shape of a conversation's load.
REPLY_WORDS = (8, 40)
FIRST_TOKEN_S = (0.15, 0.6)
USER_TALK_S = (2.0, 6.0)
TOKENS_PER_S = 30.0
#: Share of replies barged in on, and when (s after ``first_audio``).
BARGE_IN_SHARE = 0.1
BARGE_IN_AFTER_S = (0.5, 2.0)
#: Replies a caller hears before hanging up; the pause before the next caller joins (s).
CALL_REPLIES = (3, 8)
REJOIN_S = (0.2, 1.0)
#: New conversations of a step join at random within this many seconds.
JOIN_SPREAD_S = 3.0
#: An Opus packet this small carries no sound (Myna's settled idle packet is 3 bytes; an encoder
#: fed digital silence makes packets of a few bytes): onset search starts after them.
IDLE_BYTES = 10
#: The shortest pause a worker reports (``turn_done.gaps``) that counts as a gap (ms): a frame.
#: Shorter ones (a chunk a few ms late, mostly in a phrase's quiet lead-in) are not heard.
MIN_GAP_MS = 20.0
#: Packets further apart than this while a reply plays are a stall (packets come every 20 ms).
STALL_S = 0.06
#: After an ``interrupt``, how long a ``turn_done`` is waited for (a peer may send none) (s).
BARGE_IN_WAIT_S = 3.0
#: A reply whose ``turn_done`` has not come this long after its last chunk is lost.
TURN_TIMEOUT_S = 60.0
#: A peer reports a turn's end before its transport has sent the audio: the reply is over once
#: this long passed with idle packets only.
PEER_QUIET_S = 0.6
#: The bound capacity is measured at (ms; reply TTFA p95) and the gaps a minute of speech may hold.
BOUND_MS = 250.0
MAX_GAPS_PER_MIN = 1.0

#: Sentences agent replies are made of (an agent's register: bookings, orders, support). A reply
#: starts at a sentence, as an LLM's does, and runs on through the next ones to its length.
AGENT_SENTENCES = (
    "Sure, I can help with that.", "Your table for four is booked at seven tonight, and I have added a note about "
    "the birthday cake.", "Okay, let me check that for you.", "The order you asked about left our warehouse on "
    "Monday evening and should reach you by Thursday, so someone should be at home to sign for it.",
    "I checked your account and the last payment went through on the third, which means nothing is overdue right now.",
    "Of course.", "If you would like, I can move the appointment to Friday morning instead, when the clinic has two "
    "openings.", "The weather looks dry for the weekend, with a light breeze from the west and a few clouds in the "
    "afternoon.", "Got it, thanks for waiting.", "Your new card will arrive in five to seven working days, and you can "
    "start using it as soon as you activate it in the app.", "I am sorry about the wait; the technician is on the way "
    "and should be there within the hour.", "Let me read that back to you: two large pizzas, one with mushrooms, and a "
    "bottle of sparkling water.", "Great question.", "The flight leaves from gate twelve, boarding starts forty "
    "minutes before departure, and your seat is by the window.", "Is there anything else I can do for you today?",
)


# -- the load's shape ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplyPlan:
    """One agent reply of a conversation.

    Attributes:
        text: the reply (8–40 words of :data:`AGENT_SENTENCES`).
        user_talk_s: the user's turn before it (the agent silent), s.
        first_token_s: the LLM's delay from the user's end to its first token, s.
        barge_in_s: an ``interrupt`` this long after ``first_audio`` (s), or None.
    """

    text: str
    user_talk_s: float
    first_token_s: float
    barge_in_s: float | None


def plan_reply(rng: random.Random) -> ReplyPlan:
    """A random reply of the load's shape (module docstring), drawn from ``rng``."""
    words = rng.randint(*REPLY_WORDS)
    start = rng.randrange(len(AGENT_SENTENCES))
    pool = " ".join(AGENT_SENTENCES[start:] + AGENT_SENTENCES[:start]).split()
    text = " ".join(pool[:words]).rstrip(",.;:?") + "."
    barge = rng.uniform(*BARGE_IN_AFTER_S) if rng.random() < BARGE_IN_SHARE else None
    return ReplyPlan(text, rng.uniform(*USER_TALK_S), rng.uniform(*FIRST_TOKEN_S), barge)


# -- what arrives -------------------------------------------------------------------------------
@dataclass
class Packet:
    """One received RTP packet: its arrival (monotonic s), RTP timestamp and Opus payload."""

    arrival: float
    timestamp: int
    payload: bytes


class PacketClient(MynaClient):
    """A :class:`~myna.rtc.client.MynaClient` that keeps each audio packet's arrival and payload
    (:attr:`packets`) and hands nothing to aiortc's jitter buffer or decoder, so a load of many
    sessions costs the generator little. The decoded track stays empty.

    It is the WebRTC side of what :func:`speak_reply` talks to; :class:`RoomListener` is the
    LiveKit side, with the same methods."""

    def _watch_arrivals(self, receiver) -> None:
        self.packets: list[Packet] = []

        async def on_packet(packet, arrival_time_ms):
            self.packets.append(Packet(time.monotonic(), packet.timestamp, packet.payload))

        receiver._handle_rtp_packet = on_packet  # (aiortc 1.x, as MynaClient._watch_arrivals)

    def forget(self) -> None:
        """Drop the audio kept so far (a reply's measurement starts after this)."""
        self.packets = []

    def start_reply(self, turn_id: str, text: str) -> asyncio.Task:
        """Stream ``text`` as turn ``turn_id`` at LLM pace; the sending task."""
        return asyncio.ensure_future(self._send_chunks(turn_id, text, TOKENS_PER_S))

    async def interrupt(self) -> None:
        self.send({"type": "interrupt"})

    def onset(self, since: float) -> float | None:
        return onset(self.packets, since)

    def last_sound(self, since: float) -> float | None:
        return last_sound(self.packets, since)

    def sound_end(self) -> float | None:
        """When the last packet larger than an idle one arrived (monotonic s), or None."""
        return next((p.arrival for p in reversed(self.packets) if len(p.payload) > IDLE_BYTES), None)

    def stalls(self, start: float, end: float) -> int:
        return stalls(self.packets, start, end)

    def quiet(self, since: float, quiet_s: float) -> bool:
        """Sound came after ``since`` and the last ``quiet_s`` of packets are idle-sized."""
        now = time.monotonic()
        sound = any(len(p.payload) > IDLE_BYTES for p in self.packets if p.arrival >= since)
        recent = [p for p in self.packets[-int(quiet_s * 60) :] if p.arrival >= now - quiet_s]
        return sound and len(recent) >= quiet_s * 40 and all(len(p.payload) <= IDLE_BYTES for p in recent)

    def recording(self) -> list[Packet]:
        """What was received since :meth:`forget`, as it came (decoded later by :func:`audio_of`:
        a reply's whole decode on the event loop would delay other sessions' packets)."""
        return list(self.packets)


class RoomListener:
    """A caller in a LiveKit room of its own, Myna dispatched into it: a
    :class:`myna.room.client.RoomClient` with :class:`PacketClient`'s methods. The SDK
    decodes every frame (its jitter buffer included), so times here are when decoded 10 ms
    frames reached Python: a room's figures are measured later in the path than a WebRTC
    session's arrival figures.

    Args:
        url: the LiveKit server's WebSocket URL.
    """

    def __init__(self, url: str):
        from myna.bench.room import room_client

        self._client = room_client(url)
        self._start = 0

    async def connect(self, timeout: float) -> None:
        await self._client.connect(timeout)
        self.events = self._client.events

    async def close(self) -> None:
        await self._client.close()

    def forget(self) -> None:
        self._start = len(self._client.frames)

    def start_reply(self, turn_id: str, text: str) -> asyncio.Task:
        async def send() -> None:
            _, _, sender = await self._client.start_turn(text, TOKENS_PER_S, turn_id)
            await sender

        return asyncio.ensure_future(send())

    async def interrupt(self) -> None:
        await self._client.interrupt()

    def _frames(self, since: float = 0.0) -> list[tuple[float, np.ndarray]]:
        return [f for f in self._client.frames[self._start :] if f[0] >= since]

    def onset(self, since: float) -> float | None:
        for at, pcm in self._frames(since):
            found = first_audible_sample(pcm, SAMPLE_RATE)
            if found is not None:
                return at + found / SAMPLE_RATE
        return None

    def last_sound(self, since: float) -> float | None:
        heard = [at for at, pcm in self._frames(since) if first_audible_sample(pcm, SAMPLE_RATE) is not None]
        return heard[-1] if heard else None

    def sound_end(self) -> float | None:
        return self.last_sound(0.0)

    def stalls(self, start: float, end: float) -> int:
        return holes([at for at, _ in self._frames(start) if at <= end])

    def quiet(self, since: float, quiet_s: float) -> bool:
        end = self.sound_end()
        return end is not None and end >= since and time.monotonic() - end >= quiet_s

    def recording(self) -> np.ndarray:
        """What was received since :meth:`forget`: int16 mono at 48 kHz (decoded by the SDK)."""
        frames = self._frames()
        return np.concatenate([pcm for _, pcm in frames]) if frames else np.zeros(0, np.int16)


def decode(packets: list[Packet]) -> list[np.ndarray]:
    """Each packet's audio, int16 mono at 48 kHz (the first channel), by aiortc's Opus decoder
    started fresh at the first packet (Opus needs no earlier state to decode)."""
    from aiortc.codecs.opus import OpusDecoder
    from aiortc.jitterbuffer import JitterFrame

    decoder = OpusDecoder()
    out = []
    for p in packets:
        frames = decoder.decode(JitterFrame(data=p.payload, timestamp=p.timestamp))
        pcm = [f.to_ndarray().reshape(-1, len(f.layout.channels))[:, 0] for f in frames]
        out.append(np.concatenate(pcm) if pcm else np.zeros(0, np.int16))
    return out


def audio_of(reply: "ReplyResult") -> np.ndarray:
    """A kept reply's audio (:attr:`ReplyResult.audio`), int16 mono at 48 kHz."""
    if isinstance(reply.audio, np.ndarray):
        return reply.audio
    return np.concatenate(decode(reply.audio)) if reply.audio else np.zeros(0, np.int16)


def onset(packets: list[Packet], since: float, window: int = 50) -> float | None:
    """When the first audible sample after ``since`` arrived (monotonic s), or None.

    Packets up to :data:`IDLE_BYTES` are skipped undecoded; from each larger one, up to
    ``window`` packets are decoded until an audible sample (:func:`first_audible_sample`) is
    found; its time is its packet's arrival plus its place in the packet."""
    i, n = 0, len(packets)
    while i < n:
        if packets[i].arrival < since or len(packets[i].payload) <= IDLE_BYTES:
            i += 1
            continue
        run = packets[i : i + window]
        for p, pcm in zip(run, decode(run)):
            at = first_audible_sample(pcm, SAMPLE_RATE) if len(pcm) else None
            if at is not None:
                return p.arrival + at / SAMPLE_RATE
        i += window
    return None


def last_sound(packets: list[Packet], since: float) -> float | None:
    """When the packet with the last audible sample after ``since`` arrived (monotonic s), or
    None when nothing after ``since`` was audible (packets decoded from ``since`` on)."""
    run = [p for p in packets if p.arrival >= since]
    last = None
    for p, pcm in zip(run, decode(run)):
        if len(pcm) and first_audible_sample(pcm, SAMPLE_RATE) is not None:
            last = p.arrival
    return last


def stalls(packets: list[Packet], start: float, end: float) -> int:
    """Times the packets stopped for more than :data:`STALL_S` between ``start`` and ``end``."""
    return holes([p.arrival for p in packets if start <= p.arrival <= end])


def holes(times: list[float]) -> int:
    """How many times rising arrival ``times`` (s) are more than :data:`STALL_S` apart."""
    return int(np.count_nonzero(np.diff(times) > STALL_S)) if len(times) > 1 else 0


# -- one reply ------------------------------------------------------------------------------------
@dataclass
class ReplyResult:
    """One measured reply (times in ms; None where not measured)."""

    sent_at: float  # monotonic s: its first chunk
    words: int
    ttfa_ms: float | None
    server_ttfa_ms: float | None
    speech_ms: float
    gaps: int  # the worker's reported gaps of MIN_GAP_MS or more (``turn_done.gaps``)
    stalls: int  # client-side: packets more than STALL_S apart while the reply played
    underruns: int
    barge_in_ms: float | None
    lost: bool = False
    text: str = ""
    audio: "list[Packet] | np.ndarray | None" = field(default=None, repr=False)  # kept for --wer: audio_of()


async def speak_reply(client: "PacketClient | RoomListener", plan: ReplyPlan, peer: bool,
                      keep_audio: bool = False) -> ReplyResult:
    """Stream one planned reply on ``client`` and measure it (see the module docstring).

    The user's turn and the first-token delay are waited for here, before the first chunk.
    """
    await asyncio.sleep(plan.user_talk_s + plan.first_token_s)
    client.forget()
    while not client.events.empty():  # events of an earlier reply (e.g. a peer's late turn_done)
        client.events.get_nowait()
    turn_id = uuid.uuid4().hex[:12]
    t0 = time.monotonic()
    sender = client.start_reply(turn_id, plan.text)
    first = done = None
    interrupt_at = None
    try:
        deadline = t0 + TURN_TIMEOUT_S
        while done is None:
            wait = deadline - time.monotonic()
            if first is not None and plan.barge_in_s is not None and interrupt_at is None:
                wait = min(wait, first["_at"] + plan.barge_in_s - time.monotonic())
                if wait <= 0:
                    sender.cancel()
                    interrupt_at = time.monotonic()
                    await client.interrupt()
                    deadline = min(deadline, interrupt_at + BARGE_IN_WAIT_S)
                    continue
            try:
                event = await asyncio.wait_for(client.events.get(), max(0.0, wait))
            except asyncio.TimeoutError:
                if time.monotonic() >= deadline:
                    if interrupt_at is not None:
                        done = {}  # a peer that reports no interrupted turn: its audio tells
                    break
                continue
            if event.get("turn_id") != turn_id:
                continue
            if event["type"] == "first_audio":
                first = {**event, "_at": time.monotonic()}
            elif event["type"] == "turn_done":
                done = event
    finally:
        sender.cancel()
    words = len(plan.text.split())
    if done is None:
        return ReplyResult(t0, words, None, None, 0.0, 0, 0, 0, None, lost=True, text=plan.text)
    if peer and interrupt_at is None:
        await _until_quiet(client, t0, PEER_QUIET_S, TURN_TIMEOUT_S)
    else:
        await asyncio.sleep(0.25 if interrupt_at is not None else 0.15)  # the last audio in flight
    heard = client.onset(t0)
    speech_end = client.sound_end()
    barge = None
    if interrupt_at is not None:
        silent = client.last_sound(interrupt_at)
        barge = 1000.0 * ((silent if silent is not None else interrupt_at) - interrupt_at)
    gap_count = sum(1 for _, ms in done.get("gaps") or () if ms >= MIN_GAP_MS)
    stall_count = client.stalls(heard, speech_end) if heard is not None and speech_end is not None else 0
    speech_ms = float(done["audio_ms"]) if not peer and "audio_ms" in done else (
        1000.0 * (speech_end - heard) if heard is not None and speech_end is not None else 0.0)
    audio = client.recording() if keep_audio and interrupt_at is None else None
    return ReplyResult(t0, words, None if heard is None else 1000.0 * (heard - t0),
                       first.get("server_ttfa_ms") if first else None, speech_ms, gap_count, stall_count,
                       int(done.get("underruns") or 0), barge, text=plan.text, audio=audio)


async def _until_quiet(client: "PacketClient | RoomListener", since: float, quiet_s: float, timeout: float) -> None:
    """Wait until sound has come after ``since`` and then ``quiet_s`` of quiet (or ``timeout``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and not client.quiet(since, quiet_s):
        await asyncio.sleep(quiet_s / 4)


# -- a ramp ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """A system under load: its label, server URL, what to ask for and the server's process id
    (None: its CPU is not measured); ``room_url``: reached through LiveKit rooms on this server
    (one room per conversation, Myna dispatched into it) instead of WebRTC to ``url``."""

    label: str
    url: str
    engine: str | None
    pid: int | None
    peer: bool = False
    room_url: str | None = None

    async def connect(self) -> "PacketClient | RoomListener":
        """A new caller, connected (its ``ready`` received).

        Raises:
            Exception: whatever refused it (a full worker, a time-out).
        """
        client = RoomListener(self.room_url) if self.room_url else PacketClient(self.url, engine=self.engine)
        await client.connect(timeout=30.0)
        return client


class Step:
    """The replies measured at one level of load, and the CPU spent while they were."""

    def __init__(self, level: int, worker_pid: int | None, synthesis: dict | None = None):
        self.level = level
        self.replies: list[ReplyResult] = []
        self.refused = 0
        self.started = time.monotonic()
        self._pid = worker_pid
        self._cpu0 = (_process_cpu(worker_pid), _own_cpu())
        self._synthesis0 = synthesis or {}
        self.cpu: dict = {}

    def finish(self, synthesis: dict | None = None) -> None:
        """Close the step's CPU figures; ``synthesis``: the worker's engine counters now (the
        instrumented worker's ``compute_stats()``, as at the start), for its synthesis load."""
        wall = max(time.monotonic() - self.started, 1e-6)
        worker = _process_cpu(self._pid)
        compute = (synthesis or {}).get("compute_s"), self._synthesis0.get("compute_s")
        self.cpu = {"worker_pct": None if worker is None or self._cpu0[0] is None
                    else round(100.0 * (worker - self._cpu0[0]) / wall, 1),
                    "clients_pct": round(100.0 * (_own_cpu() - self._cpu0[1]) / wall, 1),
                    # synthesis threads' seconds per second (1.0: one thread busy all the time)
                    "synthesis_load": None if None in compute else round((compute[0] - compute[1]) / wall, 3),
                    "seconds": round(wall, 1)}


def _process_cpu(pid: int | None) -> float | None:
    """CPU seconds of process ``pid`` so far; None if unknown."""
    from myna.bench.processes import process_cpu_s

    return None if pid is None else process_cpu_s(pid)


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


class Ramp:
    """Conversations against one :class:`Target`, raised level by level.

    Args:
        target: the system.
        seed: seeds every conversation's plan (each conversation draws from its own generator).
        wer: keep one conversation's replies' audio, for Whisper after the run.
    """

    def __init__(self, target: Target, seed: int, wer: bool = False):
        self.target = target
        self._rng = random.Random(seed)
        self._wer = wer
        self._tasks: list[asyncio.Task] = []
        self.step: Step | None = None

    async def hold(self, level: int, replies: int, max_s: float) -> Step:
        """Raise the load to ``level`` conversations (the new ones join at random within
        :data:`JOIN_SPREAD_S`), then measure until ``replies`` replies or ``max_s`` seconds."""
        new = level - len(self._tasks)
        for _ in range(new):
            seed = self._rng.getrandbits(32)
            delay = self._rng.uniform(0.0, JOIN_SPREAD_S)
            sampled = self._wer and not self._tasks  # the first conversation is the sampled one
            self._tasks.append(asyncio.ensure_future(self._conversation(seed, delay, sampled)))
        await asyncio.sleep(JOIN_SPREAD_S if new > 0 else 0.0)
        self.step = step = Step(level, self.target.pid, await self._synthesis())
        deadline = time.monotonic() + max_s
        while len(step.replies) < replies and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        self.step = None
        step.finish(await self._synthesis())
        return step

    async def _synthesis(self) -> dict | None:
        """The engine's synthesis counters, from a worker started by :mod:`myna.bench.worker`."""
        if self.target.peer or self.target.room_url:
            return None
        from myna.bench.systems import engine_stats

        return (await engine_stats(self.target.url)).get(self.target.engine)

    async def _conversation(self, seed: int, delay: float, sampled: bool) -> None:
        rng = random.Random(seed)
        await asyncio.sleep(delay)
        while True:
            try:
                client = await self.target.connect()
            except Exception:
                if self.step is not None:
                    self.step.refused += 1
                await asyncio.sleep(rng.uniform(*REJOIN_S))
                continue
            try:
                for _ in range(rng.randint(*CALL_REPLIES)):
                    result = await speak_reply(client, plan_reply(rng), self.target.peer, keep_audio=sampled)
                    step = self.step
                    if step is not None and result.sent_at >= step.started:
                        step.replies.append(result)
            finally:
                await client.close()
            await asyncio.sleep(rng.uniform(*REJOIN_S))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []


def summarise(step: Step, bound_ms: float = BOUND_MS) -> dict:
    """One step's row: TTFA percentiles, gaps and underruns per minute of speech, barge-in,
    CPU, and whether the step holds the bound (module docstring)."""
    replies = [r for r in step.replies if not r.lost]
    ttfa = [r.ttfa_ms for r in replies if r.ttfa_ms is not None]
    speech_min = sum(r.speech_ms for r in replies) / 60_000.0
    gaps = sum(r.gaps for r in replies)
    stalled = sum(r.stalls for r in replies)
    underruns = sum(r.underruns for r in replies)
    barge = [r.barge_in_ms for r in replies if r.barge_in_ms is not None]
    lost = len(step.replies) - len(replies) + sum(r.ttfa_ms is None for r in replies)
    row = {"sessions": step.level, "replies": len(step.replies), "lost": lost, "refused": step.refused,
           "ttfa_ms": _percentiles(ttfa),
           "server_ttfa_ms_p50": _round(np.median([r.server_ttfa_ms for r in replies if r.server_ttfa_ms is not None])
                                        if any(r.server_ttfa_ms is not None for r in replies) else None),
           "speech_min": round(speech_min, 2),
           "gaps_per_min": round((gaps + stalled) / speech_min, 2) if speech_min else None,
           "server_gaps": gaps, "stalls": stalled, "underruns": underruns,
           "barge_in_ms": _percentiles(barge), **step.cpu}
    seconds = step.cpu.get("seconds") or 0.0  # (the agent's share of a conversation's time)
    row["speech_share"] = round(speech_min * 60.0 / (step.level * seconds), 3) if seconds else None
    row["holds"] = bool(ttfa) and row["ttfa_ms"]["p95"] <= bound_ms and lost == 0 and underruns == 0 and \
        (row["gaps_per_min"] or 0.0) <= MAX_GAPS_PER_MIN
    row["_replies"] = step.replies
    return row


def capacity(rows: list[dict]) -> int:
    """The largest level whose step held the bound (0: none did)."""
    return max((row["sessions"] for row in rows if row["holds"]), default=0)


def held_through(rows: list[dict]) -> int:
    """The largest level up to which every step held the bound (0: the first broke). Below
    :func:`capacity` when a step broke and a larger one held: on a shared machine a step's gaps
    and tail move between runs, so the pair says how firm the capacity is."""
    held = 0
    for row in sorted(rows, key=lambda row: row["sessions"]):
        if not row["holds"]:
            break
        held = row["sessions"]
    return held


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"n": len(values), "p50": _round(p50), "p95": _round(p95), "p99": _round(p99)}


def _round(value) -> float | None:
    return None if value is None else round(float(value), 1)


async def ramp(target: Target, levels: list[int], replies: int, max_step_s: float, past: int, seed: int,
               bound_ms: float = BOUND_MS, wer: bool = False) -> list[dict]:
    """Every step of ``levels`` against ``target``, stopping once ``past`` + 1 steps in a row
    have broken the bound; the rows of :func:`summarise`."""
    r = Ramp(target, seed, wer)
    rows, failed = [], 0
    try:
        for level in levels:
            row = summarise(await r.hold(level, replies, max_step_s), bound_ms)
            rows.append(row)
            _progress(f"{target.label}: {level} conversations: TTFA p95 {_ms(row['ttfa_ms']['p95'])}, "
                      f"gaps/min {row['gaps_per_min']}, underruns {row['underruns']}, lost {row['lost']}, "
                      f"worker CPU {row['worker_pct']} %, clients {row['clients_pct']} % "
                      f"({'holds' if row['holds'] else 'breaks'})")
            failed = 0 if row["holds"] else failed + 1
            if failed > past:
                break
    finally:
        await r.stop()
    return rows


# -- the command ----------------------------------------------------------------------------------
def add_parser(subparsers) -> None:
    """Register ``capacity`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("capacity", help="conversations one machine holds at a TTFA bound, under a "
                                               "conversation-shaped load (side by side with peers)",
                              description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--engine", default="piper", help="Myna engine to load (default: %(default)s)")
    p.add_argument("--levels", default="1,2,4,6,8,10,12,16,24",
                   help="comma-separated conversation counts, in rising order (default: %(default)s)")
    p.add_argument("--replies", type=int, default=40, help="measured replies per step (default: %(default)s)")
    p.add_argument("--max-step-s", type=float, default=150.0,
                   help="longest a step is held, whatever it has measured (s; default: %(default)s: a step of one "
                        "conversation makes ~14 replies in it)")
    p.add_argument("--past", type=int, default=1,
                   help="a system's ramp stops once PAST + 1 steps in a row have broken the bound (default: %(default)s)")
    p.add_argument("--bound-ms", type=float, default=BOUND_MS, help="reply TTFA p95 bound (ms; default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="seeds the conversations (default: %(default)s)")
    p.add_argument("--compare", action="append", default=[], metavar="LABEL=DIR|URL",
                   help="also load another Myna: a checkout (its benchmark worker is started here, e.g. today's "
                        "main from `git worktree add`) or a running worker's URL (repeatable)")
    p.add_argument("--peer", choices=["pipecat"], action="append", default=[],
                   help="also load a peer's own stack in the same run (pipecat: SmallWebRTC + PiperTTSService, "
                        "sentence and token aggregation)")
    p.add_argument("--no-myna", action="store_true", help="measure only the --compare and --peer systems")
    p.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                   help="passed on to the Myna worker started here (repeatable; e.g. --worker-arg=--workers=2)")
    p.add_argument("--wer", action="store_true", help="Whisper tiny.en WER of one conversation per step, and of a "
                                                     "lone session (needs the dev extra)")
    p.add_argument("--transport", choices=["webrtc", "livekit"], default="webrtc",
                   help="livekit: Myna's callers each in a LiveKit room of their own, Myna dispatched into it (a "
                        "livekit-server is started here; --compare and --peer stay on WebRTC)")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError as exc:
        raise SystemExit(f"bench capacity: --levels: {exc}") from None
    if not levels or levels != sorted(set(levels)) or levels[0] < 1 or args.replies < 1:
        raise SystemExit("bench capacity: --levels must rise from 1 or more, and --replies must be 1 or more")
    from myna.bench.processes import Server
    from myna.rtc.ice import enable_loopback_candidates

    enable_loopback_candidates()
    servers: list[Server] = []
    targets: list[Target] = []
    stack = contextlib.ExitStack()  # a LiveKit server and the Myna process beside it
    try:
        if not args.no_myna and args.transport == "livekit":
            targets.append(_room_target(args.engine, stack))
        elif not args.no_myna:
            servers.append(Server(["myna.bench.worker", "--engine", args.engine, *args.worker_arg], "worker"))
            targets.append(Target("myna", servers[-1].url, args.engine, servers[-1].proc.pid))
        for value in args.compare:
            label, _, where = value.partition("=")
            if not label or not where:
                raise SystemExit(f"bench capacity: --compare wants LABEL=DIR or LABEL=URL, not {value!r}")
            if where.startswith(("http://", "https://")):
                targets.append(Target(label, where.rstrip("/"), args.engine, None))
                continue
            root = Path(where).resolve()
            path = os.pathsep.join(str(root / d) for d in ("plugin", "server"))
            servers.append(Server(["myna.bench.worker", "--engine", args.engine], f"{label} worker",
                                  env={"PYTHONPATH": path}))
            targets.append(Target(label, servers[-1].url, args.engine, servers[-1].proc.pid))
        for peer in args.peer:
            servers.append(Server([f"myna.bench.{peer}_peer"], f"{peer} peer"))
            targets += [Target(f"{peer}-{mode}", servers[-1].url, mode, servers[-1].proc.pid, peer=True)
                        for mode in ("sentence", "token")]
        if not targets:
            raise SystemExit("bench capacity: nothing to measure (--no-myna without --compare or --peer)")
        result = asyncio.run(_measure(targets, levels, args))
    finally:
        for server in servers:
            server.stop()
        stack.close()
    if args.wer:
        _add_wer(result)
    for system in result["systems"]:
        system.pop("_lone", None)
        for row in system["rows"]:
            row.pop("_replies", None)
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


def _room_target(engine: str, stack: contextlib.ExitStack) -> Target:
    """Myna through LiveKit rooms: a ``livekit-server`` and a Myna process serving its rooms
    (``myna worker``'s dispatch; :func:`myna.bench.room.serve_both`), stopped by ``stack``."""
    from myna.bench.livekit_server import LiveKitServer, find_livekit_server, media_address, missing_livekit_server
    from myna.bench.room import MynaHost
    from myna.extras import require

    require("livekit")
    if find_livekit_server() is None:
        raise SystemExit(f"bench capacity --transport livekit: {missing_livekit_server()}")
    node = LiveKitServer(node_ip=media_address()).start()
    stack.callback(node.stop)
    host = MynaHost.start(node, engine)
    stack.callback(host.stop)
    return Target("myna-room", host.url, engine, host.proc.pid, room_url=node.url)


async def _measure(targets: list[Target], levels: list[int], args: argparse.Namespace) -> dict:
    systems = []
    for target in targets:
        rows = await ramp(target, levels, args.replies, args.max_step_s, args.past, args.seed, args.bound_ms, args.wer)
        lone = await _lone_replies(target, args.seed) if args.wer else []
        systems.append({"label": target.label, "capacity": capacity(rows), "held_through": held_through(rows),
                        "rows": rows, "_lone": lone})
    default = None if args.no_myna else await default_capacity(args.engine)
    return {"bench": "capacity", "bound_ms": args.bound_ms, "max_gaps_per_min": MAX_GAPS_PER_MIN,
            "replies_per_step": args.replies, "levels": levels, "seed": args.seed, "cores": os.cpu_count(),
            "default_max_sessions": default, "systems": systems}


async def default_capacity(engine: str) -> int:
    """What ``myna serve`` takes as its ``--max-sessions`` on this host when none is given
    (:func:`myna.limits.measure_capacity` on the engine, loaded here once the ramps are over)."""
    from myna.engines.build import EngineOptions, build_engines
    from myna.limits import measure_capacity

    engines = build_engines(EngineOptions(engines=engine))
    await engines.start()
    try:
        return await measure_capacity(engines[engine])
    finally:
        await engines.close()


async def _lone_replies(target: Target, seed: int, n: int = 8) -> list[ReplyResult]:
    """``n`` replies of one session alone (Whisper's baseline for ``--wer``); no barge-in."""
    rng = random.Random(seed)
    client = await target.connect()
    try:
        out = []
        for _ in range(n):
            plan = plan_reply(rng)
            plan = ReplyPlan(plan.text, 0.3, plan.first_token_s, None)
            out.append(await speak_reply(client, plan, target.peer, keep_audio=True))
        return out
    finally:
        await client.close()


def _add_wer(result: dict) -> None:
    """Whisper WER per step of the sampled conversation's replies, and of a lone session's."""
    from myna.bench.wer import load_whisper, transcribe, word_error_rate

    model = load_whisper()

    def wer(replies: list[ReplyResult]) -> float | None:
        heard = [(r.text, audio_of(r)) for r in replies if r.audio is not None and len(r.audio)]
        return round(word_error_rate([t for t, _ in heard], [transcribe(model, pcm) for _, pcm in heard]), 3) \
            if heard else None

    for system in result["systems"]:
        system["lone_wer"] = wer(system.pop("_lone"))
        for row in system["rows"]:
            row["wer"] = wer(row["_replies"])


def _ms(value) -> str:
    return "—" if value is None else f"{value:.0f}"


def _progress(line: str) -> None:
    print(f"[capacity] {line}", file=sys.stderr, flush=True)


def format_table(result: dict) -> str:
    """One table per system, then each system's capacity and the ratios between them."""
    lines = [f"Capacity at reply TTFA p95 ≤ {result['bound_ms']:.0f} ms, no underrun, gaps ≤ "
             f"{result['max_gaps_per_min']:g}/min of speech ({result['replies_per_step']} replies a step, "
             f"{result['cores']} cores, load generator on the same machine)"]
    header = ("| system | conversations | replies | TTFA p50 | p95 | p99 | server p50 | gaps/min | underruns | "
              "lost | barge-in p95 | worker CPU % | synthesis load | clients CPU % | WER | holds |")
    lines += ["", header, "|" + "---|" * (header.count("|") - 1)]
    for system in result["systems"]:
        for row in system["rows"]:
            t = row["ttfa_ms"]
            lines.append(f"| {system['label']} | {row['sessions']} | {row['replies']} | {_ms(t['p50'])} | {_ms(t['p95'])} "
                         f"| {_ms(t['p99'])} | {_ms(row['server_ttfa_ms_p50'])} | {row['gaps_per_min']} | "
                         f"{row['underruns']} | {row['lost']} | {_ms(row['barge_in_ms']['p95'])} | "
                         f"{row['worker_pct'] if row['worker_pct'] is not None else '—'} | "
                         f"{row.get('synthesis_load') if row.get('synthesis_load') is not None else '—'} | "
                         f"{row['clients_pct']} | "
                         f"{row.get('wer', '—') if row.get('wer') is not None else '—'} | "
                         f"{'yes' if row['holds'] else 'no'} |")
    lines.append("")
    for system in result["systems"]:
        lone = f" (lone-session WER {system['lone_wer']})" if system.get("lone_wer") is not None else ""
        held = system.get("held_through", system["capacity"])
        firm = f" (every step held up to {held})" if held != system["capacity"] else ""
        lines.append(f"capacity {system['label']}: {system['capacity']} conversations{firm}{lone}")
    if result.get("default_max_sessions") is not None:
        lines.append(f"myna serve's default --max-sessions on this host: {result['default_max_sessions']}")
    base = result["systems"][0]
    for other in result["systems"][1:]:
        ratio = f"{base['capacity'] / other['capacity']:.2f}×" if other["capacity"] else "∞ (the other holds none)"
        lines.append(f"{base['label']} / {other['label']}: {ratio}")
    return "\n".join(lines)
