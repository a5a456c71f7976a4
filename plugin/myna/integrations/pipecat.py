"""Myna as Pipecat's TTS stage: :class:`MynaTTSService` (``pip install 'myna[pipecat]'``).

Usage::

    from myna.integrations.pipecat import MynaTTSService

    tts = MynaTTSService()                                 # in-process, embedded Piper voice
    tts = MynaTTSService(url="http://gpu-box:8080")        # a running Myna worker
    tts = MynaTTSService(url="https://gpu-box", token=jwt)  # ... that has keys (or MYNA_TOKEN)
    pipeline = Pipeline([..., llm, tts, transport.output(), ...])

How it meets Pipecat's ``TTSService`` contract (pipecat-ai 1.x, ``services/tts_service.py``):

- **Streaming text.** ``text_aggregation_mode=TOKEN`` by default: every LLM token reaches
  :meth:`run_tts` at once, with the turn's ``context_id`` (one per LLM reply,
  ``reuse_context_id_within_turn``). The first token opens a Myna turn; later tokens are pushed
  into it; :meth:`flush_audio` (end of the LLM reply) ends its input. Myna segments words and
  clauses itself, so tokens may split words anywhere.
- **Audio as it arrives.** ``run_tts`` yields ``None`` (the WebSocket style of the base class);
  one receive task per context appends ``TTSAudioRawFrame`` s (s16 mono at
  :attr:`sample_rate`) and word timestamps (seconds from the context's first audio) to the
  context's audio queue, then ``TTSStoppedFrame`` and closes the context. The base class
  pushes ``TTSStartedFrame`` (``push_start_frame=True``) and emits words as ``TTSTextFrame`` s
  (``push_text_frames=False``).
- **TTFB.** The base starts TTFB when the context opens (just before the first ``run_tts``) and
  stops it at the context's first audio frame; :meth:`can_generate_metrics` is True, so with
  ``PipelineParams(enable_metrics=True)`` a ``MetricsFrame`` with ``TTFBMetricsData`` goes out.
- **Barge-in.** On ``InterruptionFrame`` the base calls :meth:`on_audio_context_interrupted`
  for every open *interruptible* context, also one that has produced no audio yet: that
  context's Myna turn is cancelled with ``cancel {turn_id}`` (that turn only) and its receive
  task stopped, so no audio of the old context is appended afterwards; anything late is dropped
  because the context is gone. Each audio context is its own Myna turn (on its own session), so
  several are synthesised at once, and a context Pipecat keeps through the interruption (an
  uninterruptible one: ``TTSSpeakFrame(..., interruptible=False)``) plays on to its end. A turn
  whose context had already gone quiet (the base closes a context after ``stop_frame_timeout_s``
  without audio) is cancelled too.
- **Replies with nothing to say.** The base opens an audio context (``TTSStartedFrame``) for
  any text that is not whitespace, and counts a context that completes without audio as a
  failure (three in a row make the service unusable). ``"👍"``, ``"..."`` or ``"**"`` are not
  failures, so a text transform (the last in ``text_transforms``) holds a reply's text until
  it has a word the voice would speak (:func:`myna.text.intake.speech_in`: markup, emoji and
  scripts the voice cannot read are not words). A reply that never has one opens no context:
  nothing is spoken, nothing is reported but the left-out script, if any, and the next reply
  is spoken as usual.
- **A refused token** (a remote worker with keys; no token, a bad or expired one, or one that
  may not use the engine) is pushed upstream as one ``ErrorFrame`` whose message names the fix,
  category ``AUTHENTICATION`` (401) or ``AUTHORIZATION`` (403). Those are permanent: Pipecat
  stops giving the service work, and the pipeline worker's ``ProcessorUnusablePolicy`` decides
  the rest (by default the pipeline keeps running).
- **Problems a turn survives** (``unsupported_language``) are reported with ``push_error``
  (category ``APPLICATION``: the text, not the service, is at fault); the rest is spoken.
- **The end of a reply** ends the Myna turn's input, also when its context went quiet before
  (so its last words are spoken and the turn finishes).
- **Pauses inside a reply.** Myna speaks a finished sentence at once, but Pipecat's TOKEN-mode
  sentence aggregator confirms it (and so its transcript frames) only at the next token. The
  base closes an audio context that has had no audio for ``stop_frame_timeout_s`` and drops
  words not yet confirmed; Myna ends its contexts itself, so the default here is
  :data:`STOP_FRAME_TIMEOUT_S`, and an LLM that pauses mid-reply loses no transcript.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from loguru import logger
from pipecat.frames.frames import (
    CancelFrame, EndFrame, Frame, InterruptionFrame, StartFrame, TTSAudioRawFrame, TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import NOT_GIVEN, NotGiven, TTSSettings, is_given
from pipecat.services.tts_service import TextAggregationMode, TTSService
from pipecat.utils.errors import ErrorCategory

from myna.access import ACCESS_STATUS, Credentials
from myna.engines import Engine
from myna.engines.base import check_speed
from myna.integrations.backend import Audio, Backend, MynaError, Notice, Turn, create_backend
from myna.text.intake import speech_in


#: How long an audio context may go without audio before the base closes it (s). Myna ends every
#: context itself when its turn is done, so this is only a safety net; Pipecat's default (3 s)
#: would close a reply's context during an LLM pause, and with it the words of a sentence that
#: Pipecat's own sentence aggregator has not yet confirmed (it waits for the next token).
STOP_FRAME_TIMEOUT_S = 30.0

#: Pipecat's category for the HTTP status of a refused token.
_ACCESS_CATEGORIES = {401: ErrorCategory.AUTHENTICATION, 403: ErrorCategory.AUTHORIZATION}


@dataclass
class MynaTTSSettings(TTSSettings):
    """The settings of :class:`MynaTTSService` that a ``TTSUpdateSettingsFrame`` may change:
    Pipecat's ``model``, ``voice``, ``language``, and ``speed`` (0.5 to 2.0 × the voice's pace;
    None: the voice's own)."""

    speed: float | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)


class MynaTTSService(TTSService):
    """Pipecat TTS service backed by Myna, in-process or remote.

    Args:
        engine: a started in-process engine (shared, not closed by the service). None with
            no ``url``: the service loads the embedded Piper voice at start (~3 s) and owns it.
        url: a running Myna worker (``http://host:port``); uses ``GET /v1/tts/stream``.
        engine_name: the worker's engine (remote only; None: its default).
        voice: voice name (None: the engine's default).
        speed: pace, 0.5 to 2.0 × the voice's own (None: 1.0).
        sample_rate: output rate in Hz (None: the pipeline's ``audio_out_sample_rate``).
        token: access token for a worker with keys (remote only; None: ``MYNA_TOKEN``).
        api_key, api_secret: the worker's key pair, to mint a token per connection instead
            (None: ``MYNA_API_KEY``/``MYNA_API_SECRET``); see :class:`myna.access.Credentials`.
        text_aggregation_mode: TOKEN (default, lowest latency) or SENTENCE.
        **kwargs: passed to ``TTSService``.

    ``TTSUpdateSettingsFrame(delta=MynaTTSService.Settings(voice=..., speed=...))`` (or the
    legacy ``settings={"voice": ..., "speed": ...}``) changes them mid-session: the next reply
    (audio context) is spoken with them, the one in progress keeps its own; nothing reconnects.
    A bad value (a speed outside 0.5 to 2.0, a voice the in-process engine lacks) is one
    ``ErrorFrame`` naming it, and the setting keeps its value; a voice a remote worker lacks is
    an ``ErrorFrame`` (``unknown_voice``) for the reply that asked for it, and the pipeline goes
    on. ``language`` (a tag, or Pipecat's ``Language``) goes with each turn and is checked
    against the voice's (``wrong_language``: an ``ErrorFrame``, the setting keeps its value);
    it does not change how the voice reads.
    """

    Settings = MynaTTSSettings
    _settings: MynaTTSSettings

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
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
        **kwargs,
    ):
        if engine is not None and url is not None:
            raise ValueError("pass either engine (in-process) or url (remote), not both")
        model = url is not None and (engine_name or "default") or (engine.name if engine else "piper")
        if speed is not None:
            speed = check_speed(speed)  # (raises bad_speed now, not at start)
        transforms = [*(kwargs.pop("text_transforms", None) or []), ("*", self._hold_until_speech)]
        kwargs.setdefault("stop_frame_timeout_s", STOP_FRAME_TIMEOUT_S)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_start_frame=True,
            push_stop_frames=True,
            push_text_frames=False,
            sample_rate=sample_rate,
            settings=MynaTTSSettings(model=model, voice=voice, language=None, speed=speed),
            text_transforms=transforms,
            **kwargs,
        )
        self._engine = engine
        self._url = url
        self._engine_name = engine_name
        self._voice = voice
        self._credentials = Credentials(token, api_key=api_key, api_secret=api_secret) if url is not None else None
        self._backend: Backend | None = None
        self._turns: dict[str, Turn] = {}
        self._receivers: dict[str, asyncio.Task] = {}
        self._replies: list[str] = []  # contexts whose text is still being written, innermost last
        self._held = ""  # the open reply's text so far, while it has nothing to speak
        self._speaking = False  # the open reply's text has reached Myna

    def _classify_error(self, exception: Exception) -> ErrorCategory | None:
        """A refused token is ``AUTHENTICATION`` (401) or ``AUTHORIZATION`` (403): permanent, so
        Pipecat stops giving the service work and its worker's policy decides what follows."""
        if not isinstance(exception, MynaError):
            return None
        return _ACCESS_CATEGORIES.get(ACCESS_STATUS.get(exception.code))

    def can_generate_metrics(self) -> bool:
        """True: TTFB (and TTFA) metrics are produced when the pipeline enables metrics."""
        return True

    @property
    def supports_processing_metrics(self) -> bool:
        """False: audio arrives on a receive task, so time spent in ``run_tts`` means nothing."""
        return False

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, frame: StartFrame):
        """Open the backend at the pipeline's output rate (loads the voice if in-process)."""
        await super().start(frame)
        if self._backend is None:
            self._backend = create_backend(
                engine=self._engine, url=self._url, engine_name=self._engine_name,
                voice=self._settings.voice or None, sample_rate=self.sample_rate, credentials=self._credentials,
            )
            try:
                self._backend.update_options(speed=self._settings.speed)
                await self._backend.start()
                if self._settings.language:
                    self._backend.update_options(language=getattr(self._settings.language, "value",
                                                                  self._settings.language))
            except MynaError as exc:  # an ErrorFrame, not a stack trace; the pipeline starts
                await self.push_error(error_msg=f"Myna TTS: {exc}", exception=exc)

    async def _update_settings(self, delta: TTSSettings) -> dict:
        """A ``TTSUpdateSettingsFrame``: check ``voice`` and ``speed``, apply them to the replies
        that start from now on (see the class docstring); a bad one is an ``ErrorFrame`` and is
        not applied (the other fields of the delta are)."""
        for name in ("voice", "speed", "language"):
            value = getattr(delta, name, NOT_GIVEN)
            if not is_given(value) or value is None:
                continue
            value = getattr(value, "value", value)  # (a pipecat Language is an enum of tags: "en-US")
            try:
                if self._backend is not None:
                    self._backend.update_options(**{name: value})
                elif name == "speed":  # (before start: voice and language are checked when the backend opens)
                    check_speed(value)
            except MynaError as exc:
                setattr(delta, name, NOT_GIVEN)
                await self.push_error(error_msg=f"Myna TTS: {name} not changed: {exc}", exception=exc)
        return await super()._update_settings(delta)

    async def stop(self, frame: EndFrame):
        await super().stop(frame)
        await self._close()

    async def cancel(self, frame: CancelFrame):
        await super().cancel(frame)
        await self._close()

    async def _close(self) -> None:
        for context_id in list(self._turns):
            await self._drop(context_id)
        if self._backend is not None:
            await self._backend.aclose()
            self._backend = None

    # -- TTSService hooks -----------------------------------------------------------------
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Push ``text`` (a token or a sentence) into the context's Myna turn.

        Audio does not come back here: the context's receive task appends it.
        """
        try:
            turn = self._turns.get(context_id)
            if turn is None:
                turn = await self._backend.open_turn()
                self._turns[context_id] = turn
                self._receivers[context_id] = self.create_task(self._receive(context_id, turn), f"myna-{context_id}")
            await turn.push_text(text)
            await self.start_tts_usage_metrics(text)
        except (MynaError, RuntimeError) as exc:
            await self.push_error(error_msg=f"Myna TTS: {exc}", exception=exc)
        yield None

    async def _hold_until_speech(self, text: str, text_type: str) -> str:
        """Text transform: pass a reply's text on only from its first speakable word (an empty
        result opens no audio context), then everything as it comes."""
        if self._speaking:
            return text
        self._held += text
        if not speech_in(self._held, self._backend.scripts)[0]:
            return ""
        text, self._held, self._speaking = self._held, "", True
        return text

    async def on_turn_context_created(self, context_id: str):
        """A reply (or a speak frame) starts: its text is held until it has speech."""
        await super().on_turn_context_created(context_id)
        self._replies.append(context_id)
        self._held, self._speaking = "", False

    async def on_turn_context_completed(self):
        """A reply's text is complete: end its turn's input (also if its context went quiet)."""
        context_id = self._replies.pop() if self._replies else None
        held, self._held, self._speaking = self._held, "", False
        if held and self._backend is not None:  # the reply never had speech: only what was left out to report
            first_by_script: dict[str, str] = {}
            for skipped in speech_in(held, self._backend.scripts)[1]:
                first_by_script.setdefault(skipped.script, skipped.word)
            for script, word in first_by_script.items():
                await self._notice(Notice("unsupported_language",
                                          f"the voice does not read {script} script; left out: {word!r}"))
        if context_id in self._turns:
            await self.flush_audio(context_id)
        elif context_id is not None:
            # No turn was opened (the service is no longer usable, or opening one failed): nothing
            # else ends the context, and Pipecat would hold the pipeline's end 20-30 s for it.
            await self._close_context(context_id)
        await super().on_turn_context_completed()

    async def flush_audio(self, context_id: str | None = None):
        """End of the LLM reply: end the turn's input so its last words are spoken."""
        turn = self._turns.get(context_id or self.get_active_audio_context_id() or "")
        if turn is not None:
            try:
                await turn.end_input()
            except MynaError as exc:
                await self.push_error(error_msg=f"Myna TTS: {exc}", exception=exc)

    async def on_audio_context_interrupted(self, context_id: str):
        """Barge-in: cancel the context's turn and stop its receive task before it appends more."""
        await self.cancel_ttfb_metrics()
        await self._drop(context_id)
        await super().on_audio_context_interrupted(context_id)

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """After an interruption, also drop turns whose context had gone quiet (no hook for them)."""
        await super().process_frame(frame, direction)
        if isinstance(frame, InterruptionFrame):
            self._replies = [c for c in self._replies if self.audio_context_available(c)]
            self._held, self._speaking = "", False
            for context_id in [c for c in self._turns if not self.audio_context_available(c)]:
                await self._drop(context_id)

    async def _notice(self, notice: Notice) -> None:
        logger.warning(f"{self}: {notice.code}: {notice.message}")
        await self.push_error(error_msg=f"Myna TTS: {notice.code}: {notice.message}", category=ErrorCategory.APPLICATION)

    async def _drop(self, context_id: str) -> None:
        turn = self._turns.pop(context_id, None)
        task = self._receivers.pop(context_id, None)
        if task is not None and task is not asyncio.current_task():
            await self.cancel_task(task)
        if turn is not None:
            await turn.cancel()

    async def _receive(self, context_id: str, turn: Turn) -> None:
        """Append the turn's audio and words to its audio context, then close the context."""
        try:
            async for item in turn:
                if isinstance(item, Notice):
                    await self._notice(item)
                    continue
                if not self.audio_context_available(context_id) and context_id not in self._replies:
                    continue  # the context is gone (interrupted, or timed out after its reply): drop it
                # (A context that timed out mid-reply is recreated by append_to_audio_context.)
                if isinstance(item, Audio):
                    frame = TTSAudioRawFrame(item.pcm, self.sample_rate, 1, context_id=context_id)
                    await self.append_to_audio_context(context_id, frame)
                else:
                    await self.add_word_timestamps([(item.word, item.start_s)], context_id)
        except MynaError as exc:
            logger.warning(f"{self}: turn for context {context_id} failed: {exc}")
            await self.push_error(error_msg=f"Myna TTS: {exc}", exception=exc)
        finally:
            self._turns.pop(context_id, None)
            self._receivers.pop(context_id, None)
        await self._close_context(context_id)

    async def _close_context(self, context_id: str) -> None:
        """End an audio context that is still open: its stop frame, then its removal."""
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)
