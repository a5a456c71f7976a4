"""The contract's events: one small type each, turned into JSON in one place.

The worker sends these on the data channel, the WebSocket (``/v1/tts/stream``) and in LiveKit
rooms, and the in-process plug-ins read them as they are. Code that produces an event builds
its type (``Word(turn_id=..., word=..., start_ms=...)``) and hands it to its sink; the event
stays that object up to the door (a door that names turns otherwise, the LiveKit room, makes a
copy with :meth:`Event.with_turn_id`), and :func:`encode_event` makes the JSON text that goes
out. :func:`decode_event` reads it back (the remote plug-ins).

Keys keep the order the contract lists them in (``type`` first); an optional field
(``error.turn_id``, ``turn_done.interrupted``, the WebSocket's ``ready.voice`` and
``ready.scripts``) is left out while it holds its default.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import ClassVar

#: Largest message either way (bytes of UTF-8): client messages and events alike.
MAX_MESSAGE_BYTES = 16 * 1024

_ABSENT = object()  # an optional field that is not sent at all (also not as null)


def _optional(default: object = _ABSENT):
    """A field left out of :meth:`Event.to_dict` while it holds ``default``."""
    return field(default=default, metadata={"absent": default})


@dataclass(frozen=True, kw_only=True)
class Event:
    """One event the worker sends; subclasses name it in ``type``."""

    type: ClassVar[str]

    def with_turn_id(self, turn_id: str) -> "Event":
        """The same event for a turn named ``turn_id`` (events without a turn are returned as they are)."""
        return replace(self, turn_id=turn_id) if hasattr(self, "turn_id") else self

    def to_dict(self) -> dict:
        """The event as the JSON object the contract describes: ``type`` first, then the
        fields in order, optional ones only when set."""
        out = {"type": self.type}
        for f in fields(self):
            value = getattr(self, f.name)
            if "absent" not in f.metadata or value is not f.metadata["absent"]:
                out[f.metadata.get("key", f.name)] = value
        return out


@dataclass(frozen=True, kw_only=True)
class Ready(Event):
    """The session is open: the worker's engines, the one in use and the audio rate (Hz).
    The WebSocket's ``ready`` also carries ``voice`` (None: the default), ``scripts``
    (the scripts the voice reads) and ``format`` (its binary messages' encoding)."""

    type: ClassVar[str] = "ready"
    engines: list[str]
    engine: str
    voice: str | None = _optional()
    sample_rate: int
    scripts: list[str] = _optional()
    format: str = _optional()


@dataclass(frozen=True, kw_only=True)
class TurnStarted(Event):
    """A turn's first text arrived (WebSocket: the turns before it are done)."""

    type: ClassVar[str] = "turn_started"
    turn_id: str


@dataclass(frozen=True, kw_only=True)
class FirstAudio(Event):
    """The frame (or message) with the turn's first audible sample is handed out.

    ``server_ttfa_ms``: first text chunk → now (ms); ``pre_roll_ms``: first audio ready → the
    deadline of the frame that starts the turn (ms; 0 on the unpaced WebSocket)."""

    type: ClassVar[str] = "first_audio"
    turn_id: str
    server_ttfa_ms: float
    pre_roll_ms: float


@dataclass(frozen=True, kw_only=True)
class Word(Event):
    """A word about to be heard; ``start_ms`` into the turn's audio."""

    type: ClassVar[str] = "word"
    turn_id: str
    word: str
    start_ms: float


@dataclass(frozen=True, kw_only=True)
class TurnDone(Event):
    """A turn's audio is all handed out (or dropped, ``interrupted``).

    ``audio_ms``: audio handed out (ms); ``underruns``: starvation episodes inside a chunk;
    ``gap_ms`` (``count``, ``total``, ``longest``) and ``gaps`` (``[start_ms, duration_ms]``),
    as :meth:`myna.audio.playout.Gaps.fields` gives them."""

    type: ClassVar[str] = "turn_done"
    turn_id: str
    audio_ms: float
    underruns: int
    gap_ms: dict
    gaps: list
    interrupted: bool = _optional(False)


@dataclass(frozen=True, kw_only=True)
class Error(Event):
    """Bad input or a failure the session survives: a contract ``code`` and a ``message``;
    ``turn_id`` when it concerns one turn."""

    type: ClassVar[str] = "error"
    code: str
    message: str
    turn_id: str | None = _optional(None)


@dataclass(frozen=True, kw_only=True)
class Fallback(Event):
    """A turn switched engines (:mod:`myna.engines.fallback`): ``from`` and ``to`` name the
    engines, ``reason`` is ``error``, ``late``, ``stall`` or ``open`` (the primary's circuit
    breaker is open), ``at_word`` the index of the first word the new engine speaks."""

    type: ClassVar[str] = "fallback"
    turn_id: str
    from_engine: str = field(metadata={"key": "from"})
    to_engine: str = field(metadata={"key": "to"})
    reason: str
    at_word: int


@dataclass(frozen=True, kw_only=True)
class Paused(Event):
    """Playout stopped (``pause``); ``at_ms``: how far into the turn's audio it stopped (ms),
    ``resume_ms``: where ``resume`` continues it (the start of the word that was cut, ms)."""

    type: ClassVar[str] = "paused"
    turn_id: str
    at_ms: float
    resume_ms: float


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    """Playout of the paused turn goes on from ``from_ms`` into its audio (``resume``)."""

    type: ClassVar[str] = "resumed"
    turn_id: str
    from_ms: float


#: Every event type by its ``type``.
EVENT_TYPES: dict[str, type[Event]] = {cls.type: cls for cls in (Ready, TurnStarted, FirstAudio, Word, TurnDone, Error,
                                                                  Fallback, Paused, Resumed)}


def encode_event(event: Event, max_bytes: int = MAX_MESSAGE_BYTES) -> str | None:
    """An event as JSON text of at most ``max_bytes`` bytes (UTF-8), or None when it cannot fit.

    A ``message`` too long is cut (halved until the event fits); other fields are never
    changed (a cut ``turn_id`` or ``word`` would be wrong), so such an event does not fit.
    """
    obj = event.to_dict()
    text = json.dumps(obj)  # ASCII only: characters are bytes
    message = obj.get("message")
    while len(text) > max_bytes and isinstance(message, str) and message:
        message = message[: len(message) // 2]
        text = json.dumps({**obj, "message": message + "…"})
    return text if len(text) <= max_bytes else None


def decode_event(obj: object) -> Event | None:
    """A received event (the JSON object :meth:`Event.to_dict` makes) as its type; None for an
    object that is not a known event. Either side may be newer: keys it does not know are
    ignored, and a field the sender did not send (an older worker's ``turn_done`` has no
    ``gap_ms``) is None, or its default where it has one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str) or obj["type"] not in EVENT_TYPES:
        return None
    cls = EVENT_TYPES[obj["type"]]
    values = {}
    for f in fields(cls):
        key = f.metadata.get("key", f.name)
        if key in obj:
            values[f.name] = obj[key]
        elif f.default is MISSING:
            values[f.name] = None
    return cls(**values)
