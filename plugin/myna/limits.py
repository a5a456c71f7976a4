"""Admission limits of a worker: how many sessions, how fast, how much text.

A worker on the internet must bound what one client can take. Three kinds of limit:

- **Sessions.** A global cap (``--max-sessions``; by default the conversations the engine holds
  on this host within ``myna bench capacity``'s latency bound, :func:`measure_capacity`) and a
  per-client cap (a client is the token's identity, or the remote address without keys). Over
  the global cap: 503 ``full``; over a client's cap: 429 ``too_many_sessions``. Both carry
  ``Retry-After``.
- **Rates.** Offers (``POST /api/offer``, WebSocket connections) per client and messages per
  session, each a token bucket (:class:`TokenBucket`): ``burst`` at once, then ``rate`` per
  second. An offer over the rate gets 429 ``rate_limited`` with ``Retry-After``. Messages are
  never dropped from a turn already accepted (its text is bounded by ``max_turn_chars``, an
  empty chunk counting as one character): over the rate the WebSocket holds back the next turn
  (back-pressure), the data channel and room packets refuse a turn that would begin, whole
  (``error`` ``rate_limited`` with its ``turn_id``; :class:`MessageRate`).
- **Turns.** Characters per turn (``turn_too_long``), turns queued per session
  (``too_many_turns``) and how long a turn's input may go quiet (``turn_idle``), enforced by
  :class:`myna.session.Session`.

Every limit is a :class:`Limits` field, a command-line flag (:func:`myna.sessions.add_session_arguments`)
and a ``/metrics`` gauge.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from myna.engines import AudioChunk, Engine
from myna.errors import HTTPError

#: Seconds a refused client is told to wait when the worker or its own session cap is full
#: (a guess: sessions last seconds to minutes; the client retries, it does not spin).
RETRY_WHEN_FULL_S = 5
#: Sentence synthesised to measure an engine's capacity (about 3 s of speech).
CAPACITY_TEXT = "The weather today is sunny, with a light breeze from the west and a few clouds."
#: The share of a conversation's time the agent speaks under ``myna bench capacity``'s load
#: (replies of 8–40 words at LLM pace after 2–6 s of the user): its ``speech_share`` column
#: (0.47–0.58 over the steps of one run).
SPEECH_SHARE = 0.55
#: The engine's busy share at the bound: ``myna bench capacity``'s measured capacity × SPEECH_SHARE
#: ÷ the real-time streams :func:`measure_capacity` finds on the same host: 14 × 0.55 ÷ 20.5 on
#: two cores with the bundled Piper voice (three ramps of 60 replies a step: 14 conversations held
#: in all three, 16 in the two that tried it, 12 broke once on gaps, 1.13 a minute; was 0.25 from
#: 8 × 0.55 ÷ 17.5, before the urgent threads). Low because the bound is tight: at LLM pace a
#: reply's first phrase waits ~70–130 ms for its words, which leaves little for waiting behind
#: other sessions' jobs; past it, pauses mid-reply break the bound first.
BOUND_UTILISATION = 0.38

@dataclass
class Limits:
    """A worker's limits (the defaults are ``myna serve``'s); ``None`` turns one off.

    Attributes:
        max_sessions: sessions open at once, WebRTC and WebSocket together (``myna serve``
            measures it when not given: :func:`measure_capacity`).
        max_sessions_per_client: sessions one client (identity or address) may hold at once.
        offer_rate: offers (and WebSocket connections) per second per client, sustained.
        offer_burst: offers a client may make back to back before ``offer_rate`` applies.
        message_rate: client messages per second per session, sustained.
        message_burst: messages a session may send back to back.
        max_turn_chars: characters of text one turn may carry.
        max_queued_turns: turns a session may have open or queued at once.
        turn_idle_s: seconds a turn's input may go without text before it ends as ``end_turn``
            would (an ``error`` ``turn_idle`` says so): a sender that crashed, or a stream
            whose close was lost, must not hold the session (and the worker's load) forever.
    """

    max_sessions: int | None = None
    max_sessions_per_client: int | None = 8
    offer_rate: float | None = 1.0
    offer_burst: int = 10
    message_rate: float | None = 200.0
    message_burst: int = 400
    max_turn_chars: int | None = 10_000
    max_queued_turns: int | None = 8
    turn_idle_s: float | None = 10.0

    @classmethod
    def off(cls) -> "Limits":
        """No limit at all (a worker built in code, e.g. by a benchmark, unless it asks)."""
        return cls(None, None, None, 1, None, 1, None, None, None)


class LimitExceeded(HTTPError):
    """A request refused by a limit: HTTP ``status``, contract ``code``, ``retry_after`` (s)."""


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` per second (a rate of 0 or None: unlimited).

    Args:
        rate: tokens added per second.
        burst: bucket size (tokens available at once).
        clock: monotonic clock in seconds.
    """

    def __init__(self, rate: float | None, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self._clock = rate, max(1, burst), clock
        self._tokens = float(self.burst)
        self._at = clock()

    def take(self) -> float:
        """Take one token; returns 0.0 on success, else seconds until one is available."""
        if not self.rate:
            return 0.0
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate

    def reserve(self) -> float:
        """Take one token even if none is left (the bucket goes into debt); returns seconds until
        the debt is paid (0.0: a token was there). For a caller that waits that long."""
        if not self.rate:
            return 0.0
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate) - 1.0
        self._at = now
        return max(0.0, -self._tokens) / self.rate

    @property
    def full(self) -> bool:
        """True when the bucket has refilled completely (its state can be forgotten)."""
        return not self.rate or self._tokens + (self._clock() - self._at) * self.rate >= self.burst


class MessageRate:
    """The message rate cap of one session: a :class:`TokenBucket` that protects the worker
    without losing words. Two ways to apply it, by what the door can do:

    - :meth:`pace` (a door that can stop reading: the WebSocket): back-pressure. A message
      that begins a turn (or any other than the open turn's text and ``end_turn``) counts, and
      over the rate the door waits before handling it and reading on (TCP pushes back on the
      client); nothing is dropped. The open turn's text goes straight in, as with :meth:`allow`
      (a pause of the reader mid-turn could cut a word at the quiet time).
    - :meth:`allow` (a door that cannot: the data channel, room data packets): a message that
      continues a turn the session has accepted (its text, its ``end_turn``) and ``interrupt``
      are always taken; they count, so they slow the next turn's start. A message that would
      begin a turn is refused over the rate, and the session refuses that whole turn
      (:meth:`myna.session.Session.handle`): no turn is ever spoken with words missing. The
      first refusal after an accepted message is reported (one ``error`` event), the rest
      silently, so a flood cannot draw a flood of errors.

    A turn's text is bounded anyway by ``max_turn_chars`` and the turns by ``max_queued_turns``.
    """

    def __init__(self, rate: float | None, burst: int, clock: Callable[[], float] = time.monotonic):
        self._bucket = TokenBucket(rate, burst, clock)
        self._reported = False
        self.message = f"too many messages; at most {rate or 0:g} per second (burst {burst}); this one was dropped"
        self.turn_message = (f"too many messages; at most {rate or 0:g} per second (burst {burst}): this turn was "
                             "refused whole; send it again, with a new turn_id, more slowly (coalesce tokens)")

    def allow(self, continues_turn: bool = False) -> tuple[bool, bool]:
        """``(accept, report)`` for the next message; ``continues_turn``: it carries text or the
        end of a turn already accepted, or is an ``interrupt`` (always accepted, and counted)."""
        if not self._bucket.take():
            if not continues_turn:
                self._reported = False
            return True, False
        if continues_turn:
            return True, False
        report, self._reported = not self._reported, True
        return False, report

    def pace(self) -> float:
        """Count the next message; seconds to wait before handling it (0.0: at once)."""
        return self._bucket.reserve()


@dataclass
class Admission:
    """Counts sessions per client and paces offers; one per worker.

    Args:
        limits: the worker's limits (``max_sessions`` must be set before :meth:`admit`).
        clock: monotonic clock in seconds.
    """

    limits: Limits
    clock: Callable[[], float] = time.monotonic
    sessions: dict[str, int] = field(default_factory=dict)  # client → open sessions
    _offers: dict[str, TokenBucket] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Sessions open now."""
        return sum(self.sessions.values())

    @property
    def full(self) -> bool:
        return self.limits.max_sessions is not None and self.total >= self.limits.max_sessions

    def admit(self, client: str, client_max: int | None = None) -> None:
        """Check that ``client`` may open one more session now, and count the offer.

        ``client_max`` tightens the per-client cap (a token's ``myna.max_sessions`` claim).
        Call :meth:`hold` once the session exists.

        Raises:
            LimitExceeded: 503 ``full``, 429 ``too_many_sessions`` or 429 ``rate_limited``.
        """
        if self.full:
            raise LimitExceeded(503, "full", f"the worker is at its limit of {self.limits.max_sessions} sessions",
                                RETRY_WHEN_FULL_S)
        cap = min((c for c in (self.limits.max_sessions_per_client, client_max) if c is not None), default=None)
        if cap is not None and self.sessions.get(client, 0) >= cap:
            raise LimitExceeded(429, "too_many_sessions", f"at most {cap} sessions per client", RETRY_WHEN_FULL_S)
        self._forget_idle_buckets()
        bucket = self._offers.get(client)
        if bucket is None:
            bucket = self._offers[client] = TokenBucket(self.limits.offer_rate, self.limits.offer_burst, self.clock)
        wait = bucket.take()
        if wait:
            raise LimitExceeded(429, "rate_limited", f"too many offers; at most {self.limits.offer_rate:g} per second",
                                max(1, math.ceil(wait)))

    def hold(self, client: str) -> Callable[[], None]:
        """Count a session of ``client``; returns the function that releases it (idempotent)."""
        self.sessions[client] = self.sessions.get(client, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.sessions[client] -= 1
                if not self.sessions[client]:
                    del self.sessions[client]

        return release

    def _forget_idle_buckets(self) -> None:
        if len(self._offers) > 1024:  # bound memory: a refilled bucket is the same as none
            for client in [c for c, b in self._offers.items() if b.full]:
                del self._offers[client]


def conversations_at_bound(audio_s: float, wall_s: float, utilisation: float = BOUND_UTILISATION,
                           speech_share: float = SPEECH_SHARE) -> int:
    """Conversations an engine holds at the latency bound, from what it synthesised flat out.

    ``audio_s ÷ wall_s`` is how many real-time streams the engine sustains with every synthesis
    thread busy (R). A conversation keeps ``speech_share`` of a stream busy, and the bound held
    while the engine was busy ``utilisation`` of the time, so the engine holds
    ``floor(utilisation × R ÷ speech_share)`` conversations, at least 1.

    Args:
        audio_s: seconds of audio synthesised.
        wall_s: wall seconds it took, every thread busy (> 0).
        utilisation: the engine's busy share at ``myna bench capacity``'s bound
            (:data:`BOUND_UTILISATION`).
        speech_share: the share of a conversation's time the agent speaks (:data:`SPEECH_SHARE`).
    """
    return max(1, math.floor(utilisation * audio_s / max(wall_s, 1e-6) / speech_share))


async def measure_capacity(engine: Engine, streams: int | None = None, utilisation: float = BOUND_UTILISATION,
                           speech_share: float = SPEECH_SHARE) -> int:
    """Conversations ``engine`` holds on this host within ``myna bench capacity``'s bound (reply
    TTFA p95 ≤ 250 ms, no underrun, gaps ≤ 1 a minute), measured now: ``myna serve``'s default
    ``--max-sessions`` and ``myna worker``'s default capacity.

    Synthesises :data:`CAPACITY_TEXT` on ``streams`` concurrent streams (default: two per
    synthesis thread, so every thread stays busy) and returns :func:`conversations_at_bound` of
    the audio made and the time it took. It measures through
    :meth:`~myna.engines.base.Engine.warms_through`, as the phrase cache's warm-up does: a
    fallback's primary, whose breaker must not count these turns (streams at once can be more
    than the primary keeps up with, which opened the breaker for the first 30 s of service).

    Raises:
        EngineError: when the engine fails to synthesise.
    """

    engine = engine.warms_through
    if streams is None:
        streams = 2 * getattr(getattr(engine, "scheduler", None), "workers", 2)

    async def one() -> float:
        stream = engine.stream(None, group=object())
        stream.push_text(CAPACITY_TEXT)
        stream.end_input()
        return sum(item.duration_ms for item in [i async for i in stream] if isinstance(item, AudioChunk)) / 1000.0

    t0 = time.monotonic()
    audio_s = sum(await asyncio.gather(*(one() for _ in range(streams))))
    return conversations_at_bound(audio_s, time.monotonic() - t0, utilisation, speech_share)
