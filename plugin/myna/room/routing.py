"""Turns from many participants through one session, events back to whoever sent each turn.

A room has one Myna track, so it has one :class:`~myna.rtc.session.Session`: turns from every
participant queue on it in order. The :class:`Router` sits in front of that session:

- **Who may speak.** Every participant by default, or only the identities given
  (``--speak-for``). Anyone else gets an ``error`` event (``not_allowed``) and a log line.
- **Turn ids.** Participants choose their own ``turn_id``s, so two of them may both say
  ``"1"``. The router gives each (participant, turn_id) pair a session-wide id of its own
  (``r1``, ``r2``, …) and maps the session's events back, so each participant sees only its
  own ids and its text never joins another participant's turn.
- **Events.** Every event of a turn goes to the participant that sent the turn (``deliver``);
  an event without a ``turn_id`` (an error about a message) goes to whoever sent that message.
- **Leaving.** When a participant leaves while one of its turns is queued or playing, its
  synthesis is cancelled. Turns share one track and play in order, so this is the session's
  barge-in: turns of others queued behind it are dropped too, and each owner gets its
  ``turn_done`` with ``"interrupted": true``.

Pure logic, no LiveKit SDK: :mod:`myna.room.agent` feeds it packets, stream chunks and RPCs.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable

from myna.events import Error
from myna.rtc.session import MAX_TURN_ID, BadMessage, Session, _turn_id, parse_message

log = logging.getLogger(__name__)

#: (participant, turn_id) pairs remembered after their turn ended, so a late chunk still maps to
#: the ended turn (and gets ``turn_ended``) instead of starting a new one.
REMEMBERED_PAIRS = 512
#: Text stream chunks are handed to the session in pieces of at most this many characters, so
#: each piece fits one contract message (:data:`myna.rtc.session.MAX_MESSAGE_BYTES`).
TEXT_PIECE_CHARS = 2048

Deliver = Callable[[str, dict], None]


class Router:
    """Participants' messages into one session; its events out to each turn's sender.

    Args:
        session: builds the room's session from the router's event sink
            (``lambda send: Session(engine, send, metrics)``).
        deliver: called with ``(identity, event)`` for every event, in order.
        speak_for: identities allowed to speak through Myna (None: everyone).
    """

    def __init__(self, session: Callable[[Callable[[dict], None]], Session], deliver: Deliver,
                 speak_for: frozenset[str] | None = None):
        self._deliver = deliver
        self.speak_for = speak_for
        self._ids: OrderedDict[tuple[str, str], str] = OrderedDict()  # (identity, turn_id) → session id
        self._owners: dict[str, tuple[str, str]] = {}  # session id → (identity, turn_id)
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
        """A data packet on topic ``myna``: one contract message (DESIGN.md §3)."""
        try:
            msg = parse_message(raw)
        except BadMessage as exc:
            self._refuse(identity, exc.code, exc.message)
            return
        self.message(identity, msg)

    def message(self, identity: str, msg: dict) -> None:
        """A parsed contract message from ``identity`` (a packet, or a text stream's chunk)."""
        if not self.allowed(identity):
            log.warning("ignored %s from %r: not allowed to speak through Myna", msg.get("type"), identity)
            self._refuse(identity, "not_allowed", f"{identity!r} may not speak through Myna", msg.get("turn_id"))
            return
        if "turn_id" in msg:
            try:
                msg = {**msg, "turn_id": self._session_id(identity, _turn_id(msg))}
            except BadMessage as exc:
                self._refuse(identity, exc.code, exc.message)
                return
        self._sender = identity
        try:
            self.session.handle_message(json.dumps(msg))
        finally:
            self._sender = None

    def text(self, identity: str, turn_id: str, text: str) -> None:
        """A chunk of a ``myna.text`` stream (any length): the turn's text, in pieces."""
        for i in range(0, max(len(text), 1), TEXT_PIECE_CHARS):
            self.message(identity, {"type": "text", "turn_id": turn_id, "text": text[i : i + TEXT_PIECE_CHARS]})

    def interrupt(self, identity: str) -> list[str]:
        """Barge-in from ``identity`` (every queued turn is dropped); returns the turn_ids of
        the dropped turns that ``identity`` owned.

        Raises:
            PermissionError: ``identity`` may not speak through Myna.
        """
        if not self.allowed(identity):
            raise PermissionError(f"{identity!r} may not speak through Myna")
        own = [self._owners[sid][1] for sid in sorted(self._live, key=lambda s: int(s[1:])) if self._owners[sid][0] == identity]
        self.message(identity, {"type": "interrupt"})
        return own

    def participant_left(self, identity: str) -> None:
        """``identity`` left: cancel synthesis if it owns a queued or playing turn."""
        if any(self._owners[sid][0] == identity for sid in self._live):
            log.info("%r left mid-turn: cancelling its synthesis", identity)
            self.session.interrupt()
        for key in [k for k in self._ids if k[0] == identity]:
            self._owners.pop(self._ids.pop(key), None)

    # -- out --------------------------------------------------------------------------------
    def _on_event(self, event: dict) -> None:
        sid = event.get("turn_id")
        owner = self._owners.get(sid) if sid is not None else None
        if owner is None:
            if self._sender is not None:
                self._deliver(self._sender, event)
            return
        identity, turn_id = owner
        event = {**event, "turn_id": turn_id}
        if "message" in event:  # the session names turns by its own ids
            event["message"] = event["message"].replace(repr(sid), repr(turn_id))
        if event["type"] == "turn_started":
            self._live.add(sid)
        elif event["type"] == "turn_done":
            self._live.discard(sid)
        self._deliver(identity, event)

    def _refuse(self, identity: str, code: str, message: str, turn_id=None) -> None:
        valid = isinstance(turn_id, str) and 0 < len(turn_id) <= MAX_TURN_ID
        self._deliver(identity, Error(code=code, message=message, turn_id=turn_id if valid else None).to_dict())

    def _session_id(self, identity: str, turn_id: str) -> str:
        key = (identity, turn_id)
        sid = self._ids.get(key)
        if sid is None:
            self._count += 1
            sid = self._ids[key] = f"r{self._count}"
            self._owners[sid] = key
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
                ended -= 1
