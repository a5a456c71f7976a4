"""The contract's client messages: one small type each, parsed from JSON in one place.

The mirror of :mod:`myna.events`. A door that receives JSON (the data channel, the WebSocket,
a LiveKit data packet) calls :func:`parse_message` once and hands the typed message to its
:class:`~myna.session.Session`; a door that has its input typed already (a LiveKit text
stream, the in-process plug-ins) builds the messages itself.

- :class:`Text`: a chunk of a turn's text (it may split words anywhere);
- :class:`EndTurn`: the turn's text is complete;
- :class:`Interrupt`: drop every turn now (barge-in);
- :class:`Cancel`: drop one turn (queued or playing), keep the others;
- :class:`Text` with ``prepare`` (the ``prepare`` message) and :class:`Commit`: a turn
  synthesised ahead and held until it is committed;
- :class:`Pause` / :class:`Resume`: stop the playing turn, then continue it from the start of
  the word that was cut;
- :class:`Config`: the WebSocket's settings, before its first turn.

:class:`TurnDefaults` are a session's defaults for its turns (voice, speed, lexicon,
normalise): set by the WebSocket's ``config``, the offer's ``request_data``, a LiveKit
dispatch's metadata or an in-process caller, and parsed from JSON by :func:`parse_turn_defaults`
with the same rules everywhere.

A bad ``speed`` (not a number from :data:`MIN_SPEED` to :data:`MAX_SPEED`) is ``bad_speed``; a
``language`` that is not a language tag is ``bad_language``.

A message that breaks the contract raises :class:`BadMessage` (its ``code`` and ``message``
go into the ``error`` event, with the message's ``turn_id`` when it had a valid one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from myna.engines.base import MAX_SPEED, MIN_SPEED, EngineError, check_language, check_speed
from myna.errors import MynaError
from myna.events import MAX_MESSAGE_BYTES

#: Longest accepted ``turn_id``.
MAX_TURN_ID = 128
#: Characters of client input an error message may quote (echoing more would let a 16 KiB
#: message draw a larger error).
QUOTED_INPUT_CHARS = 64
#: Output rates a WebSocket client may ask for in ``config`` (Hz).
MIN_RATE, MAX_RATE = 8_000, 96_000
#: Audio formats of the WebSocket's binary messages (``config.format``): s16le PCM, or G.711.
WS_FORMATS = ("pcm_s16le", "pcm_mulaw", "pcm_alaw")


@dataclass(frozen=True)
class Text:
    """``{"type": "text", "turn_id", "text", "voice"?, "speed"?}``: a chunk of a turn's text.

    ``voice``, ``speed`` (a number from 0.5 to 2.0, the voice's own pace ×) and ``language`` (a
    language tag the turn's voice must speak) are the turn's options, read on its first chunk
    only (None: the session's; ``language`` None: not checked).
    ``{"type": "prepare", "turn_id", "text"}`` is the same with ``prepare`` True: its turn's
    first chunk opens it *prepared* (synthesised, held until :class:`Commit`); on a turn
    already open it is a plain chunk."""

    turn_id: str
    text: str
    prepare: bool = False
    voice: str | None = None
    speed: float | None = None
    language: str | None = None


@dataclass(frozen=True)
class Commit:
    """``{"type": "commit", "turn_id"}``: play this prepared turn (in its place in the queue)."""

    turn_id: str


@dataclass(frozen=True)
class Pause:
    """``{"type": "pause"}``: stop playout now, keeping the playing turn."""


@dataclass(frozen=True)
class Resume:
    """``{"type": "resume"}``: continue the paused turn from the start of the word that was cut."""


@dataclass(frozen=True)
class EndTurn:
    """``{"type": "end_turn", "turn_id"}``: no more text for the turn."""

    turn_id: str


@dataclass(frozen=True)
class Interrupt:
    """``{"type": "interrupt"}``: barge-in."""


@dataclass(frozen=True)
class Cancel:
    """``{"type": "cancel", "turn_id"}``: drop this one turn, queued or playing; the others play on."""

    turn_id: str


@dataclass(frozen=True)
class Config:
    """``{"type": "config", "engine"?, "voice"?, "sample_rate"?, "format"?}`` (WebSocket only);
    None: unchanged (``sample_rate``: the engine's own, or 8000 for G.711).

    ``sample_rate`` is in Hz, :data:`MIN_RATE` to :data:`MAX_RATE`; ``format`` one of
    :data:`WS_FORMATS` (``pcm_mulaw`` and ``pcm_alaw`` are G.711 at 8 kHz only)."""

    engine: str | None = None
    voice: str | None = None
    sample_rate: int | None = None
    format: str | None = None
    speed: float | None = None  # the session's default pace (0.5 to 2.0)
    lexicon: object = None  # the session's lexicon (a myna.text.lexicon.Lexicon; None: the process's only)
    normalise: bool | None = None  # False: words reach the engine as written (myna.text.normaliser)
    phrase_cache: bool | None = None  # False: no turn is answered from the phrase cache


Message = Text | EndTurn | Interrupt | Cancel | Commit | Pause | Resume | Config


@dataclass(frozen=True)
class TurnDefaults:
    """A session's defaults for its turns; a turn's own ``voice`` or ``speed`` wins (:class:`Text`).

    ``voice``: a voice name of the session's engine (None: the engine's default); ``speed``: the
    voice's own pace × this, :data:`MIN_SPEED` to :data:`MAX_SPEED`; ``lexicon``: the session's
    pronunciation lexicon (a :class:`myna.text.lexicon.Lexicon`), applied before the process's
    (None: the process's only); ``normalise``: say numbers, dates, codes in words
    (:mod:`myna.text.normaliser`), False: as written; ``phrase_cache``: turns may be answered from
    the engine's phrase cache (:mod:`myna.engines.phrase_cache`), False: every turn is synthesised.

    Raises:
        EngineError: ``bad_speed`` for a speed out of range.
    """

    voice: str | None = None
    speed: float = 1.0
    lexicon: object = None
    normalise: bool = True
    phrase_cache: bool = True

    def __post_init__(self):
        object.__setattr__(self, "speed", check_speed(self.speed))

    def updated(self, *, voice: str | None = None, speed: float | None = None, lexicon=None,
                normalise: bool | None = None, phrase_cache: bool | None = None) -> "TurnDefaults":
        """These defaults with the given ones replaced (None: kept)."""
        changes = {"voice": voice, "speed": speed, "lexicon": lexicon, "normalise": normalise,
                   "phrase_cache": phrase_cache}
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


class BadMessage(MynaError):
    """A client message that breaks the contract; ``code`` goes into the ``error`` event,
    with ``turn_id`` (the message's, when it had a valid one; else None)."""

    def __init__(self, code: str, message: str, turn_id: str | None = None):
        super().__init__(code, message)
        self.turn_id = turn_id


def parse_message(raw: str | bytes, *, config: bool = False) -> Message:
    """Decode one client message: at most :data:`MAX_MESSAGE_BYTES` of UTF-8, a JSON object
    with a string ``type``, and the fields its type needs.

    Args:
        config: the door takes :class:`Config` (the WebSocket); elsewhere it is an unknown type.

    Raises:
        BadMessage: ``message_too_large``, ``bad_encoding``, ``bad_json``, ``bad_message``,
            ``bad_config`` or ``unknown_type``.
    """
    if isinstance(raw, bytes):
        if len(raw) > MAX_MESSAGE_BYTES:
            raise BadMessage("message_too_large", f"messages are limited to {MAX_MESSAGE_BYTES} bytes")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadMessage("bad_encoding", "binary message is not UTF-8 JSON") from None
    if len(raw.encode("utf-8")) > MAX_MESSAGE_BYTES:
        raise BadMessage("message_too_large", f"messages are limited to {MAX_MESSAGE_BYTES} bytes")
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise BadMessage("bad_json", f"message is not valid JSON: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        raise BadMessage("bad_message", 'a message is a JSON object with a string "type"')
    return message_from(obj, config=config)


#: The attributes of a LiveKit ``myna.text`` stream that are its turn's options.
STREAM_OPTIONS = ("voice", "speed", "language")


def stream_turn_options(attributes: Mapping[str, str], turn_id: str) -> dict:
    """A ``myna.text`` stream's turn options, from its attributes (LiveKit's attributes are
    strings: ``{"speed": "1.5", "voice": "en_GB-alan-medium"}``), checked as a ``text``
    message's are: ``{"voice", "speed", "language"}`` (None where absent; ``speed`` a float).

    Raises:
        BadMessage: ``bad_speed``, ``bad_language`` (…) with ``turn_id``, as :func:`message_from`.
    """
    obj: dict = {"type": "text", "turn_id": turn_id, "text": ""}
    obj.update((name, attributes[name]) for name in STREAM_OPTIONS if name in attributes)
    if isinstance(obj.get("speed"), str):
        try:
            obj["speed"] = float(obj["speed"])
        except ValueError:
            pass  # (refused as bad_speed, naming the value)
    text = message_from(obj)
    return {"voice": text.voice, "speed": text.speed, "language": text.language}


def message_from(obj: dict, *, config: bool = False) -> Message:
    """The typed message of a decoded JSON object with a string ``type`` (see :func:`parse_message`).

    Raises:
        BadMessage: as :func:`parse_message`.
    """
    kind = obj["type"]
    turn_id = _valid_turn_id(obj.get("turn_id"))
    if kind in ("text", "prepare"):
        text = obj.get("text")
        if turn_id is None:
            raise BadMessage("bad_message", f'"{kind}" needs a "turn_id" (string, 1-{MAX_TURN_ID} chars)')
        if not isinstance(text, str):
            raise BadMessage("bad_message", f'"{kind}" needs a string "text"', turn_id)
        voice = obj.get("voice")
        if not isinstance(voice, (str, type(None))):
            raise BadMessage("bad_message", '"voice" must be a string', turn_id)
        language = obj.get("language")
        if language is not None:
            try:
                check_language(language)
            except EngineError as exc:
                raise BadMessage(exc.code, exc.message, turn_id) from None
        return Text(turn_id, text, prepare=kind == "prepare", voice=voice, speed=_speed(obj.get("speed"), turn_id),
                    language=language)
    if kind == "commit":
        if turn_id is None:
            raise BadMessage("bad_message", f'"commit" needs a "turn_id" (string, 1-{MAX_TURN_ID} chars)')
        return Commit(turn_id)
    if kind == "pause":
        return Pause()
    if kind == "resume":
        return Resume()
    if kind == "end_turn":
        if turn_id is None:
            raise BadMessage("bad_message", f'"end_turn" needs a "turn_id" (string, 1-{MAX_TURN_ID} chars)')
        return EndTurn(turn_id)
    if kind == "interrupt":
        return Interrupt()
    if kind == "cancel":
        if turn_id is None:
            raise BadMessage("bad_message", f'"cancel" needs a "turn_id" (string, 1-{MAX_TURN_ID} chars)')
        return Cancel(turn_id)
    if kind == "config" and config:
        return _config(obj)
    raise BadMessage("unknown_type", f"unknown message type {quote_input(kind)}", turn_id)


def _config(obj: dict) -> Config:
    engine, voice, rate = obj.get("engine"), obj.get("voice"), obj.get("sample_rate")
    if not isinstance(engine, (str, type(None))) or not isinstance(voice, (str, type(None))):
        raise BadMessage("bad_config", '"engine" and "voice" must be strings')
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE):
        raise BadMessage("bad_config", f'"sample_rate" must be an integer from {MIN_RATE} to {MAX_RATE} (Hz)')
    fmt = obj.get("format")
    if fmt is not None and fmt not in WS_FORMATS:
        raise BadMessage("bad_config", f'"format" must be one of {", ".join(WS_FORMATS)}')
    if fmt in ("pcm_mulaw", "pcm_alaw") and rate not in (None, 8000):
        raise BadMessage("bad_config", f'"{fmt}" is G.711: its "sample_rate" is 8000 Hz')
    return Config(engine, voice, rate, fmt, _speed(obj.get("speed")), _lexicon(obj.get("lexicon")),
                  _flag(obj, "normalise"), _flag(obj, "phrase_cache"))


def parse_turn_defaults(obj: dict, base: TurnDefaults = TurnDefaults()) -> TurnDefaults:
    """``base`` with the ``voice``, ``speed``, ``lexicon``, ``normalise`` and ``phrase_cache`` of a
    JSON object (an offer's ``request_data``, a LiveKit dispatch's metadata) — the rules of ``config``.
    The voice is not checked against an engine here (the door does: ``unknown_voice``).

    Raises:
        BadMessage: ``bad_config`` (a voice that is not a string, a normalise or phrase_cache
            that is not a boolean), ``bad_speed``, ``bad_lexicon``.
    """
    voice = obj.get("voice")
    if not isinstance(voice, (str, type(None))):
        raise BadMessage("bad_config", '"voice" must be a string')
    return base.updated(voice=voice, speed=_speed(obj.get("speed")), lexicon=_lexicon(obj.get("lexicon")),
                        normalise=_flag(obj, "normalise"), phrase_cache=_flag(obj, "phrase_cache"))


def _lexicon(value: object):
    """A message's ``lexicon`` (:meth:`myna.text.lexicon.Lexicon.from_json`), or None."""
    if value is None:
        return None
    from myna.text.lexicon import Lexicon

    try:
        return Lexicon.from_json(value)
    except ValueError as exc:
        raise BadMessage("bad_lexicon", str(exc)) from None


def _flag(obj: dict, name: str) -> bool | None:
    """A session option that is true or false (``normalise``, ``phrase_cache``), or None."""
    value = obj.get(name)
    if value is not None and not isinstance(value, bool):
        raise BadMessage("bad_config", f'"{name}" must be true or false')
    return value


def _speed(speed: object, turn_id: str | None = None) -> float | None:
    """A message's ``speed``: None, or a number from :data:`MIN_SPEED` to :data:`MAX_SPEED`."""
    if speed is None:
        return None
    try:
        return check_speed(speed)
    except EngineError as exc:
        raise BadMessage(exc.code, exc.message, turn_id) from None


def _valid_turn_id(turn_id: object) -> str | None:
    """A ``turn_id`` as the contract takes it (a string or an integer, 1-128 characters), or None."""
    if isinstance(turn_id, int) and not isinstance(turn_id, bool):
        turn_id = str(turn_id)
    return turn_id if isinstance(turn_id, str) and 0 < len(turn_id) <= MAX_TURN_ID else None


def valid_turn_id(turn_id: object) -> str:
    """``turn_id`` as the contract takes it (a string or an integer of 1-128 characters, as text).

    Raises:
        BadMessage: ``bad_message`` for anything else.
    """
    valid = _valid_turn_id(turn_id)
    if valid is None:
        raise BadMessage("bad_message", f'a "turn_id" is a string of 1-{MAX_TURN_ID} characters')
    return valid


def quote_input(value: object, limit: int = QUOTED_INPUT_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters (client input is
    echoed, never whole).

    >>> quote_input("x" * 100, limit=10)
    "'xxxxxx…'"
    """
    text = repr(value) if not isinstance(value, str) or len(value) <= limit else repr(value[: limit - 4] + "…")
    return text if len(text) <= limit + 2 else text[: limit - 1] + "…"
