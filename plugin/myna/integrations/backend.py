"""Where a framework plug-in gets its speech: an in-process engine or a remote Myna worker.

Both plug-ins (:mod:`myna.integrations.pipecat`, :mod:`myna.integrations.livekit`) speak to a
:class:`Backend`, which opens one :class:`Turn` per utterance. A turn takes text as the LLM
writes it (:meth:`Turn.push_text`, :meth:`Turn.end_input`), and yields :class:`Audio`
(s16le mono PCM at :attr:`Backend.sample_rate`), :class:`Word` and :class:`Notice` items as
they exist; :meth:`Turn.cancel` drops it at once (barge-in, or a reply thrown away) with the
contract's ``cancel {turn_id}``, which stops that one turn and nothing else of its session. A
turn with nothing speakable in it (``"👍"``, ``"..."``) ends with no items and no error.

Both backends are doors to the same core: a turn is a turn of a :class:`~myna.session.Session`,
and its items are made from the session's contract events by one class (:class:`_EventTurn`),
whether the events come as objects or as JSON.

- :class:`LocalBackend` runs the session in this process, on an engine of its own (the
  embedded Piper voice by default, built as ``myna serve`` builds it:
  :func:`myna.engines.build.build_engines`) or one the caller started; its output is an
  :class:`~myna.audio.unpaced.UnpacedOutput` at the backend's rate.
- :class:`RemoteBackend` talks to ``GET /v1/tts/stream`` on a running worker.

Either way a session carries one turn at a time (a WebSocket connection, remotely); idle ones
are pooled, so a new turn usually starts on a warm session (remotely: no handshake inside time
to first byte).

Nothing here imports a framework.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from myna.access import ERROR_HEADER, AccessRefused, Credentials
from myna.audio.unpaced import UnpacedOutput
from myna.engines import Engine
from myna.engines.base import NON_FATAL_CODES, check_language, check_speed, language_of, speaks
from myna.engines.build import EngineOptions, Engines, build_engines
from myna.errors import MynaError
from myna.events import Error, Event, Fallback, FirstAudio, TurnDone, TurnStarted, decode_event
from myna.events import Word as WordEvent
from myna.limits import Limits
from myna.messages import Cancel, EndTurn, Text, TurnDefaults
from myna.session import Session
from myna.sessions import Sessions
from myna.text.scripts import LATIN

log = logging.getLogger(__name__)

#: Seconds allowed to open a WebSocket and get its ``ready`` answers.
CONNECT_TIMEOUT = 10.0
#: How long a remote turn holds the text an LLM writes after a message went out, to send it as
#: one message (s): the first chunk goes at once, then at most one message per 20 ms (50 a
#: second, well under a worker's message rate) however fast the tokens come, and no
#: word waits more than 20 ms. ``end_input`` sends what is held at once.
COALESCE_S = 0.02
#: Seconds between a remote backend's pings on each connection; a worker that has not answered
#: within half of it is taken for dead (the worker pings its clients on the same schedule).
HEARTBEAT_S = 10.0
#: Error codes after which trying again (a new connection, behind a load balancer another
#: worker) may succeed: the plug-ins report them as retryable.
RETRYABLE_CODES = frozenset({"connection_failed", "connection_lost", "draining", "full", "not_ready", "unavailable",
                             "rate_limited", "heartbeat_timeout"})
#: Codes of a worker's refusal at the WebSocket upgrade (503) that another worker behind the same
#: URL may not give: the backend tries once more at once, on a new TCP connection.
REFUSED_HERE_CODES = frozenset({"draining", "full", "not_ready", "unavailable"})
#: Most characters of text in one message (the contract's messages are at most 16 KiB of JSON;
#: a character escaped as a surrogate pair takes 12 bytes).
MAX_MESSAGE_CHARS = 1000


@dataclass(frozen=True)
class Audio:
    """A piece of a turn's speech: s16le mono PCM bytes at the backend's rate."""

    pcm: bytes


@dataclass(frozen=True)
class Word:
    """A word and its start in the turn's audio, in seconds from the turn's first sample."""

    word: str
    start_s: float


@dataclass(frozen=True)
class Notice:
    """A problem the turn survives (e.g. ``unsupported_language``: words in a script the voice
    cannot read were left out); the rest of the turn follows."""

    code: str
    message: str


TurnItem = Audio | Word | Notice


class Turn(abc.ABC):
    """One utterance: text in as it arrives, audio and words out as they exist."""

    turn_id: str

    @abc.abstractmethod
    async def push_text(self, text: str) -> None:
        """Add a chunk of text (any split, e.g. one LLM token)."""

    @abc.abstractmethod
    async def end_input(self) -> None:
        """No more text: speak what is buffered, then end the iteration."""

    @abc.abstractmethod
    async def cancel(self) -> None:
        """Drop the turn now (``cancel {turn_id}`` to its session: that turn only); iteration
        ends without further items (idempotent)."""

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[TurnItem]:
        """Audio and words in order; raises :class:`MynaError` if synthesis fails."""


class Backend(abc.ABC):
    """Opens turns. Call :meth:`start` once before :meth:`open_turn`, :meth:`aclose` at the end.

    Attributes:
        sample_rate: rate of every :class:`Audio` item (Hz).
        scripts: the scripts the voice reads (known after :meth:`start` for a remote worker).
    """

    sample_rate: int
    scripts: frozenset[str] = LATIN
    voice: str | None = None
    speed: float | None = None
    language: str | None = None

    async def start(self) -> None:
        """Load the engine or open (and check) a first connection."""

    def update_options(self, *, voice: str | None = None, speed: float | None = None,
                       language: str | None = None) -> None:
        """Speak the turns opened from now on in ``voice``, at ``speed`` and/or in ``language``
        (None: keep the current one); a turn already open keeps its options. Nothing reconnects:
        the options go with each turn's first text (``text.voice``, ``text.speed``,
        ``text.language``).

        Raises:
            MynaError: ``bad_speed`` (not a number from 0.5 to 2.0), ``bad_message`` (a voice
                that is not a non-empty string), ``bad_language`` (not a language tag),
                ``unknown_voice`` (a voice the engine, or the worker's ``GET /v1/voices``,
                lacks), ``wrong_language`` (the voice does not speak the language); the options
                are left as they were. (Where a worker's voices are not known, the worker checks
                each turn: a turn it refuses fails with that code, the turns after it are spoken.)
        """
        if voice is not None and (not isinstance(voice, str) or not voice):
            raise MynaError("bad_message", f"voice must be a non-empty string, not {voice!r}")
        speed = check_speed(speed) if speed is not None else None
        language = check_language(language) if language is not None else None
        if voice is not None:
            self._check_voice(voice)
        if language is not None or (voice is not None and self.language is not None):
            wanted = language or self.language
            chosen = voice or self.voice
            spoken = self._voice_language(chosen)
            if not speaks(spoken, wanted):
                raise MynaError("wrong_language", f"the voice {chosen or 'default'!r} speaks {spoken}, not {wanted!r}")
        if voice is not None:
            self.voice = voice
        if speed is not None:
            self.speed = speed
        if language is not None:
            self.language = language

    def _check_voice(self, voice: str) -> None:
        """Raise ``unknown_voice`` if this backend knows ``voice`` cannot be spoken."""

    def _voice_language(self, voice: str | None) -> str | None:
        """The language ``voice`` speaks, where this backend knows it (else None)."""
        return None

    def _turn_options(self) -> dict:
        """The options a new turn's first text carries (``voice``, ``speed``, ``language`` where set)."""
        return {k: v for k, v in (("voice", self.voice), ("speed", self.speed), ("language", self.language))
                if v is not None}

    @abc.abstractmethod
    async def open_turn(self) -> Turn:
        """A new turn, ready for text."""

    async def aclose(self) -> None:
        """Release engines and connections."""


def create_backend(
    *, engine: Engine | None = None, url: str | None = None, engine_name: str | None = None,
    voice: str | None = None, sample_rate: int | None = None, credentials: Credentials | None = None,
) -> Backend:
    """The backend for a plug-in's arguments: ``url`` → remote, else in-process.

    Args:
        engine: an in-process engine (already started by the caller); None with no ``url``
            loads the embedded Piper voice, owned by the backend.
        url: a worker, ``http://host:port`` or ``ws://host:port`` (the path is added).
        engine_name: the worker's engine to use (remote only; None: the worker's default).
        voice: voice name (None: the engine's default).
        sample_rate: output rate in Hz (None: the engine's native rate in-process, 24000 remote).
        credentials: the access token for a worker with keys (remote only; None: from the
            environment, see :class:`myna.access.Credentials`).

    Raises:
        ValueError: both ``engine`` and ``url``.
    """
    if url is not None:
        if engine is not None:
            raise ValueError("pass either engine (in-process) or url (remote), not both")
        return RemoteBackend(url, engine_name=engine_name, voice=voice, sample_rate=sample_rate or 24_000,
                             credentials=credentials)
    return LocalBackend(engine, voice=voice, sample_rate=sample_rate)


class _EventTurn(Turn):
    """A turn fed by its session's contract events and PCM: the one place both backends turn
    them into items (:class:`Audio`, :class:`Word`, :class:`Notice`; a failure is raised)."""

    def __init__(self, options: dict | None = None) -> None:
        self.turn_id = uuid.uuid4().hex
        self._options = options or {}  # voice, speed: on the turn's first text only
        self._items: asyncio.Queue[TurnItem | MynaError | None] = asyncio.Queue()
        self._sent_any = False  # the session has heard of this turn
        self._started = False  # ... and took it (its turn_started came)
        self._ended = False  # end_input was called
        self._cancelled = False
        self._done = False
        self.server_ttfa_ms: float | None = None

    def _takes_text(self) -> bool:
        """Whether text may go to the session now: False once the turn is over (refused, or
        done: its iteration says why), and its session may carry another turn.

        Raises:
            RuntimeError: after :meth:`end_input` or :meth:`cancel`.
        """
        if self._ended or self._cancelled:
            raise RuntimeError("push_text after end_input/cancel")
        return not self._done

    def _audio(self, pcm: bytes) -> None:
        if not self._cancelled and not self._done:
            self._items.put_nowait(Audio(pcm))

    def _event(self, event: Event) -> None:
        if getattr(event, "turn_id", None) not in (None, self.turn_id):
            return  # a late event of an earlier turn of the session
        live = not self._cancelled and not self._done
        if isinstance(event, TurnStarted):
            self._started = True
        elif isinstance(event, WordEvent):
            if live:
                self._items.put_nowait(Word(event.word, event.start_ms / 1000.0))
        elif isinstance(event, FirstAudio):
            self.server_ttfa_ms = event.server_ttfa_ms
        elif isinstance(event, TurnDone):
            self._done = True
            self._items.put_nowait(None)
            self._finished()
        elif isinstance(event, Error):
            if live or (not self._cancelled and event.code not in NON_FATAL_CODES):
                self._items.put_nowait(Notice(event.code, event.message) if event.code in NON_FATAL_CODES
                                       else MynaError(event.code, event.message))
            if not self._started and event.turn_id == self.turn_id and event.code not in NON_FATAL_CODES:
                self._close()  # refused before it began (draining, too_many_turns, ...): no turn_done will come
        elif isinstance(event, Fallback):
            log.info("turn %s moved from %s to %s (%s) at word %d", self.turn_id, event.from_engine,
                     event.to_engine, event.reason, event.at_word)

    def _fail(self, error: MynaError) -> None:
        self._done = True
        if not self._cancelled:
            self._items.put_nowait(error)

    def _close(self) -> None:
        """The turn is over without its ``turn_done`` (refused, or its session closed): the
        iteration ends after what it holds, and the session is free."""
        if not self._done:
            self._done = True
            self._items.put_nowait(None)
            self._finished()

    async def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        self._items.put_nowait(None)
        if self._done or not self._sent_any:
            self._done = True
            self._finished()  # nothing in the session to stop
            return
        await self._cancel_in_session()

    async def _cancel_in_session(self) -> None:
        """Send ``cancel {turn_id}`` to the turn's session: it answers with the turn's
        ``turn_done`` (interrupted), or with ``error`` ``unknown_turn`` if none of the turn's
        text had reached it; either ends the turn here (:meth:`_event`) and frees the session.
        Only this turn is touched, never another turn of the session (``interrupt`` would drop
        them all)."""

    def _finished(self) -> None:
        """The turn is over: its session is free for the next turn."""

    async def __aiter__(self) -> AsyncIterator[TurnItem]:
        while True:
            item = await self._items.get()
            if item is None or self._cancelled:
                return
            if isinstance(item, MynaError):
                raise item
            yield item


# -- in-process ----------------------------------------------------------------------------
class LocalBackend(Backend):
    """Sessions in this process.

    Args:
        engine: a started engine (the caller's); None builds one from ``options``, started by
            :meth:`start` and closed by :meth:`aclose`.
        options: what to build without ``engine`` (default: the embedded Piper voice, no phrase cache).
        voice: voice name (None: the engine's default).
        sample_rate: output rate in Hz (None: the engine's native rate).
        sessions: where the sessions are opened (default: ``myna serve``'s turn limits; no
            message rate, the text comes from this process).
    """

    def __init__(self, engine: Engine | None = None, *, options: EngineOptions | None = None, voice: str | None = None,
                 sample_rate: int | None = None, sessions: Sessions | None = None):
        self._engines: Engines | None = None
        if engine is None:
            self._engines = build_engines(options or EngineOptions(engines="piper"))
            engine = self._engines[self._engines.default]
            voice = voice or self._engines.voice_for(engine.name)
        self.engine = engine
        self.voice = voice
        self.sample_rate = sample_rate or engine.sample_rate
        self.scripts = engine.scripts
        # In-process callers are code, not network peers: no message rate, and no idle bound on
        # a turn (the framework ends its own streams; a pause in its LLM must not end a turn).
        self.sessions = sessions or Sessions(limits=Limits(message_rate=None, turn_idle_s=None))
        self._idle: list[_LocalSession] = []
        self._all: set[_LocalSession] = set()

    async def start(self) -> None:
        if self._engines is not None:
            await self._engines.start()
            await self._engines.warm_up()

    async def open_turn(self) -> Turn:
        local = self._idle.pop() if self._idle else _LocalSession(self)
        self._all.add(local)
        return local.begin()

    def _release(self, local: "_LocalSession") -> None:
        if local not in self._idle:
            self._idle.append(local)

    def _voice_language(self, voice: str | None) -> str | None:
        return language_of(self.engine, voice)

    def _check_voice(self, voice: str) -> None:
        known = getattr(self.engine, "voices", None)
        if known and voice not in known:
            raise MynaError("unknown_voice", f"{self.engine.name} has no voice {voice!r}; available: "
                                             f"{', '.join(v for v in known if v != 'default')}")

    async def aclose(self) -> None:
        for local in list(self._all):
            if local.turn is not None:
                local.turn._close()  # its consumer stops waiting
            await local.session.close()
        self._all.clear()
        self._idle.clear()
        if self._engines is not None:
            await self._engines.close()


class _LocalSession:
    """One session of a :class:`LocalBackend`, carrying at most one turn at a time; the
    :class:`~myna.audio.unpaced.AudioSink` of its output."""

    def __init__(self, backend: LocalBackend):
        self._backend = backend
        self.turn: _LocalTurn | None = None
        self.session: Session = backend.sessions.open(
            backend.engine, lambda s: UnpacedOutput.for_session(s, self, backend.sample_rate), self._send,
            defaults=TurnDefaults(voice=backend.voice))

    def begin(self) -> "_LocalTurn":
        self.turn = _LocalTurn(self)
        return self.turn

    def _send(self, event: Event) -> None:
        if self.turn is not None:
            self.turn._event(event)

    def put_audio(self, turn_id: str, pcm: bytes) -> None:
        if self.turn is not None and self.turn.turn_id == turn_id:
            self.turn._audio(pcm)

    def drop_audio(self, turn_id: str | None = None) -> None:
        """(Nothing is held here: audio goes to its turn at once, which drops it once cancelled.)"""

    def finish(self, turn: "_LocalTurn") -> None:
        if self.turn is turn:
            self.turn = None
            self._backend._release(self)


class _LocalTurn(_EventTurn):
    def __init__(self, local: _LocalSession):
        super().__init__(local._backend._turn_options())
        self._local = local

    async def push_text(self, text: str) -> None:
        if self._takes_text() and text:
            options = {} if self._sent_any else self._options
            self._sent_any = True
            self._local.session.handle(Text(self.turn_id, text, **options))

    async def end_input(self) -> None:
        if not (self._ended or self._cancelled or self._done):
            self._ended = True
            self._sent_any = True
            self._local.session.handle(EndTurn(self.turn_id))

    async def _cancel_in_session(self) -> None:
        self._local.session.handle(Cancel(self.turn_id))

    def _finished(self) -> None:
        self._local.finish(self)


# -- remote --------------------------------------------------------------------------------
class RemoteBackend(Backend):
    """A running worker, through ``GET /v1/tts/stream``.

    Args:
        url: the worker, ``http://host:port`` (or ``ws://``; the path is added if missing).
        engine_name: engine on the worker (None: its default).
        voice: voice name (None: the engine's default).
        sample_rate: rate the worker resamples to (Hz).
        session: an ``aiohttp.ClientSession`` to use (None: the backend owns one, which never
            keeps a refused connection for reuse).
        heartbeat: seconds between this side's pings on each connection (None:
            :data:`HEARTBEAT_S`); a worker that has not answered one within half of it (frozen,
            or gone without a close) fails the turn in progress with the retryable
            ``heartbeat_timeout`` (a turn not yet begun moves to a new connection), and the
            connection is not reused.
        credentials: the access token sent on each connection (None: from the environment,
            see :class:`myna.access.Credentials`). A refused token fails :meth:`start` and
            :meth:`open_turn` with :class:`MynaError` ``token_required``, ``bad_token`` or
            ``forbidden``, its message naming the fix.

    A connection the worker refuses with 503 (``draining``, ``full``, ``not_ready``: see
    :data:`REFUSED_HERE_CODES`) is tried once more at once, on a new TCP connection: behind a
    load balancer that is another worker (the worker closes a refused connection, and the
    backend's own session keeps none for reuse). A second refusal is raised, retryable.
    """

    def __init__(self, url: str, *, engine_name: str | None = None, voice: str | None = None,
                 sample_rate: int = 24_000, session: aiohttp.ClientSession | None = None,
                 credentials: Credentials | None = None, heartbeat: float | None = None):
        url = url.rstrip("/")
        if url.startswith("http"):
            url = "ws" + url[len("http"):]
        if not url.endswith("/v1/tts/stream"):
            url += "/v1/tts/stream"
        self.url = url
        self.engine_name = engine_name
        self.voice = voice
        self.sample_rate = sample_rate
        self.heartbeat = HEARTBEAT_S if heartbeat is None else heartbeat
        self._voices: frozenset[str] | None = None  # the worker's voices, once start() asked
        self._languages: dict[str | None, str | None] = {}  # ... and their languages
        self._credentials = credentials or Credentials()
        self._session = session
        self._owns_session = session is None
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()

    async def start(self) -> None:
        """Open one connection now, so the first turn starts warm and bad settings show early;
        learn the engine's voices (``GET /v1/voices``), so :meth:`update_options` can refuse a
        voice the worker lacks at once."""
        conn = await self._connect()
        self._idle.append(conn)
        self._voices = await self._worker_voices(conn.ready.get("engine"))

    async def _worker_voices(self, engine: str | None) -> frozenset[str] | None:
        """The names ``GET /v1/voices`` lists for ``engine`` (None: not known — an older worker,
        or no answer; the worker then checks each turn's voice itself)."""
        url = "http" + self.url[len("ws"):].removesuffix("/v1/tts/stream") + "/v1/voices"
        try:
            # Connection: close: behind a load balancer a kept-alive connection stays on this
            # worker, and a later WebSocket upgrade reusing it could not move off a draining one.
            async with self._session.get(url, headers={**self._credentials.headers(), "Connection": "close"},
                                         timeout=aiohttp.ClientTimeout(total=CONNECT_TIMEOUT)) as response:
                if response.status != 200:
                    return None
                listed = (await response.json()).get("voices") or []
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
            return None
        mine = [v for v in listed if isinstance(v, dict) and v.get("engine") == engine]
        self._languages = {v.get("name"): v.get("language") for v in mine}
        self._languages[None] = self._languages["default"] = mine[0].get("language") if mine else None
        names = frozenset(v.get("name") for v in mine)
        return names or None

    def _voice_language(self, voice: str | None) -> str | None:
        return self._languages.get(voice)

    def _check_voice(self, voice: str) -> None:
        known = self._voices
        if known and voice not in known and voice != "default":
            raise MynaError("unknown_voice", f"the worker has no voice {voice!r}; available: {', '.join(sorted(known))}")

    async def _connect(self) -> "_Connection":
        """A new connection, ready for a turn; one refused with 503 is tried once more at once,
        on a new TCP connection (behind a load balancer: another worker).

        Raises:
            MynaError: the refusal or failure (``RETRYABLE_CODES`` where a later try may succeed).
        """
        try:
            return await self._connect_once()
        except MynaError as exc:
            if exc.code not in REFUSED_HERE_CODES:
                raise
            log.info("%s refused the connection (%s); trying once more on a new connection", self.url, exc.code)
        return await self._connect_once()

    async def _connect_once(self) -> "_Connection":
        if self._session is None:
            # force_close: a connection is never reused after a response that was not an
            # upgrade (a refusal): a retry opens a new one, which a load balancer may send to
            # another worker. (An upgraded connection is the WebSocket's, unaffected.)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        config = {"type": "config", "sample_rate": self.sample_rate}
        if self.engine_name is not None:
            config["engine"] = self.engine_name
        if self.voice is not None:
            config["voice"] = self.voice
        headers = self._credentials.headers()
        try:
            ws = await asyncio.wait_for(self._session.ws_connect(self.url, headers=headers, max_msg_size=0,
                                                                 heartbeat=self.heartbeat or None),
                                        CONNECT_TIMEOUT)
            conn = _Connection(self, ws)
            await asyncio.wait_for(conn.handshake(config), CONNECT_TIMEOUT)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status in (401, 403, 431):
                refused = AccessRefused.from_status(exc.status, token_sent=bool(headers), headers=exc.headers)
                raise MynaError(refused.code, refused.message) from None
            if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status == 503:
                code = (exc.headers or {}).get(ERROR_HEADER) or "unavailable"
                raise MynaError(code if code in RETRYABLE_CODES else "unavailable",
                                f"{self.url} cannot take a session now ({code}); retry, or connect to another "
                                "worker") from None
            raise MynaError("connection_failed", f"cannot reach {self.url}: {str(exc) or type(exc).__name__}") from None
        self._all.add(conn)
        self.scripts = frozenset(conn.ready.get("scripts") or LATIN)
        return conn

    async def open_turn(self) -> Turn:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                return conn.begin()
        return (await self._connect()).begin()

    def _release(self, conn: "_Connection") -> None:
        if conn.usable and conn not in self._idle:
            self._idle.append(conn)

    async def aclose(self) -> None:
        for conn in list(self._all):
            await conn.close()
        self._all.clear()
        self._idle.clear()
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None


class _Connection:
    """One WebSocket; carries at most one turn at a time."""

    def __init__(self, backend: RemoteBackend, ws: aiohttp.ClientWebSocketResponse):
        self._backend = backend
        self._ws = ws
        self._turn: _RemoteTurn | None = None
        self._reader: asyncio.Task | None = None
        self.ready: dict | None = None
        self.retired = False  # a turn left it (the worker drains): never pooled again

    @property
    def usable(self) -> bool:
        return (not self.retired and not self._ws.closed and self._turn is None and self._reader is not None
                and not self._reader.done())

    async def handshake(self, config: dict) -> None:
        """Read the greeting ``ready``, send ``config``, read its answer."""
        first = await self._receive_json()
        if first.get("type") != "ready":
            raise MynaError("protocol", f"expected ready, got {first}")
        await self._ws.send_str(json.dumps(config))
        answer = await self._receive_json()
        if answer.get("type") == "error":
            await self._ws.close()
            raise MynaError(answer.get("code", "error"), answer.get("message", ""))
        if answer.get("type") != "ready" or answer.get("sample_rate") != config["sample_rate"]:
            raise MynaError("protocol", f"unexpected answer to config: {answer}")
        self.ready = answer
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _receive_json(self) -> dict:
        msg = await self._ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise MynaError("protocol", f"expected a JSON message, got {msg.type!r}")
        return json.loads(msg.data)

    def begin(self) -> "_RemoteTurn":
        self._turn = _RemoteTurn(self)
        return self._turn

    async def send(self, message: dict) -> None:
        try:
            await self._ws.send_str(json.dumps(message))
        except (ConnectionError, RuntimeError) as exc:
            raise MynaError("connection_lost", f"worker connection lost: {exc}") from None

    def finish(self, turn: "_RemoteTurn") -> None:
        """``turn`` got its ``turn_done`` (or never started): the connection is free again."""
        if self._turn is turn:
            self._turn = None
            self._backend._release(self)

    async def _read(self) -> None:
        try:
            async for msg in self._ws:
                turn = self._turn
                if msg.type == aiohttp.WSMsgType.BINARY:
                    if turn is not None:
                        turn._audio(msg.data)
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    event = decode_event(json.loads(msg.data))
                    if turn is not None and event is not None:
                        turn._event(event)
                else:
                    break
        finally:
            if self._turn is not None:
                if isinstance(self._ws.exception(), asyncio.TimeoutError):  # no pong: frozen or gone
                    self._turn._fail(MynaError("heartbeat_timeout", f"the worker stopped answering pings "
                                                                    f"({self._backend.heartbeat / 2:g} s without a pong)"))
                else:
                    self._turn._fail(MynaError("connection_lost", "the worker closed the connection"))

    async def close(self) -> None:
        await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)


class _RemoteTurn(_EventTurn):
    """A turn on a worker connection. A turn the worker refuses before it began because it is
    draining (``error`` ``draining``), or whose connection was lost before it began (a pooled
    connection the draining worker closed with 1001), moves once to a new connection to the same
    URL (behind a load balancer, another worker) and is sent again from its first chunk: nothing
    of it was spoken, so nothing is heard twice."""

    def __init__(self, conn: _Connection):
        super().__init__(conn._backend._turn_options())
        self._conn = conn
        self._first = True  # the next text message is the turn's first: it carries the options
        self._replay: list[dict] = []  # every message sent before turn_started, for a move
        self._moved = False
        self._moving: asyncio.Task | None = None

        self._pending = ""  # text pushed, not yet sent
        self._sender: asyncio.Task | None = None
        self._ending = asyncio.Event()  # end_input: send what is pending now
        self._send_error: MynaError | None = None

    async def push_text(self, text: str) -> None:
        """Queue ``text``; it goes out coalesced (see :data:`COALESCE_S`): the first chunk at
        once, what the LLM writes meanwhile as one message a little later."""
        if self._takes_text() and text:
            self._sent_any = True
            if self._send_error is not None:
                raise self._send_error
            self._pending += text
            if self._sender is None or self._sender.done():
                self._sender = asyncio.get_running_loop().create_task(self._send_pending())

    async def _send_pending(self) -> None:
        try:
            while True:
                while self._pending:
                    text, self._pending = self._pending[:MAX_MESSAGE_CHARS], self._pending[MAX_MESSAGE_CHARS:]
                    message = {"type": "text", "turn_id": self.turn_id, "text": text}
                    if self._first:
                        message.update(self._options)
                        self._first = False
                    await self._send(message)
                if self._ending.is_set():
                    return
                try:  # hold what comes next for a moment, to send it as one message
                    await asyncio.wait_for(self._ending.wait(), COALESCE_S)
                except asyncio.TimeoutError:
                    pass
                if not self._pending:
                    return
        except MynaError as exc:
            self._send_error = exc

    async def end_input(self) -> None:
        if self._ended or self._cancelled or self._done:
            return
        self._ended = True
        self._sent_any = True
        self._ending.set()
        if self._sender is not None:
            await self._sender
        if self._pending and self._send_error is None:  # (pushed while no sender ran)
            await self._send_pending()
        if self._send_error is not None:
            raise self._send_error
        await self._send({"type": "end_turn", "turn_id": self.turn_id})

    async def _send(self, message: dict) -> None:
        """Send on the turn's connection (after a move in progress); remembered for a move until
        the turn has started."""
        if self._moving is not None:
            await asyncio.shield(self._moving)
        if self._send_error is not None:
            raise self._send_error
        if not self._started:
            self._replay.append(message)
        try:
            await self._conn.send(message)
        except MynaError as exc:
            if exc.code != "connection_lost" or not self._may_move():
                raise
            self._move()  # (the message is in the replay)

    def _may_move(self) -> bool:
        return not (self._moved or self._started or self._cancelled or self._done)

    def _event(self, event: Event) -> None:
        if (isinstance(event, Error) and event.code == "draining" and event.turn_id == self.turn_id
                and self._may_move()):
            self._move()
            return
        super()._event(event)
        if self._started:
            self._replay = []

    def _fail(self, error: MynaError) -> None:
        if error.code in ("connection_lost", "heartbeat_timeout") and self._may_move():
            self._move()
            return
        super()._fail(error)

    def _move(self) -> None:
        """Leave this connection (it is not pooled again) for a new one, once."""
        self._moved = True
        old, old._turn = self._conn, None
        old.retired = True
        self._moving = asyncio.get_running_loop().create_task(self._reconnect(old))

    async def _reconnect(self, old: _Connection) -> None:
        log.info("turn %s: the worker is draining (or the connection was lost) before it began; reconnecting",
                 self.turn_id)
        await old.close()
        try:
            conn = await self._conn._backend._connect()
            conn._turn, self._conn = self, conn
            for message in self._replay:
                await conn.send(message)
        except MynaError as exc:
            self._send_error = exc
            super()._fail(exc)
        finally:
            self._moving = None

    async def _cancel_in_session(self) -> None:
        self._pending = ""
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        try:  # (if the sender was stopped before its first message, the worker answers unknown_turn)
            await self._send({"type": "cancel", "turn_id": self.turn_id})
        except MynaError:
            self._close()  # the connection is gone: nothing left to stop

    def _finished(self) -> None:
        self._conn.finish(self)
