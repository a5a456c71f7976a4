"""Virtual-clock simulation of an engine feeding playout, for the tests and ``myna bench playout``.

A :class:`Producer` lists when each chunk of a turn arrives (seconds after the turn's text) and
how many 48 kHz samples it carries; one whose chunks end at word boundaries (a clause per chunk,
like Piper) says so with a ``chunks_end_at_words = True`` attribute, and playout then treats a
late chunk as a gap (:mod:`myna.audio.playout`). :func:`simulate_paced` drives the real
:class:`~myna.rtc.track.PacedAudioTrack` and :class:`~myna.audio.playout.Playout` on a virtual
clock whose sleeps wake late by a sampled overshoot (the event loop's timer error), delivering
chunks at their arrival times; :func:`simulate_sleep_writer` models the common framework writer
that sends each chunk's frames as soon as it has them, then sleeps the chunk's duration. Both
return a :class:`SimResult` of per-turn added latency and underruns and per-frame deadline
deviation.

Deadline deviation of a frame = the time it is handed to the network − ``anchor + pts / 48000``:
how far the sender's clock has slipped against the stream's own timestamps (what the
receiver's jitter buffer must absorb). The paced track keeps one anchor for the whole stream;
the writer is re-anchored at the start of each turn (its ``pts`` only advance with audio).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import av
import numpy as np

from myna.audio.playout import FRAME_SAMPLES, MAX_HOLD_S, SAMPLE_RATE, Playout
from myna.audio.preroll import PreRollRule
from myna.events import FirstAudio, TurnDone

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


@dataclass
class Chunk:
    """One chunk: arrives ``at`` seconds after the turn's text; carries ``samples`` at 48 kHz."""

    at: float
    samples: int


Producer = Callable[[random.Random, float], list[Chunk]]
"""(rng, audio seconds) → the turn's chunks in arrival order."""


def fast_steady(rng: random.Random, seconds: float, startup: float = 0.05) -> list[Chunk]:
    """A GPU DSM loop: 80 ms chunks every 10 ms after ``startup`` s (real-time factor 0.125)."""
    n = max(1, round(seconds / 0.08))
    return [Chunk(startup + 0.01 * i, 3840) for i in range(n)]


def bursty_sentences(rng: random.Random, seconds: float, rtf: float = 0.8, startup: float = 0.05) -> list[Chunk]:
    """A clause-at-a-time CPU voice: sentences of 1–3 s, each delivered whole once computed at
    ``rtf`` × (1 ± 20 %); the average keeps up with real time."""
    chunks, t, left = [], startup, seconds
    while left > 1e-9:
        d = min(left, rng.uniform(1.0, 3.0))
        t += d * rtf * rng.uniform(0.8, 1.2)
        chunks.append(Chunk(t, round(d * SAMPLE_RATE)))
        left -= d
    return chunks


bursty_sentences.chunks_end_at_words = True


def jittery(rng: random.Random, seconds: float, rtf: float = 0.9, jitter: float = 0.5, startup: float = 0.05) -> list[Chunk]:
    """80 ms chunks at real-time factor ``rtf``, each gap × U(1 − jitter, 1 + jitter)."""
    n = max(1, round(seconds / 0.08))
    t, chunks = startup, []
    for _ in range(n):
        t += 0.08 * rtf * rng.uniform(1 - jitter, 1 + jitter)
        chunks.append(Chunk(t, 3840))
    return chunks


def slow(rng: random.Random, seconds: float) -> list[Chunk]:
    """Slower than real time: 80 ms chunks at real-time factor 1.2 (± 10 % jitter)."""
    return jittery(rng, seconds, rtf=1.2, jitter=0.1)


def alternating(rng: random.Random, seconds: float, startup: float = 0.05) -> list[Chunk]:
    """Exactly real time on average, unevenly: 80 ms chunks after gaps of 40 and 120 ms in turn
    (a rule that learns "slower than real time" from the long gaps holds later turns)."""
    n = max(1, round(seconds / 0.08))
    t, chunks = startup, []
    for i in range(n):
        if i:
            t += 0.04 if i % 2 else 0.12
        chunks.append(Chunk(t, 3840))
    return chunks


PRODUCERS: dict[str, Producer] = {
    "fast_steady": fast_steady,
    "bursty_sentences": bursty_sentences,
    "rtf0.9_jitter50": jittery,
    "rtf1.2": slow,
    "alternating": alternating,
}


def timer_overshoot(mean_s: float = 0.0003, stall_p: float = 0.002, stall_s: float = 0.015) -> Callable[[random.Random], float]:
    """A synthetic late-wake-up model: exponential with ``mean_s``, plus a ``stall_s`` stall
    with probability ``stall_p`` (a GC pause or a busy event loop)."""

    def draw(rng: random.Random) -> float:
        late = rng.expovariate(1.0 / mean_s) if mean_s > 0 else 0.0
        return late + (stall_s if rng.random() < stall_p else 0.0)

    return draw


@dataclass
class SimResult:
    """What one simulated session did."""

    added_latency_ms: list[float] = field(default_factory=list)  # per turn (see the functions)
    underruns: list[int] = field(default_factory=list)  # per turn
    gaps: list[int] = field(default_factory=list)  # per turn: pauses at a chunk boundary
    gap_ms: list[float] = field(default_factory=list)  # per turn: silence those pauses inserted
    deviation_ms: list[float] = field(default_factory=list)  # per frame
    audio_s: float = 0.0  # audio played (s)
    stream_s: float = 0.0  # stream length (virtual s)
    cpu_s: float = 0.0  # process CPU spent in playout code (s)
    pre_roll_ms: list[float] = field(default_factory=list)  # per turn, from first_audio

    @property
    def drift_ms(self) -> float:
        """Deadline deviation of the last frame (ms)."""
        return self.deviation_ms[-1] if self.deviation_ms else 0.0


class _VirtualLoop:
    """A clock plus a sleep that wakes late and delivers due producer chunks on the way."""

    def __init__(self, rng: random.Random, overshoot: Callable[[random.Random], float], t0: float = 1000.0):
        self.t = t0
        self.rng = rng
        self.overshoot = overshoot
        self.pending: list[tuple[float, Callable[[], None]]] = []  # (time, action), sorted

    def clock(self) -> float:
        return self.t

    def run_until(self, target: float) -> None:
        while self.pending and self.pending[0][0] <= target:
            at, action = self.pending.pop(0)
            self.t = max(self.t, at)
            action()
        self.t = max(self.t, target)

    async def sleep(self, seconds: float) -> None:
        self.run_until(self.t + seconds + self.overshoot(self.rng))


def _turn_plan(rng: random.Random, producer: Producer, turns: int, turn_s: tuple[float, float]) -> list[list[Chunk]]:
    return [producer(rng, rng.uniform(*turn_s)) for _ in range(turns)]


def _tone(samples: int, phase: int) -> np.ndarray:
    t = (phase + np.arange(samples)) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32)


def simulate_paced(
    producer: Producer,
    pre_roll: PreRollRule,
    *,
    max_hold_s: float = MAX_HOLD_S,
    turns: int = 5,
    turn_s: tuple[float, float] = (6.0, 10.0),
    gap_s: float = 0.5,
    seed: int = 0,
    overshoot: Callable[[random.Random], float] | None = None,
) -> SimResult:
    """Play ``turns`` turns (each ``turn_s`` s of audio, the next one's text ``gap_s`` after the
    previous turn's last frame) through the paced track and a :class:`Playout`.

    Added latency of a turn = the frame deadline it started on − the first deadline at or after
    its first chunk arrived (what the pre-roll rule added beyond frame quantisation), in ms;
    ``max_hold_s`` is the start rule's budget.
    The track hands out frames (``opus=None``), so ``cpu_s`` is playout plus frame making, no
    encoding.
    """
    from myna.rtc.track import PacedAudioTrack  # the track imports aiortc; keep the audio package light

    rng = random.Random(seed)
    plan = _turn_plan(rng, producer, turns, turn_s)
    vloop = _VirtualLoop(random.Random(seed + 1), overshoot or timer_overshoot())
    events: list = []
    playout = Playout(events.append, clock=vloop.clock, pre_roll=pre_roll, max_hold_s=max_hold_s,
                      chunks_end_at_words=getattr(producer, "chunks_end_at_words", False))
    track = PacedAudioTrack(playout, clock=vloop.clock, sleep=vloop.sleep, opus=None)  # frames: no encoding here
    result = SimResult()
    cpu = [0.0]

    def push(turn_id: str, chunk: Chunk, phase: int, last: bool) -> None:
        pcm = _tone(chunk.samples, phase)
        c0 = time.process_time()
        playout.push_audio(turn_id, pcm, SAMPLE_RATE)
        if last:
            playout.end_turn(turn_id)
        cpu[0] += time.process_time() - c0

    async def run() -> None:
        first_deadline = None
        anchor = None
        for k, chunks in enumerate(plan):
            turn_id = f"t{k}"
            text_at = vloop.t
            playout.begin_turn(turn_id, text_at)
            phase = 0
            for i, chunk in enumerate(chunks):
                vloop.pending.append(
                    (text_at + chunk.at, lambda tid=turn_id, c=chunk, p=phase, last=(i == len(chunks) - 1): push(tid, c, p, last))
                )
                phase += chunk.samples
            vloop.pending.sort(key=lambda item: item[0])
            first_arrival = text_at + chunks[0].at
            n_events = len(events)
            started_deadline = None
            while True:
                c0 = time.process_time()
                frame = await track.recv()
                cpu[0] += time.process_time() - c0
                sent = vloop.t
                if anchor is None:
                    anchor = sent
                deadline = anchor + frame.pts / SAMPLE_RATE
                result.deviation_ms.append(1000.0 * (sent - anchor - frame.pts / SAMPLE_RATE))
                if first_deadline is None and sent >= first_arrival - 1e-9:
                    first_deadline = deadline
                new = events[n_events:]
                n_events = len(events)
                if started_deadline is None and any(isinstance(e, FirstAudio) for e in new):
                    started_deadline = deadline
                    result.pre_roll_ms.append(next(e.pre_roll_ms for e in new if isinstance(e, FirstAudio)))
                done = [e for e in new if isinstance(e, TurnDone)]
                if done:
                    result.underruns.append(done[0].underruns)
                    result.gaps.append(done[0].gap_ms["count"])
                    result.gap_ms.append(done[0].gap_ms["total"])
                    result.audio_s += done[0].audio_ms / 1000.0
                    break
            result.added_latency_ms.append(1000.0 * (started_deadline - first_deadline))
            first_deadline = None
            idle_until = vloop.t + gap_s
            while vloop.t < idle_until:  # idle frames between turns
                c0 = time.process_time()
                frame = await track.recv()
                cpu[0] += time.process_time() - c0
                result.deviation_ms.append(1000.0 * (vloop.t - anchor - frame.pts / SAMPLE_RATE))
        result.stream_s = len(result.deviation_ms) * FRAME_S

    asyncio.run(run())
    result.cpu_s = cpu[0]
    return result


def simulate_sleep_writer(
    producer: Producer,
    *,
    turns: int = 5,
    turn_s: tuple[float, float] = (6.0, 10.0),
    gap_s: float = 0.5,
    seed: int = 0,
    overshoot: Callable[[random.Random], float] | None = None,
) -> SimResult:
    """The common framework writer: when a chunk is there, send all its 20 ms frames at once,
    then sleep the chunk's duration (relative sleeps, so timer overshoot accumulates); when the
    next chunk is not there on wake-up, wait for it (one underrun per such gap).

    Added latency is 0 by construction (it never waits for a buffer); deviation is measured
    against an anchor at each turn's first frame.
    """
    rng = random.Random(seed)
    plan = _turn_plan(rng, producer, turns, turn_s)
    orng = random.Random(seed + 1)
    draw = overshoot or timer_overshoot()
    result = SimResult()
    t = 1000.0
    for chunks in plan:
        text_at = t
        anchor = None
        pts = 0
        underruns = 0
        carry = 0  # samples left over from the previous chunk (frames are whole)
        c0 = time.process_time()
        for i, chunk in enumerate(chunks):
            arrival = text_at + chunk.at
            if arrival > t:
                if anchor is not None:
                    underruns += 1
                t = arrival
            total = carry + chunk.samples
            frames, carry = divmod(total, FRAME_SAMPLES)
            if i == len(chunks) - 1 and carry:
                frames, carry = frames + 1, 0
            pcm = (_tone(chunk.samples, pts) * 32767).astype(np.int16)
            for f in range(frames):  # all back to back
                block = np.zeros((1, FRAME_SAMPLES), np.int16)
                part = pcm[f * FRAME_SAMPLES : (f + 1) * FRAME_SAMPLES]
                block[0, : len(part)] = part
                av.AudioFrame.from_ndarray(block, format="s16", layout="mono")
                if anchor is None:
                    anchor = t
                result.deviation_ms.append(1000.0 * (t - anchor - pts / SAMPLE_RATE))
                pts += FRAME_SAMPLES
            t += chunk.samples / SAMPLE_RATE + draw(orng)  # sleep the chunk's duration
        result.cpu_s += time.process_time() - c0
        result.added_latency_ms.append(0.0)
        result.underruns.append(underruns)
        result.audio_s += pts / SAMPLE_RATE
        t += gap_s
    result.stream_s = t - 1000.0
    return result


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0–100) of ``values``; NaN when empty."""
    return float(np.percentile(values, q)) if values else math.nan
