"""Myna as a LiveKit Agents TTS: :class:`TTS` (``pip install 'myna[livekit]'``).

Usage::

    from myna.integrations import livekit as myna_livekit

    session = AgentSession(tts=myna_livekit.TTS(), ...)            # in-process, embedded voice
    session = AgentSession(tts=myna_livekit.TTS(url="http://gpu-box:8080"), ...)   # remote worker
    myna_livekit.TTS(url="https://gpu-box", token=jwt)     # a worker with keys (or MYNA_TOKEN)

How it meets the ``tts.TTS`` contract (livekit-agents 1.x, ``livekit/agents/tts/tts.py``):

- ``capabilities.streaming`` is True, so ``Agent.tts_node`` streams LLM text straight in:
  :meth:`TTS.stream` returns a :class:`SynthesizeStream` whose ``_run`` reads the pushed
  tokens, opens one Myna turn per segment (text up to ``flush()``), and pushes the turn's PCM
  into the framework's ``AudioEmitter`` (``mime_type="audio/pcm"``, ``stream=True``) between
  ``start_segment(segment_id=<turn id>)`` and ``end_segment()``.
- ``_mark_started()`` is called when a segment's first text goes to Myna, so the framework's
  metrics task reports ``TTSMetrics.ttfb`` (first text sent → first audio frame out).
- Word timings go out as ``TimedString`` s (seconds from the segment's first sample;
  ``aligned_transcript=True``).
- :meth:`TTS.synthesize` (non-streaming) wraps a stream (``_synthesize_with_stream``).
- The underscored names used here (``_run``, ``_input_ch``, ``_FlushSentinel``,
  ``_mark_started``, ``_synthesize_with_stream``) are the framework's hooks for TTS subclasses,
  not internals: ``tts.SynthesizeStream`` has no public way to read the pushed text, and every
  TTS plug-in of livekit-agents is written against these same names.
- Barge-in and thrown-away replies: ``aclose()`` on a stream (or a ``ChunkedStream`` from
  :meth:`TTS.synthesize`) cancels ``_run``, which is how the framework drops a reply on an
  interruption and a preemptive generation (``preemptive_tts``) whose user turn went on; the
  stream's Myna turn is cancelled with it by ``cancel {turn_id}``, which stops that turn only:
  other streams of the same ``TTS`` (each segment is its own turn, on its own session) play on.
  Remotely the turn's connection then goes back to the pool.
- Pause and resume (``resume_false_interruption``): the framework pauses its *audio output*
  (``io.AudioOutput.pause``/``resume``, where ``can_pause``), downstream of the TTS, which is not
  told; the TTS has handed its audio over already. So Myna's ``pause``/``resume`` are not used
  here: the framework's own pause applies, and resumes from the paused sample, not from the
  start of the cut word.
- Segments with nothing to say (``"..."``, ``":)"``, ``"**"``, emoji, markup): the framework
  raises "no audio frames were pushed" for a segment whose text is not blank but which gave no
  audio, and retries it, and an agent session closes after a few such errors. Nothing to say is
  not a failure, so such a segment gets :data:`EMPTY_SEGMENT_MS` of silence: no error, no
  retry, nothing spoken.
- A refused token (a remote worker with keys: no token, a bad or expired one, one that may not
  use the engine) raises the framework's ``APIStatusError`` (status 401 or 403, not retryable,
  ``body={"code", "message"}``) whose message names the fix; the framework reports it as a
  non-recoverable TTS error (``tts.on("error")``), with no retries.
- Problems a turn survives (``unsupported_language``) are logged as warnings; the rest of the
  segment is spoken.
"""

from __future__ import annotations

import asyncio
import logging

from livekit.agents import APIConnectionError, APIConnectOptions, APIError, APIStatusError, tts
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, NotGivenOr, TimedString
from livekit.agents.utils import is_given, shortuuid

from myna.access import ACCESS_STATUS, Credentials
from myna.engines import Engine
from myna.integrations.backend import RETRYABLE_CODES, Audio, MynaError, Notice, Turn, create_backend

__all__ = ["TTS", "SynthesizeStream"]

log = logging.getLogger(__name__)

#: Silence given to a segment with nothing speakable in it (ms), so the framework sees audio.
EMPTY_SEGMENT_MS = 10


class TTS(tts.TTS):
    """LiveKit Agents TTS backed by Myna, in-process or remote.

    Args:
        engine: a started in-process engine (shared, not closed here). None with no ``url``:
            the embedded Piper voice, loaded on first use or :meth:`prewarm` (~3 s), owned here.
        url: a running Myna worker (``http://host:port``); uses ``GET /v1/tts/stream``.
        engine_name: the worker's engine (remote only; None: its default).
        voice: voice name (None: the engine's default).
        speed: pace, 0.5 to 2.0 × the voice's own (None: 1.0).
        sample_rate: output rate in Hz (None: the engine's native rate in-process, 24000 remote).
        token: access token for a worker with keys (remote only; None: ``MYNA_TOKEN``).
        api_key, api_secret: the worker's key pair, to mint a token per connection instead
            (None: ``MYNA_API_KEY``/``MYNA_API_SECRET``); see :class:`myna.access.Credentials`.
    """

    def __init__(
        self,
        *,
        engine: Engine | None = None,
        url: str | None = None,
        engine_name: str | None = None,
        voice: str | None = None,
        speed: float | None = None,
        sample_rate: int | None = None,
        token: str | None = None,
        api_key: str | None = None,
        api_secret: str | None = None,
    ) -> None:
        credentials = Credentials(token, api_key=api_key, api_secret=api_secret) if url is not None else None
        backend = create_backend(engine=engine, url=url, engine_name=engine_name, voice=voice, sample_rate=sample_rate,
                                 credentials=credentials)
        self._model = (engine_name or "default") if url is not None else backend.engine.name
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=backend.sample_rate,
            num_channels=1,
        )
        self._backend = backend
        self._started: asyncio.Task | None = None
        if speed is not None:
            self.update_options(speed=speed)

    @property
    def model(self) -> str:
        return self._model

    @property
    def provider(self) -> str:
        return "myna"

    def prewarm(self) -> None:
        """Start loading the voice / opening a connection now (needs a running event loop)."""
        try:
            self._ensure_started_task()
        except RuntimeError:
            pass  # no running loop: start on first use

    def _ensure_started_task(self) -> asyncio.Task:
        if self._started is None:
            self._started = asyncio.get_running_loop().create_task(self._backend.start())
        return self._started

    async def _open_turn(self) -> Turn:
        try:
            await asyncio.shield(self._ensure_started_task())
            return await self._backend.open_turn()
        except MynaError as exc:
            self._started = None if exc.code in RETRYABLE_CODES else self._started
            raise _api_error(exc) from None

    def update_options(self, *, voice: NotGivenOr[str] = NOT_GIVEN, speed: NotGivenOr[float] = NOT_GIVEN,
                       language: NotGivenOr[str] = NOT_GIVEN) -> None:
        """Speak the segments that start from now on in ``voice``, at ``speed`` (0.5 to 2.0 ×
        the voice's pace) and/or in ``language`` (a tag the voice must speak; it does not change
        how the voice reads); a segment being spoken keeps its own. Nothing reconnects.

        Raises:
            ValueError: a speed outside 0.5 to 2.0 or not a number, a voice that is not a
                non-empty string, or (in-process) a voice the engine lacks; its message starts
                with the Myna code (``bad_speed``, ``bad_message``, ``unknown_voice``,
                ``bad_language``, ``wrong_language``). Nothing
                changes. A voice a remote worker lacks fails the next segment instead
                (``APIError``, code ``unknown_voice``); the segments after it are spoken.
        """
        try:
            self._backend.update_options(voice=voice if is_given(voice) else None,
                                         speed=speed if is_given(speed) else None,
                                         language=language if is_given(language) else None)
        except MynaError as exc:
            raise ValueError(str(exc)) from None

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> tts.ChunkedStream:
        """Non-streaming synthesis of ``text`` (one segment)."""
        return self._synthesize_with_stream(text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> "SynthesizeStream":
        """A stream for one reply: ``push_text`` tokens, ``flush()`` per segment, ``end_input()``."""
        return SynthesizeStream(tts=self, conn_options=conn_options)

    async def aclose(self) -> None:
        if self._started is not None:
            await asyncio.gather(self._started, return_exceptions=True)
        await self._backend.aclose()


class SynthesizeStream(tts.SynthesizeStream):
    """One reply; each segment (text between flushes) is one Myna turn."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._myna: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=shortuuid(),
            sample_rate=self._myna.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )
        turn: Turn | None = None
        reader: asyncio.Task | None = None
        try:
            async for item in self._input_ch:
                if isinstance(item, self._FlushSentinel):
                    if turn is not None:
                        await turn.end_input()
                        await self._finish_segment(reader, output_emitter)
                        turn = reader = None
                    continue
                if turn is None:
                    turn = await self._myna._open_turn()
                    output_emitter.start_segment(segment_id=turn.turn_id)
                    reader = asyncio.get_running_loop().create_task(_emit(turn, output_emitter))
                    self._mark_started()
                await turn.push_text(item)
            if turn is not None:  # input closed without a flush
                await turn.end_input()
                await self._finish_segment(reader, output_emitter)
                turn = reader = None
        except MynaError as exc:
            raise _api_error(exc) from None
        finally:
            if turn is not None:  # cancelled (barge-in) or failed mid-segment
                if reader is not None:
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
                await turn.cancel()


    async def _finish_segment(self, reader: asyncio.Task, emitter: tts.AudioEmitter) -> None:
        """Wait for the segment's audio to its end, then end the segment (with a little silence
        if the text had nothing to say)."""
        if not await reader:
            emitter.push(bytes(2 * (self._myna.sample_rate * EMPTY_SEGMENT_MS // 1000)))
        emitter.end_segment()


async def _emit(turn: Turn, emitter: tts.AudioEmitter) -> int:
    """Push a turn's PCM and word timings into the emitter until the turn ends; returns the
    number of PCM bytes pushed."""
    pushed = 0
    async for item in turn:
        if isinstance(item, Audio):
            emitter.push(item.pcm)
            pushed += len(item.pcm)
        elif isinstance(item, Notice):
            log.warning("myna: %s: %s", item.code, item.message)
        else:
            emitter.push_timed_transcript(TimedString(item.word + " ", start_time=item.start_s))
    return pushed


def _api_error(exc: MynaError) -> APIError:
    if exc.code in RETRYABLE_CODES:  # (a worker that drains, is full, or stopped answering: try again)
        return APIConnectionError(str(exc))
    if exc.code in ACCESS_STATUS:
        return APIStatusError(str(exc), status_code=ACCESS_STATUS[exc.code], retryable=False,
                              body={"code": exc.code, "message": exc.message})
    return APIError(str(exc), body={"code": exc.code, "message": exc.message}, retryable=False)
