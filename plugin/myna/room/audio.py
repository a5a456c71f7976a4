"""The room's audio: the session's playout feeding an ``rtc.AudioSource`` in 20 ms frames.

In a LiveKit room the SDK (its Rust core) encodes Opus and paces the track natively: a 10 ms
task takes 10 ms from the source's buffer and sends silence when the buffer is empty.
``capture_frame`` returns at once while the buffer holds at most ``queue_size_ms`` and waits
otherwise, so awaiting it paces the producer on the sender's own clock (measured against the
``livekit`` SDK this project pins).

:class:`SourceOutput` is the session's :class:`~myna.session.TurnOutput`: the same
:class:`~myna.audio.playout.Playout` as the WebRTC path (pre-roll, underruns, barge-in fade,
events when a frame is handed out), drained by one task (:meth:`SourceOutput._pace`):

- **Speaking.** Each 20 ms frame goes to ``capture_frame`` and the next is taken when it
  returns. With :data:`QUEUE_MS` = 20 the source holds 20–40 ms ahead of what is being sent,
  which is all the slack the event loop gets, and all the lag an event has on its audio.
- **Nothing to say.** While the source's buffer is empty, silent frames (a turn's pre-roll) are
  not queued: queued silence would sit in front of the first syllable. The task waits for the
  next 20 ms deadline instead, and when nothing at all is queued it sleeps until a turn begins.
  The source sends silence by itself meanwhile, so the track stays continuous.
- **A line not up.** While ``line`` is clear (a phone caller whose call is not answered yet,
  :class:`~myna.room.agent.RoomAgent`), the task takes no frame: the turn's audio waits in the
  playout, and its first frame goes out when the line opens.
- **Barge-in.** :meth:`interrupt` drops the playout's turns at once (keeping its 5 ms fade);
  what the source already holds (at most 40 ms) plays out, then the fade. The cut is click-free
  and the interrupted turn is silent at most ~45 ms after :meth:`interrupt`. Clearing the
  source's buffer would cut mid-waveform (a click) to save those 40 ms. The frame being
  captured is never cancelled (a cancelled capture breaks the next one, §2.3).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from livekit import rtc

from myna.audio.playout import FADE_SAMPLES, FRAME_SAMPLES, FRAME_SECONDS, IDLE_FRAME, MAX_HOLD_S, SAMPLE_RATE, Playout
from myna.events import Event

log = logging.getLogger(__name__)

#: The source's queue (ms; must be a multiple of 10, or the SDK aborts the process).
QUEUE_MS = 20


def new_source() -> rtc.AudioSource:
    """A 48 kHz mono ``rtc.AudioSource`` with Myna's small queue (:data:`QUEUE_MS`)."""
    return rtc.AudioSource(SAMPLE_RATE, 1, queue_size_ms=QUEUE_MS)


class SourceOutput(Playout):
    """A :class:`~myna.audio.playout.Playout` whose frames go to an ``rtc.AudioSource``.

    Args:
        on_event: the session's event sink.
        source: 48 kHz mono source of the published track (see :func:`new_source`).
        clock: monotonic clock in seconds.
        chunks_end_at_words: the engine's chunks end at word boundaries (see
            :class:`~myna.audio.playout.Playout`): a late chunk is a gap, not an underrun.
        max_hold_s: the start rule's budget (s).
        line: frames go out only while it is set (None: always).
    """

    def __init__(self, on_event: Callable[[Event], None], source: rtc.AudioSource,
                 clock: Callable[[], float] = time.monotonic, chunks_end_at_words: bool = False,
                 max_hold_s: float = MAX_HOLD_S, line: asyncio.Event | None = None):
        super().__init__(on_event, clock=clock, chunks_end_at_words=chunks_end_at_words, max_hold_s=max_hold_s)
        self.source = source
        self.line = line
        self._wake = asyncio.Event()
        self.frames_sent = 0  # frames handed to the source
        #: For each barge-in: ms of the interrupted turn still to be sent by the source (what
        #: it held, plus the fade), i.e. how long after :meth:`interrupt` the turn stays audible.
        self.interrupt_tails_ms: list[float] = []
        #: Times the source ran dry between two frames of audio (it filled the gap with silence:
        #: the event loop was too late for the 20–40 ms the source holds).
        self.source_gaps = 0
        self._task = asyncio.get_running_loop().create_task(self._pace(), name="myna-room-pacer")

    @classmethod
    def for_session(cls, session, source: rtc.AudioSource, line: asyncio.Event | None = None) -> "SourceOutput":
        """The output of a :class:`~myna.session.Session` whose frames go to ``source`` while ``line`` is set."""
        return cls(session.on_output_event, source, clock=session.clock,
                   chunks_end_at_words=session.engine.chunks_end_at_words, max_hold_s=session.max_hold_s, line=line)

    # -- Playout, and the pacer's wake-ups --------------------------------------------------
    def begin_turn(self, turn_id: str, text_at: float, held: bool = False) -> None:
        super().begin_turn(turn_id, text_at, held)
        self._wake.set()

    def commit(self, turn_id: str) -> None:
        super().commit(turn_id)
        self._wake.set()

    def resume(self) -> bool:
        resumed = super().resume()
        self._wake.set()
        return resumed

    def interrupt(self) -> list[Event]:
        dropped = super().interrupt()
        if dropped and dropped[0].audio_ms > 0:  # the playing turn had been heard: it ends after what is queued
            self.interrupt_tails_ms.append(round(1000.0 * (self.source.queued_duration + FADE_SAMPLES / SAMPLE_RATE), 1))
        self._wake.set()  # the fade-out tail still goes out
        return dropped

    # -- the pacer --------------------------------------------------------------------------
    async def _pace(self) -> None:
        deadline = None  # next 20 ms slot while holding silence back (clock s)
        failures = 0  # captures failed in a row
        flowing = False  # the previous frame went to the source and nothing was held back since
        while True:
            if self.line is not None and not self.line.is_set():
                await self.line.wait()
                deadline = None
            frame = self.next_frame()
            if frame is IDLE_FRAME:  # nothing queued: sleep until a turn begins
                flowing = False
                self._wake.clear()
                await self._wake.wait()
                deadline = None
                continue
            if self.source.queued_duration <= 0.0 and not frame.any():
                # Pre-roll (or a starved turn) with nothing buffered: hold the silence back.
                flowing = False
                now = self._clock()
                deadline = now + FRAME_SECONDS if deadline is None or deadline < now - FRAME_SECONDS else deadline + FRAME_SECONDS
                await asyncio.sleep(max(0.0, deadline - now))
                continue
            deadline = None
            if flowing and self.source.queued_duration <= 0.0:
                self.source_gaps += 1
            try:
                await self.source.capture_frame(rtc.AudioFrame(frame.tobytes(), SAMPLE_RATE, 1, FRAME_SAMPLES))
            except Exception as exc:  # the SDK refused this frame: lose 20 ms, keep the track going
                if not failures:
                    log.warning("room audio: a frame could not be captured: %s", exc)
                failures += 1
                await asyncio.sleep(FRAME_SECONDS)
                continue
            if failures:
                log.warning("room audio: %d frame(s) lost", failures)
                failures = 0
            flowing = True
            self.frames_sent += 1

    async def aclose(self) -> None:
        """Stop the pacer and release the source (idempotent)."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.source.aclose()
