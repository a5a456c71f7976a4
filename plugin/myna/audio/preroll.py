"""Pre-roll: when a turn may resume after an underrun (or start) without a predicted underrun.

Where this rule applies: frame-level producers (DSM), whose chunks may end inside a word, so
that starving cuts a word. Playout (:mod:`myna.audio.playout`) uses it there to re-buffer
mid-turn, and lets it hold a turn's first audio only within the start rule's budget
(``--max-hold-ms``, 100 ms): before the first syllable, waiting costs more than a later stall.
Producers whose chunks end at word boundaries (Piper) never consult it: they start at once and
pause between words when a chunk is late.

A producer (an engine) hands playout chunks of audio at uneven times. Once playout starts, audio
position ``x`` (seconds into the turn) is due at ``start + x``; a chunk that arrives after the
frame that needs it is an underrun. So the only question is how much audio must be buffered
before the first frame goes out. :class:`ProducerStats` records, per turn, when each chunk arrived
(``clock`` seconds) and how much audio it carried (seconds); a rule turns that into a yes/no at
every 20 ms frame deadline.

The jitter-aware rule (:class:`JitterAwarePreRoll`), evaluated at each frame deadline ``now``:

1. **Model the producer.** ``r`` = its real-time factor (compute seconds per audio second): the
   slope of arrival time against audio carried, ``(t_n − t_1) / (A_n − d_1)`` over chunks
   2..n. ``σ`` = its jitter: the RMS of (inter-arrival gap − ``r`` × chunk) in seconds.
   ``d`` = the next chunk's size: the largest chunk this session has shown (while the session has
   seen a single chunk, 2 × that chunk). Before a turn has two chunks, ``r`` and ``σ`` come from
   the session's previous turn (same engine); in a session's first turn, from the first chunk's
   own delay, ``min(1, (t_1 − text_at) / d_1)`` (pessimistic: it includes text and start-up), and
   ``σ = r·d / 4``. Once the turn has gaps of its own, its rate is blended with the prior at
   weight (gaps seen) : 4.
2. **Predict.** The next chunk should arrive ``r·d`` after the last one: ``wait`` = that time
   from now, plus ``z·σ`` for its own jitter (``z`` = 2). After it, the lateness of audio position
   ``x`` (s) against real time moves like a random walk with drift: ``(r − 1)·x + z_w·σ·√(x/d)``.
   Its maximum over the next ``H`` = 2 s of audio is ``L``: for ``r < 1``,
   ``z_w²σ² / (4(1 − r)·d)`` (bounded: a producer that keeps up only needs its jitter covered;
   with ``z_w`` = 3 the walk passes ``L`` with probability ≈ ``exp(−z_w²/2)`` ≈ 1 %);
   for ``r ≥ 1``, ``(r − 1)·H + z_w·σ·√(H/d)``, capped at 1 s.
3. **Start** when the buffered audio (s) ≥ ``wait + L + margin`` (margin = 25 ms: one frame plus
   the 5 ms fade, since a frame is only cut from a buffer holding a frame and a fade), or at once
   when the turn's input has ended (nothing more can be late).

The same rule decides when to resume after an underrun (re-buffering), so a producer slower than
real time stalls about once per 2–3 s of audio instead of on every chunk.

What it does within the 100 ms start budget (``myna bench playout``,
``tests/audio/test_preroll.py``): a fast producer (80 ms every 10 ms) starts on its first or
second chunk (≤ 20 ms added); one at 0.9 × real time with ±50 % jitter starts within the budget
and underruns a tenth as often as starting on any frame; one at 1.2 × real time stalls about
once per 3 s of audio where a 200 ms pre-roll stalls three times as often and the v1 rule on
nearly every chunk; one that is real time on average with gaps of 40 and 120 ms in turn plays
clean, its later turns no longer held for what the first one taught the rule. (Without the
budget, the rule held a bursty clause-per-chunk producer for seconds before its first word.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

#: Audio that must be buffered beyond the prediction: one 20 ms frame plus the 5 ms fade (s).
MARGIN_S = 0.025
#: Weight of the session's prior rate, in inter-arrival gaps of the current turn.
PRIOR_GAPS = 4


class ProducerStats:
    """Arrival times of one turn's chunks against the audio they carry.

    Args:
        text_at: when the turn's first text chunk arrived (``clock`` seconds).
    """

    def __init__(self, text_at: float):
        self.text_at = text_at
        self.times: list[float] = []  # arrival of each chunk (clock s)
        self.durations: list[float] = []  # audio carried by each chunk (s)
        self.audio_s = 0.0  # audio received so far (s)

    def add(self, at: float, seconds: float) -> None:
        """Record a chunk of ``seconds`` of audio arriving at ``at`` (clock s); empty chunks are ignored."""
        if seconds > 0:
            self.times.append(at)
            self.durations.append(seconds)
            self.audio_s += seconds

    @property
    def n(self) -> int:
        """Chunks received."""
        return len(self.times)

    def rate(self) -> float | None:
        """Real-time factor over chunks 2..n (compute s per audio s); None before two chunks."""
        if self.n < 2:
            return None
        return (self.times[-1] - self.times[0]) / (self.audio_s - self.durations[0])

    def first_chunk_rate(self) -> float | None:
        """The first chunk's delay per audio second since the text arrived (an upper bound on the rate)."""
        if not self.n:
            return None
        return max(0.0, self.times[0] - self.text_at) / self.durations[0]

    def jitter(self, rate: float) -> float | None:
        """RMS of (gap − rate × chunk) over chunks 2..n, in s; None before three chunks."""
        if self.n < 3:
            return None
        err = [
            (self.times[i] - self.times[i - 1]) - rate * self.durations[i] for i in range(1, self.n)
        ]
        return math.sqrt(sum(e * e for e in err) / len(err))

    def next_chunk_s(self, unknown_factor: float) -> float:
        """Predicted size of the next chunk (s): the largest seen; ``unknown_factor`` × the first
        while only one has arrived (the spread of sizes is still unknown)."""
        biggest = max(self.durations)
        return unknown_factor * biggest if self.n < 2 else biggest

    def hindsight_pre_roll_s(self) -> float:
        """The smallest start delay after the first chunk that would have played this turn without
        an underrun: ``max_i (t_i − t_1 − A_{i−1})`` (s), margin not included."""
        worst, before = 0.0, 0.0
        for t, d in zip(self.times, self.durations):
            worst = max(worst, t - self.times[0] - before)
            before += d
        return worst


class PreRollRule(Protocol):
    """Decides when a turn starts (or resumes after an underrun)."""

    def ready(self, stats: ProducerStats, buffered_s: float, now: float) -> bool:
        """True when the turn may play now with ``buffered_s`` seconds of audio queued."""

    def turn_finished(self, stats: ProducerStats) -> None:
        """Learn from a finished turn (the next turn of the session uses it as its prior)."""


@dataclass
class FixedPreRoll:
    """Start (and resume) once ``seconds`` of audio are buffered, or at least one frame plus
    the fade (the v1 rule when ``seconds`` is 0)."""

    seconds: float = 0.0

    def ready(self, stats: ProducerStats, buffered_s: float, now: float) -> bool:
        return buffered_s >= max(self.seconds, MARGIN_S)

    def turn_finished(self, stats: ProducerStats) -> None:
        pass


@dataclass
class JitterAwarePreRoll:
    """The rule in the module docstring; one instance per session (it keeps the session's prior).

    Args:
        margin_s: audio needed beyond the prediction (s).
        horizon_s: audio ahead (s) over which a slower-than-real-time producer must not starve.
        z: quantile of the next gap's jitter, in standard deviations.
        z_walk: quantile of the random walk's maximum; the walk passes ``L`` with probability
            about ``exp(−z_walk² / 2)`` per turn (1 % at 3).
        unknown_chunk_factor: next chunk size / first chunk size while only one chunk is known.
        max_drift_s: cap on the predicted lateness after the next chunk (s), so a producer far
            slower than real time still starts (and stalls) within about a second.
        max_buffer_s: the required buffer never exceeds this (s).
    """

    margin_s: float = MARGIN_S
    horizon_s: float = 2.0
    z: float = 2.0
    z_walk: float = 3.0
    unknown_chunk_factor: float = 2.0
    max_drift_s: float = 1.0
    max_buffer_s: float = 5.0
    prior_rate: float | None = None
    prior_jitter_s: float | None = None
    prior_chunk_s: float | None = None

    def required_s(self, stats: ProducerStats, now: float) -> float:
        """Seconds of buffered audio needed to start at ``now`` (inf before any audio)."""
        if not stats.n:
            return math.inf
        if self.prior_chunk_s is not None:  # the session has shown its chunk sizes
            d = max(self.prior_chunk_s, max(stats.durations))
        else:
            d = stats.next_chunk_s(self.unknown_chunk_factor)
        r = stats.rate()
        if r is None:
            r = self.prior_rate if self.prior_rate is not None else min(1.0, stats.first_chunk_rate())
        elif self.prior_rate is not None:  # a few gaps are a noisy estimate: lean on the prior
            gaps = stats.n - 1
            r = (PRIOR_GAPS * self.prior_rate + gaps * r) / (PRIOR_GAPS + gaps)
        sigma = stats.jitter(r)
        if sigma is None:
            sigma = self.prior_jitter_s if self.prior_jitter_s is not None else 0.25 * r * d
        wait = max(0.0, stats.times[-1] + r * d - now) + self.z * sigma
        drift = min(worst_lateness(r, sigma, d, self.horizon_s, self.z_walk), self.max_drift_s)
        return min(wait + drift + self.margin_s, self.max_buffer_s)

    def ready(self, stats: ProducerStats, buffered_s: float, now: float) -> bool:
        return buffered_s >= max(self.required_s(stats, now), self.margin_s)

    def turn_finished(self, stats: ProducerStats) -> None:
        if stats.n:
            self.prior_chunk_s = max(self.prior_chunk_s or 0.0, max(stats.durations))
        r = stats.rate()
        if r is not None:
            self.prior_rate = r
            sigma = stats.jitter(r)
            if sigma is not None:
                self.prior_jitter_s = sigma


def worst_lateness(rate: float, sigma: float, chunk_s: float, horizon_s: float, z: float) -> float:
    """``max_{0 ≤ x ≤ H} (rate − 1)·x + z·σ·√(x / chunk)`` in seconds (see the module docstring).

    Args:
        rate: real-time factor (compute s per audio s).
        sigma: RMS jitter of inter-arrival gaps (s).
        chunk_s: chunk size (s), the step of the random walk.
        horizon_s: audio ahead considered (s).
        z: quantile in standard deviations.
    """
    chunk_s = max(chunk_s, 1e-3)
    spread = z * sigma / math.sqrt(chunk_s)  # lateness spread per √(audio s)
    at_horizon = (rate - 1.0) * horizon_s + spread * math.sqrt(horizon_s)
    if rate >= 1.0:
        return max(0.0, at_horizon)
    x = (spread / (2.0 * (1.0 - rate))) ** 2  # where the drift overtakes the spread
    if x >= horizon_s:
        return max(0.0, at_horizon)
    return spread * spread / (4.0 * (1.0 - rate))
