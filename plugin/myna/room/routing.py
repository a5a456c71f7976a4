"""Turns from many participants through one session, events back to whoever sent each turn.

A room has one Myna track, so it has one :class:`~myna.session.Session`: turns from every
participant queue on it in order. The :class:`Router` sits in front of that session:

- **Several speakers.** Each message reaches the session with its sender's identity
  (``Session.handle(message, sender)``), so a participant's new turn ends only that
  participant's previous turn: while A streams a turn, B's turn waits behind it and both are
  spoken whole, in the order their first chunks arrived (a turn that goes quiet ends after the
  session's ``turn_idle_s``, so a crashed sender cannot hold the others back for long).
- **Caption segments.** Each turn gets a segment id of its own (:meth:`Router.segment_id`,
  ``SG_`` + 16 random hex digits), never the sender's ``turn_id``: two senders both saying
  ``"1"``, or a Myna that rejoins the room, never produce two captions with one id.
- **Who may speak.** Every participant by default, or only the identities given
  (``--speak-for``). Anyone else gets an ``error`` event (``not_allowed``) and a log line.
- **Turn ids.** Participants choose their own ``turn_id``s, so two of them may both say
  ``"1"``. The router gives each (participant, turn_id) pair a session-wide id of its own
  (``r1``, ``r2``, …) and maps the session's events back, so each participant sees only its
  own ids and its text never joins another participant's turn.
- **Events.** Every event of a turn goes to the participant that sent the turn (``deliver``);
  an event without a ``turn_id`` (an error about a message) goes to whoever sent that message.
- **Rates.** Data packets (contract JSON) pass each sender's message rate cap, as data-channel
  messages do; a text stream is one turn, and its chunks are that turn's text.
- **Leaving.** When a participant leaves while one of its turns is queued or playing, its
  synthesis is cancelled. Turns share one track and play in order, so this is the session's
  barge-in: turns of others queued behind it are dropped too, and each owner gets its
  ``turn_done`` with ``"interrupted": true``.

Pure logic, no LiveKit SDK: :mod:`myna.room.agent` feeds it packets, stream chunks and RPCs.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace

from myna.events import Error, Event, TurnDone, TurnStarted
from myna.limits import MessageRate
from myna.messages import (BadMessage, EndTurn, Interrupt, Message, Text, parse_message, stream_turn_options,
                           valid_turn_id)
from myna.session import EventSink, Session

log = logging.getLogger(__name__)

#: (participant, turn_id) pairs remembered after their turn ended, so a late chunk still maps to
#: the ended turn (and gets ``turn_ended``) instead of starting a new one.
REMEMBERED_PAIRS = 512
#: Text stream chunks are handed to the session in pieces of at most this many characters, as
#: contract messages would carry them (:data:`myna.events.MAX_MESSAGE_BYTES`).
TEXT_PIECE_CHARS = 2048

Deliver = Callable[[str, Event], None]


class Router:
    """Participants' messages into one session; its events out to each turn's sender.

    Args:
        session: builds the room's session from the router's event sink.
        deliver: called with ``(identity, event)`` for every event, in order.
        speak_for: identities allowed to speak through Myna (None: everyone).
        message_rate: makes one sender's message rate cap (None: no cap).
    """

    def __init__(self, session: Callable[[EventSink], Session], deliver: Deliver,
                 speak_for: frozenset[str] | None = None, message_rate: Callable[[], MessageRate] | None = None):
        self._deliver = deliver
        self.speak_for = speak_for
        self._message_rate = message_rate
        self._rates: dict[str, MessageRate] = {}
        self._ids: OrderedDict[tuple[str, str], str] = OrderedDict()  # (identity, turn_id) → session id
        self._owners: dict[str, tuple[str, str]] = {}  # session id → (identity, turn_id)
        self._segments: dict[str, str] = {}  # session id → caption segment id
        self._live: set[str] = set()  # session ids of turns not yet done
        self._count = 0
        self._sender: str | None = None  # who sent the message being handled
        self.session = session(self._on_event)

    def allowed(self, identity: str) -> bool:
        """May ``identity`` speak through Myna (send turns, interrupt)?"""
        return self.speak_for is None or identity in self.speak_for

    def speaking(self) -> bool:
        """True while any turn is queued or playing."""
        return bool(self._live)

    # -- in ---------------------------------------------------------------------------------
    def packet(self, identity: str, raw: bytes | str) -> None:
        """A data packet on topic ``myna``: one contract message, within the
        sender's message rate."""
        rate = None
        if self._message_rate is not None:
            rate = self._rates.get(identity) or self._rates.setdefault(identity, self._message_rate())
        try:
            message = parse_message(raw)
        except BadMessage as exc:
            accept, report = rate.allow() if rate is not None else (True, False)
            if accept:
                self._refuse(identity, exc.code, exc.message, exc.turn_id)
            elif report:
                self._refuse(identity, "rate_limited", rate.message)
            return
        self.message(identity, message, rate)

    def message(self, identity: str, message: Message, rate: MessageRate | None = None) -> None:
        """A contract message from ``identity`` (a packet, or a piece of a text stream), under
        the sender's message ``rate`` (:meth:`myna.session.Session.handle`: a turn already
        accepted is never cut)."""
        turn_id = getattr(message, "turn_id", None)
        if not self.allowed(identity):
            log.warning("ignored a message from %r: not allowed to speak through Myna", identity)
            self._refuse(identity, "not_allowed", f"{identity!r} may not speak through Myna", turn_id)
            return
        if turn_id is not None:
            message = replace(message, turn_id=self._session_id(identity, turn_id))
        self._sender = identity
        try:
            self.session.handle(message, identity, rate)
        finally:
            self._sender = None

    def stream_options(self, identity: str, turn_id: str, attributes: Mapping[str, str]) -> dict | None:
        """A ``myna.text`` stream's turn options from its attributes
        (:func:`myna.messages.stream_turn_options`), or None: refused, an ``error`` with the
        turn's id to the sender (the stream is then not spoken)."""
        try:
            return stream_turn_options(attributes, turn_id)
        except BadMessage as exc:
            self._refuse(identity, exc.code, exc.message, exc.turn_id)
            return None

    def text(self, identity: str, turn_id: str, text: str, options: dict | None = None) -> None:
        """A chunk of a ``myna.text`` stream (any length): the turn's text, in pieces; the
        stream's first chunk carries its ``options`` (:meth:`stream_options`). A stream id the
        contract cannot take as a ``turn_id`` gets an ``error`` (``bad_message``)."""
        if (turn_id := self._stream_turn(identity, turn_id)) is not None:
            for i in range(0, max(len(text), 1), TEXT_PIECE_CHARS):
                self.message(identity, Text(turn_id, text[i : i + TEXT_PIECE_CHARS], **(options or {})))
                options = None

    def end_turn(self, identity: str, turn_id: str) -> None:
        """A ``myna.text`` stream closed: its turn's input ends."""
        if (turn_id := self._stream_turn(identity, turn_id)) is not None:
            self.message(identity, EndTurn(turn_id))

    def _stream_turn(self, identity: str, stream_id: str) -> str | None:
        """A text stream's id as its turn's ``turn_id``, or None (refused: an ``error`` to the sender)."""
        try:
            return valid_turn_id(stream_id)
        except BadMessage as exc:
            if self.allowed(identity):
                self._refuse(identity, exc.code, exc.message)
            else:
                self._refuse(identity, "not_allowed", f"{identity!r} may not speak through Myna")
            return None

    def interrupt(self, identity: str) -> list[str]:
        """Barge-in from ``identity`` (every queued turn is dropped); returns the turn_ids of
        the dropped turns that ``identity`` owned.

        Raises:
            PermissionError: ``identity`` may not speak through Myna.
        """
        if not self.allowed(identity):
            raise PermissionError(f"{identity!r} may not speak through Myna")
        own = [self._owners[sid][1] for sid in sorted(self._live, key=lambda s: int(s[1:])) if self._owners[sid][0] == identity]
        self.message(identity, Interrupt())
        return own

    def participant_left(self, identity: str) -> None:
        """``identity`` left: cancel synthesis if it owns a queued or playing turn."""
        if any(self._owners[sid][0] == identity for sid in self._live):
            log.info("%r left mid-turn: cancelling its synthesis", identity)
            self.session.interrupt()
        for key in [k for k in self._ids if k[0] == identity]:
            sid = self._ids.pop(key)
            self._owners.pop(sid, None)
            self._segments.pop(sid, None)
        self._rates.pop(identity, None)

    def segment_id(self, identity: str, turn_id: str) -> str | None:
        """The caption segment id of ``identity``'s turn ``turn_id`` (unique in the room, see the
        module docstring); None for a turn the router does not know (any more)."""
        sid = self._ids.get((identity, turn_id))
        return self._segments.get(sid) if sid is not None else None

    # -- out --------------------------------------------------------------------------------
    def _on_event(self, event: Event) -> None:
        sid = getattr(event, "turn_id", None)
        owner = self._owners.get(sid) if sid is not None else None
        if owner is None:
            if self._sender is not None:
                self._deliver(self._sender, event)
            return
        identity, turn_id = owner
        if isinstance(event, TurnStarted):
            self._live.add(sid)
        elif isinstance(event, TurnDone):
            self._live.discard(sid)
        self._deliver(identity, event.with_turn_id(turn_id))

    def _refuse(self, identity: str, code: str, message: str, turn_id: str | None = None) -> None:
        """An ``error`` to ``identity`` about a message the session never saw (counted as the session's are)."""
        self.session.metrics.errors.labels(code).inc()
        self._deliver(identity, Error(code=code, message=message, turn_id=turn_id))

    def _session_id(self, identity: str, turn_id: str) -> str:
        key = (identity, turn_id)
        sid = self._ids.get(key)
        if sid is None:
            self._count += 1
            sid = self._ids[key] = f"r{self._count}"
            self._owners[sid] = key
            self._segments[sid] = f"SG_{secrets.token_hex(8)}"
            self._forget_old()
        return sid

    def _forget_old(self) -> None:
        """Keep at most :data:`REMEMBERED_PAIRS` ended turns' ids (live ones are always kept)."""
        ended = len(self._ids) - len(self._live)
        for key in list(self._ids):
            if ended <= REMEMBERED_PAIRS:
                break
            sid = self._ids[key]
            if sid not in self._live:
                del self._ids[key]
                self._owners.pop(sid, None)
                self._segments.pop(sid, None)
                ended -= 1
