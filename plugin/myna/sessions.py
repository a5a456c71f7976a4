"""The sessions of one process: opened with the same limits, counted, drained together.

Every door opens its sessions here (:meth:`Sessions.open`), so a session behind a LiveKit room
or a plug-in gets the same turn limits, start budget, metrics and drain as one behind
``myna serve``'s data channel or WebSocket:

- **Admission** (:meth:`Sessions.admit`): sessions at once and per client, and the pace of new
  ones (:class:`~myna.limits.Admission`); refused while draining.
- **Limits**: each session applies the per-turn limits (:class:`~myna.limits.Limits`), each
  door that reads messages from a network peer applies :meth:`Sessions.message_rate`.
- **Drain** (:meth:`Sessions.drain`, on SIGTERM): new sessions and new turns are refused
  (``draining``), turns already speaking finish, up to a timeout.

The sessions of one ``myna worker`` live on several event loops (a job thread per room); what
this class does across them is only set flags and read them.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Callable

from myna.audio.playout import MAX_HOLD_S
from myna.engines import Engine
from myna.engines.build import milliseconds
from myna.errors import HTTPError
from myna.limits import RETRY_WHEN_FULL_S, Admission, Limits, MessageRate
from myna.messages import TurnDefaults
from myna.metrics import Metrics
from myna.session import EventSink, Session, TurnOutput


class Sessions:
    """The process's open sessions and the settings they are opened with.

    Args:
        metrics: the process's metrics (a new registry by default).
        limits: the limits (default: none at all, :meth:`~myna.limits.Limits.off`).
        max_hold_s: the start rule's budget of every session (s; ``--max-hold-ms``).
    """

    def __init__(self, metrics: Metrics | None = None, limits: Limits | None = None, max_hold_s: float = MAX_HOLD_S):
        self.metrics = metrics or Metrics()
        self.limits = limits or Limits.off()
        self.max_hold_s = max_hold_s
        self.admission = Admission(self.limits)
        self.draining = False
        self._open: set[Session] = set()
        self._lock = threading.Lock()  # sessions open and close on the job threads of `myna worker`

    def admit(self, client: str, client_max: int | None = None) -> Callable[[], None]:
        """Take a session slot for ``client``; returns its release function (idempotent).

        Raises:
            HTTPError: 503 ``draining``.
            LimitExceeded: 503 ``full``, 429 ``too_many_sessions`` / ``rate_limited``.
        """
        if self.draining:
            raise HTTPError(503, "draining", "the worker is shutting down; connect to another", RETRY_WHEN_FULL_S)
        with self._lock:
            self.admission.admit(client, client_max)
            return self.admission.hold(client)

    def open(self, engine: Engine, output: Callable[[Session], TurnOutput], send: EventSink, *,
             defaults: TurnDefaults = TurnDefaults(), clock: Callable[[], float] = time.monotonic) -> Session:
        """A new session with this process's limits (draining already if the process is) and
        ``defaults`` for its turns (:class:`~myna.messages.TurnDefaults`)."""
        session = Session(engine, output, send, self.metrics, defaults=defaults, limits=self.limits,
                          max_hold_s=self.max_hold_s, clock=clock)
        with self._lock:
            self._open.add(session)
        session.on_close(lambda: self._closed(session))
        if self.draining:
            session.drain()
        return session

    def _closed(self, session: Session) -> None:
        with self._lock:
            self._open.discard(session)

    def message_rate(self) -> MessageRate:
        """The message rate cap of one network peer (``--message-rate``, ``--message-burst``)."""
        return MessageRate(self.limits.message_rate, self.limits.message_burst)

    def all(self) -> list[Session]:
        """Every open session."""
        with self._lock:
            return list(self._open)

    def speaking(self) -> int:
        """Sessions with a turn open, synthesising or playing."""
        return sum(s.busy for s in self.all())

    def start_drain(self) -> None:
        """Refuse new sessions and turns from now on (idempotent; :meth:`drain` waits too)."""
        self.draining = True
        self.metrics.draining.set(1)
        for session in self.all():
            session.drain()

    async def drain(self, timeout: float) -> bool:
        """Stop taking sessions and turns; wait up to ``timeout`` s for speaking turns to finish.

        Returns:
            True when every turn finished in time (the caller closes the sessions afterwards).
        """
        self.start_drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.speaking() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return not self.speaking()


def add_session_arguments(parser: argparse.ArgumentParser, *, admission: bool = False) -> None:
    """The session flags every command that opens sessions takes (0 turns a limit off): the
    per-turn limits, the message rate of a network peer, the start budget and the drain; with
    ``admission``, also the session caps and offer rate of a worker that takes connections."""
    d = Limits()
    g = parser.add_argument_group("sessions (limits, start budget, drain; 0 turns a limit off)")
    if admission:
        g.add_argument("--max-sessions", type=int, default=None,
                       help="sessions at once (default: the default engine's capacity, measured at start-up)")
        g.add_argument("--max-sessions-per-client", type=int, default=d.max_sessions_per_client,
                       help="sessions per token identity (per address without keys) (default: %(default)s)")
        g.add_argument("--offer-rate", type=float, default=d.offer_rate,
                       help="offers, WebSocket connections and speech requests per second per client (default: %(default)s)")
        g.add_argument("--offer-burst", type=int, default=d.offer_burst,
                       help="offers back to back before --offer-rate applies (default: %(default)s)")
    g.add_argument("--message-rate", type=float, default=d.message_rate,
                   help="client messages per second per session (default: %(default)s)")
    g.add_argument("--message-burst", type=int, default=d.message_burst, help="messages back to back (default: %(default)s)")
    g.add_argument("--max-turn-chars", type=int, default=d.max_turn_chars, help="characters per turn (default: %(default)s)")
    g.add_argument("--max-queued-turns", type=int, default=d.max_queued_turns,
                   help="turns queued per session (default: %(default)s)")
    g.add_argument("--turn-idle-timeout", type=float, default=d.turn_idle_s, metavar="S",
                   help="seconds a turn's input may go without text before it ends as end_turn would, with an "
                        "error turn_idle (a sender that crashed, a stream never closed) (default: %(default)s)")
    g.add_argument("--max-hold-ms", type=milliseconds, default=1000.0 * MAX_HOLD_S, metavar="MS",
                   help="the longest a turn's ready first audio may be held before it plays (default: %(default)s; "
                        "reported as first_audio.pre_roll_ms)")
    g.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM or SIGINT, seconds to let speaking turns finish before closing (default: %(default)s)")


def limits_from_args(args: argparse.Namespace) -> Limits:
    """The :class:`~myna.limits.Limits` of a command line parsed with :func:`add_session_arguments`
    (flags a command does not take keep their defaults)."""
    d = Limits()

    def on(name: str):
        value = getattr(args, name, getattr(d, name))
        return value if value else None  # 0 turns a limit off

    return Limits(max_sessions=on("max_sessions"), max_sessions_per_client=on("max_sessions_per_client"),
                  offer_rate=on("offer_rate"), offer_burst=getattr(args, "offer_burst", d.offer_burst),
                  message_rate=on("message_rate"), message_burst=args.message_burst,
                  max_turn_chars=on("max_turn_chars"), max_queued_turns=on("max_queued_turns"),
                  turn_idle_s=getattr(args, "turn_idle_timeout", d.turn_idle_s) or None)
