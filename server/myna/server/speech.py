"""The OpenAI speech door: ``POST /v1/audio/speech`` and ``GET /v1/models``, OpenAI-compatible.

For applications and agent tools that speak only through an OpenAI client pointed at a server
(``OpenAI(base_url="http://worker:8080/v1", api_key=TOKEN)``). One request is one
:class:`~myna.session.Session` with one turn whose whole text is the request's ``input``; its
output is an :class:`~myna.audio.unpaced.UnpacedOutput` at the format's rate, and each piece of
PCM is encoded (:class:`~myna.audio.encode.StreamEncoder`, PyAV) and written to the response the
moment the engine has made it, with an ``X-Request-Id`` (OpenAI's client reports it as
``request_id``; LiveKit's plug-in logs its absence).

The response's length is not known when it starts, so it is streamed: over HTTP/1.1 as
``Transfer-Encoding: chunked``; over HTTP/1.0 (nginx's default ``proxy_http_version 1.0``, older
proxies), which has no chunked encoding, with neither ``Transfer-Encoding`` nor
``Content-Length`` and ``Connection: close``: the body ends when the worker closes the
connection (RFC 1945 §7.2.2), also when the client asked to keep it alive. Every
``response_format`` and ``stream_format`` streams so. Refusals are whole JSON responses with a
``Content-Length`` on either version.

The request body (JSON):

- ``input`` (string, required): the text; at most ``--max-turn-chars``.
- ``model`` (string, required): a loaded engine (``piper``, ``dsm``, …) or one of OpenAI's
  models, :data:`OPENAI_MODELS` (``tts-1``, ``tts-1-hd``, ``gpt-4o-mini-tts``), which mean the
  worker's default engine.
- ``voice`` (string, required by OpenAI's client): a voice of that engine, or one of OpenAI's
  voice names (:data:`OPENAI_VOICES`: ``alloy``, ``nova``, …), which mean the engine's default
  voice; anything else is 400 ``unknown_voice``.
- ``response_format``: :data:`myna.audio.encode.FORMATS` (``mp3``, OpenAI's default, ``opus``,
  ``aac``, ``flac``, ``wav``, ``pcm`` = raw s16le mono at 24 kHz, and ``pcm_mulaw`` /
  ``pcm_alaw`` = raw G.711 at 8 kHz).
- ``speed``: 0.5 to 2.0 × the voice's pace (Piper: its length scale, see
  :meth:`myna.engines.SynthesisStream.set_speed`); OpenAI's range is 0.25–4.0, and a value in
  it but outside Myna's is 400 ``unsupported_speed`` naming Myna's range, as is any speed but
  1.0 on an engine that speaks at its own pace (DSM), rather than ignored.
- ``instructions`` (``gpt-4o-mini-tts``'s style prompt): accepted and ignored.
- ``stream_format``: ``audio`` (the default: the encoded audio is the body) or ``sse`` (OpenAI's
  server-sent events, ``text/event-stream``: each encoded piece is one ``speech.audio.delta``
  event, ``{"type", "audio"}`` with the bytes in base64, and a ``speech.audio.done`` event ends
  the stream; OpenAI offers ``sse`` with ``gpt-4o-mini-tts``, and LiveKit Agents' OpenAI plug-in
  asks for it with every model but ``tts-1``/``tts-1-hd``). Anything else is 400
  ``unsupported_stream_format``.
- ``normalise`` (Myna's, not OpenAI's): ``false`` reads the input as written (no phone
  numbers, dates, units or codes said in words: :mod:`myna.text.normaliser`); default true.
- ``phrase_cache`` (Myna's): ``false`` synthesises every unit, none from the worker's phrase
  cache (:mod:`myna.engines.phrase_cache`; the race page sends it unless its cache box is
  ticked); default true.

Input with nothing to speak. An ``input`` that is non-empty but has nothing speakable in it
(``"👍"``, ``"…"``, ``":)"``, only markup: the text front end leaves no word) is answered, not
refused: 200, :data:`NOTHING_TO_SPEAK_HEADER` ``: 1``, and :data:`NOTHING_TO_SPEAK_MS` (10 ms) of
digital silence encoded in the requested format (with ``sse``: one ``speech.audio.delta`` of it,
then ``speech.audio.done``). Frameworks' OpenAI services send such text as a request of its own
(Pipecat's ``OpenAITTSService`` sends a reply's trailing emoji so, and its ``run_tts``,
``pipecat.services.openai.tts``, turns any non-200 into an ``ErrorFrame``), so a refusal was an error for every such
reply. Silence rather than an empty file: LiveKit Agents' ``ChunkedStream`` raises
``APIError("no audio frames were pushed for text: ...")`` (and retries) when a text with
non-whitespace gets no audio (``livekit/agents/tts/tts.py``, livekit-agents 1.8), so a
header-only file would still be an error there; 10 ms is also what Myna's own LiveKit plug-in
gives such a segment. Others do the same or near it: Kokoro-FastAPI, streaming (its default),
answers such input 200 with an empty body (``remsky/Kokoro-FastAPI``,
``api/src/services/tts_service.py`` ``generate_audio_stream`` yields nothing when no chunk had
text, and ``api/src/routers/openai_compatible.py`` streams that as a 200; only its non-streamed
``stream: false`` raises "Input contains no speakable text", a 400); OpenAI's API reference
documents no refusal for speakable-less input. A client that sends no text at all (``input``
missing, not a string, empty or only whitespace) still learns it: 400 ``bad_request``,
``param`` ``input``. Text whose only words are in a script the voice cannot read is still
400 ``unsupported_language``: that is an error the client should hear of. The WebSocket and
the data channel already answer such a turn with
``turn_started`` then ``turn_done`` (``audio_ms`` 0) and no ``error`` (the session is the same).

Requests pass the worker's token check (``Authorization: Bearer``, which is how OpenAI's
client sends its ``api_key``) and its session admission (sessions at once, per client, and the
pace of new ones: the same as offers and WebSocket connections), and each one is a session
with the session limits. Errors are OpenAI's shape, ``{"error": {"message", "type", "param",
"code"}}`` (:func:`openai_error`), with Myna's error code in ``code``; an error that comes
after the first audio byte has gone out cannot change the status: the stream ends there (a
part of the turn that could not be spoken is left out, as on every door).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import uuid
from collections import deque

from aiohttp import HttpVersion11, web

from myna.audio.encode import FORMATS, AudioFormat, StreamEncoder, available_formats
from myna.audio.unpaced import UnpacedOutput
from myna.engines.base import MAX_SPEED, MIN_SPEED
from myna.errors import HTTPError
from myna.events import Error, Event, TurnDone
from myna.messages import EndTurn, Text, TurnDefaults, quote_input
from myna.session import Session

log = logging.getLogger(__name__)

PATH = "/v1/audio/speech"
MODELS_PATH = "/v1/models"
#: OpenAI's speech models: each means the worker's default engine.
OPENAI_MODELS = frozenset({"tts-1", "tts-1-hd", "gpt-4o-mini-tts"})
#: OpenAI's voice names: each means the engine's default voice (Myna has no voice of that name).
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                           "shimmer", "verse", "marin", "cedar"})
#: The response's type for ``stream_format: "sse"``.
SSE_CONTENT_TYPE = "text/event-stream"
#: OpenAI's ``response_format`` default.
DEFAULT_FORMAT = "mp3"
#: PCM a response may have queued but unwritten before it is cut off (s16 bytes; as the WebSocket).
MAX_QUEUED_AUDIO_BYTES = 16 * 2**20
#: The header of a 200 whose input had nothing speakable in it (its body: silence).
NOTHING_TO_SPEAK_HEADER = "X-Myna-Nothing-To-Speak"
#: The silence such a response carries (ms): audio a client can decode, and not none, since
#: LiveKit Agents' TTS streams raise ``APIError("no audio frames were pushed ...")`` for a
#: text with no audio.
NOTHING_TO_SPEAK_MS = 10
_TURN_ID = "speech"
#: Errors that may come before any audio and are the request's fault (400), not the worker's (500).
_CLIENT_CODES = frozenset({"unsupported_language", "turn_too_long", "unsupported_speed"})
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}


class SpeechError(HTTPError):
    """A refused speech request, naming the body field at fault (``param``; None: none)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 retry_after: int | None = None):
        super().__init__(status, code, message, retry_after)
        self.param = param


def openai_error(status: int, code: str, message: str, param: str | None = None,
                 retry_after: int | None = None) -> web.Response:
    """An error response in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``;
    ``type`` follows the status (``invalid_request_error``, ``authentication_error``,
    ``permission_error``, ``rate_limit_error``, else ``server_error``)."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    body = {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


class SpeechRequest:
    """A checked request body (see the module docstring).

    Attributes:
        text: ``input``; engine_name: the engine (None: the default); voice: the voice (None:
        the engine's default); fmt: the :class:`~myna.audio.encode.AudioFormat`.

    Raises:
        SpeechError: 400 with the field at fault in ``param``; 404 ``model_not_found``.
    """

    def __init__(self, body: dict, engines: list[str]):
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise SpeechError(400, "bad_request", '"input" must be a non-empty string', "input")
        self.text = text
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise SpeechError(400, "bad_request", f'"model" must be a string: an engine ({", ".join(engines)}) '
                                                  f'or one of {", ".join(sorted(OPENAI_MODELS))}', "model")
        if model not in engines and model not in OPENAI_MODELS:
            raise SpeechError(404, "model_not_found", f"unknown model {quote_input(model)}; loaded engines: "
                                                      f"{', '.join(engines)} (or {', '.join(sorted(OPENAI_MODELS))})",
                              "model")
        self.engine_name = None if model in OPENAI_MODELS else model
        voice = body.get("voice")
        if voice is not None and not isinstance(voice, str):
            raise SpeechError(400, "bad_request", '"voice" must be a string', "voice")
        self.voice = None if voice in OPENAI_VOICES or voice == "" else voice
        name = body.get("response_format") or DEFAULT_FORMAT
        if not isinstance(name, str) or name not in FORMATS:
            raise SpeechError(400, "unsupported_format", f'"response_format" must be one of {", ".join(FORMATS)}',
                              "response_format")
        if name not in available_formats():
            raise SpeechError(400, "unsupported_format", f"this worker's FFmpeg cannot encode {name}; "
                                                         f"available: {', '.join(available_formats())}",
                              "response_format")
        self.fmt: AudioFormat = FORMATS[name]
        speed = body.get("speed", 1.0)
        if speed is None:
            speed = 1.0
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not math.isfinite(speed) \
                or not 0.25 <= speed <= 4.0:
            raise SpeechError(400, "bad_request", '"speed" must be a number from 0.25 to 4.0', "speed")
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise SpeechError(400, "unsupported_speed", f"Myna speaks from speed {MIN_SPEED:g} to {MAX_SPEED:g} "
                                                        f"(1.0: the voice's own pace), not {speed:g}", "speed")
        self.speed = float(speed)  # (an engine that cannot change its pace refuses any but 1.0: unsupported_speed)
        stream_format = body.get("stream_format", "audio")
        if stream_format not in (None, "audio", "sse"):
            raise SpeechError(400, "unsupported_stream_format", '"stream_format" must be "audio" or "sse"',
                              "stream_format")
        self.sse = stream_format == "sse"
        self.normalise = body.get("normalise", True)
        self.phrase_cache = body.get("phrase_cache", True)
        for name in ("normalise", "phrase_cache"):
            if not isinstance(getattr(self, name), bool):
                raise SpeechError(400, "bad_request", f'"{name}" must be true or false', name)
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise SpeechError(400, "bad_request", '"instructions" must be a string', "instructions")


class SpeechTurn:
    """One request's session and the queue between its output and the response.

    It is the session output's :class:`~myna.audio.unpaced.AudioSink` (PCM into a queue) and
    its event sink (the turn's end and its errors); :meth:`respond` writes the queue out.
    Nobody listens through this door, so the output is made with ``ahead``: the request is
    synthesised ahead of real time, in what paced sessions leave (:mod:`myna.engines.scheduler`,
    ahead jobs), while at most half of :data:`MAX_QUEUED_AUDIO_BYTES` waits in the queue.
    """

    def __init__(self, worker, request: SpeechRequest, engine, voice: str | None):
        self._worker = worker
        self._fmt = request.fmt
        self._sse = request.sse
        self._speed = request.speed
        self._items: deque[bytes] = deque()
        self._queued = 0
        self._overflowed = False
        self._wake = asyncio.Event()
        self.done = False
        self.errors: list[Error] = []
        # Nobody listens through Myna: the client keeps the audio, so synthesis runs ahead of
        # real time (in what paced sessions leave), while it reads what it is given: past half
        # the queue's cap the horizon holds synthesis again, so a slow reader is not cut off.
        self.session: Session = worker.sessions.open(
            engine, lambda s: UnpacedOutput.for_session(s, self, self._fmt.rate,
                                                        ahead=lambda: self._queued <= MAX_QUEUED_AUDIO_BYTES // 2),
            self._event, defaults=TurnDefaults(voice=voice, normalise=request.normalise, phrase_cache=request.phrase_cache))

    # -- the session's sinks ------------------------------------------------------------------
    def put_audio(self, turn_id: str, pcm: bytes) -> None:
        if self._overflowed:
            return
        self._queued += len(pcm)
        if self._queued > MAX_QUEUED_AUDIO_BYTES:
            self._overflowed = True
            self._items.clear()
            log.warning("speech: over %d MiB of audio unread; the response is cut off", MAX_QUEUED_AUDIO_BYTES // 2**20)
        else:
            self._items.append(pcm)
        self._wake.set()

    def drop_audio(self, turn_id: str | None = None) -> None:
        self._items.clear()  # (one turn)
        self._queued = 0

    def _event(self, event: Event) -> None:
        if isinstance(event, Error):
            self.errors.append(event)
            log.info("speech: %s: %s", event.code, event.message)
        elif isinstance(event, TurnDone):
            self.done = True
        self._wake.set()

    # -- the response -------------------------------------------------------------------------
    def _ended(self) -> bool:
        """Nothing more will come: the turn is done, was refused (an error and no turn), or
        the queue overflowed."""
        return self._overflowed or self.done or (bool(self.errors) and not self.session.busy)

    async def respond(self, request: web.Request, text: str) -> web.StreamResponse:
        """Speak ``text`` into a streamed response (see the module docstring, "The response").

        The response starts with the first encoded bytes: an error before them is an OpenAI
        error response instead (:meth:`_refusal`); a turn that ends with neither audio nor an
        error (nothing speakable in ``text``) is answered with :data:`NOTHING_TO_SPEAK_MS` of
        silence and the :data:`NOTHING_TO_SPEAK_HEADER`."""
        self.session.handle(Text(_TURN_ID, text, speed=self._speed if self._speed != 1.0 else None))
        self.session.handle(EndTurn(_TURN_ID))
        encoder = StreamEncoder(self._fmt)
        response: web.StreamResponse | None = None
        try:
            while True:
                while not self._items and not self._ended():
                    self._wake.clear()
                    await self._wake.wait()
                last = not self._items
                silent = last and response is None and not self.errors and not self._overflowed
                if last:
                    data = (encoder.encode(silence(self._fmt)) if silent else b"") + encoder.finish()
                else:
                    pcm = self._items.popleft()
                    self._queued -= len(pcm)
                    data = encoder.encode(pcm)
                if data:
                    if response is None:
                        response = await self._start(request, nothing_to_speak=silent)
                    await response.write(_sse_event("speech.audio.delta", audio=base64.b64encode(data).decode())
                                         if self._sse else data)
                if last:
                    if response is not None and self._sse:
                        await response.write(_sse_event("speech.audio.done"))
                    break
            if response is None:
                return self._refusal()
            await response.write_eof()
            return response
        except ConnectionError:  # the client went away mid-stream
            log.debug("speech: the client went away")
            return response
        finally:
            encoder.close()
            await self.session.close()

    async def _start(self, request: web.Request, nothing_to_speak: bool) -> web.StreamResponse:
        """Send the status line and headers of a streamed 200.

        Its length is not known, so HTTP/1.1 gets ``Transfer-Encoding: chunked`` (aiohttp's
        choice for a body of unknown length) and HTTP/1.0, which has no chunked encoding, a
        body that the closing of the connection ends (``Connection: close``, no
        ``Content-Length``), even when the client asked to keep the connection alive."""
        headers = {"Content-Type": SSE_CONTENT_TYPE if self._sse else self._fmt.content_type,
                   "X-Request-Id": uuid.uuid4().hex}
        if nothing_to_speak:
            headers[NOTHING_TO_SPEAK_HEADER] = "1"
        if request.version < HttpVersion11:
            headers["Connection"] = "close"
        response = web.StreamResponse(headers=headers)
        if request.version < HttpVersion11:
            response.force_close()
        await response.prepare(request)
        return response

    def _refusal(self) -> web.Response:
        """The error response of a turn that ended with an error before any audio."""
        if not self.errors:  # (its audio overflowed before the first byte went out)
            self._worker.metrics.errors.labels("internal").inc()
            return openai_error(500, "internal", "the turn ended without audio")
        error = self.errors[0]  # (counted in the metrics by the session)
        status = 503 if error.code == "draining" else 400 if error.code in _CLIENT_CODES else 500
        param = {"unsupported_speed": "speed", "unknown_voice": "voice"}.get(error.code, "input")
        return openai_error(status, error.code, error.message, param if status == 400 else None,
                            30 if status == 503 else None)


def silence(fmt: AudioFormat) -> bytes:
    """:data:`NOTHING_TO_SPEAK_MS` of digital silence as s16le mono PCM at ``fmt.rate`` (what
    a request with nothing speakable is answered with, encoded in its format)."""
    return bytes(2 * (fmt.rate * NOTHING_TO_SPEAK_MS // 1000))


def _sse_event(kind: str, **fields) -> bytes:
    """One server-sent event of OpenAI's speech stream: ``data: {"type": kind, ...}``."""
    return b"data: " + json.dumps({"type": kind, **fields}).encode() + b"\n\n"


# -- HTTP layer --------------------------------------------------------------------------
_WORKER = web.AppKey("speech_worker", object)


def _openai_errors(handler):
    """Answer every refusal of ``handler`` in OpenAI's error shape (never a traceback)."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        worker = request.app[_WORKER]
        try:
            return await handler(request, worker)
        except HTTPError as exc:  # also SpeechError, AuthError, LimitExceeded
            worker.metrics.errors.labels(exc.code).inc()
            return openai_error(exc.status, exc.code, exc.message, getattr(exc, "param", None), exc.retry_after)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return openai_error(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
        except Exception:
            log.exception("unhandled error in %s %s", request.method, request.path)
            worker.metrics.errors.labels("internal").inc()
            return openai_error(500, "internal", "internal error")

    return wrapped


async def _body(request: web.Request) -> dict:
    try:
        raw = await request.read()
    except web.HTTPException:
        raise  # 413
    except Exception:
        raise SpeechError(400, "bad_body", "the request body could not be read") from None
    try:
        body = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise SpeechError(400, "bad_json", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise SpeechError(400, "bad_request", "the body must be a JSON object")
    return body


@_openai_errors
async def _speech(request: web.Request, worker) -> web.StreamResponse:
    grant = worker.authorize(request)
    body = await _body(request)
    speech = SpeechRequest(body, list(worker.engines))
    try:
        engine, voice = worker.choose(speech.engine_name, speech.voice, grant)
    except HTTPError as exc:
        param = {"unknown_voice": "voice", "unknown_engine": "model", "forbidden": "model"}.get(exc.code)
        raise SpeechError(exc.status, exc.code, exc.message, param, exc.retry_after) from None
    cap = worker.limits.max_turn_chars
    if cap is not None and len(speech.text) > cap:
        raise SpeechError(400, "turn_too_long", f'"input" may carry at most {cap} characters', "input")
    release = worker.admit(worker.client_of(request, grant), grant)
    try:
        turn = SpeechTurn(worker, speech, engine, voice)
        return await turn.respond(request, speech.text)
    finally:
        release()


@_openai_errors
async def _models(request: web.Request, worker) -> web.Response:
    grant = worker.authorize(request)
    names = [n for n in worker.engines if grant is None or grant.engines is None or n in grant.engines]
    return web.json_response({"object": "list", "data": [_model(n) for n in names]})


@_openai_errors
async def _model_by_id(request: web.Request, worker) -> web.Response:
    grant = worker.authorize(request)
    name = request.match_info["model"]
    if name not in worker.engines or (grant is not None and grant.engines is not None and name not in grant.engines):
        raise SpeechError(404, "model_not_found", f"unknown model {quote_input(name)}", "model")
    return web.json_response(_model(name))


def _model(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "myna"}


def add_speech(app: web.Application, worker) -> None:
    """Register ``POST /v1/audio/speech``, ``GET /v1/models`` and ``GET /v1/models/{model}``
    on ``app`` for ``worker`` (a :class:`myna.server.app.Worker`)."""
    app[_WORKER] = worker
    app.router.add_post(PATH, _speech)
    app.router.add_get(MODELS_PATH, _models)
    app.router.add_get(MODELS_PATH + "/{model}", _model_by_id)
