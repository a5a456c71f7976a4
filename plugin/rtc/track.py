"""The outgoing audio track: one 20 ms frame per absolute monotonic deadline.

aiortc's sender never paces: it calls ``recv()`` in a loop and sends whatever it gets (see
``../shared/research/ecosystem.md`` §3.1). So ``recv()`` is the clock. Frame ``n`` is due at
``start + n × 20 ms`` on the monotonic clock (never accumulated sleeps, so no drift); after a
late wake-up at most :data:`MAX_CATCH_UP` frames go out back to back, and beyond that the
schedule is moved forward instead of bursting. ``pts`` rises by exactly 960 per frame for the
life of the track, across turns and idle time, whatever the wall clock does.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from myna.audio.playout import FRAME_SAMPLES, SAMPLE_RATE, Playout

FRAME_SECONDS = FRAME_SAMPLES / SAMPLE_RATE
TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
#: Frames that may be sent back to back after a late wake-up before the schedule slips.
MAX_CATCH_UP = 2


class PacedAudioTrack(MediaStreamTrack):
    """An aiortc audio track fed by a :class:`~myna.audio.playout.Playout`.

    Each ``recv()`` returns an ``av.AudioFrame``: s16, mono, 48 kHz, 960 samples,
    ``time_base`` 1/48000, ``pts`` = 960 × frame index.

    Args:
        playout: the session's playout.
        clock: monotonic clock in seconds.
        sleep: coroutine sleeping a number of seconds (injectable for tests).
    """

    kind = "audio"

    def __init__(
        self,
        playout: Playout,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = asyncio.sleep,
    ):
        super().__init__()
        self.playout = playout
        self._clock = clock
        self._sleep = sleep
        self._start: float | None = None
        self._index = 0  # frame index since the schedule's anchor
        self._pts = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = self._clock()
        if self._start is None:
            self._start = now
        deadline = self._start + self._index * FRAME_SECONDS
        if deadline > now:
            await self._sleep(deadline - now)
        elif now - deadline > MAX_CATCH_UP * FRAME_SECONDS:
            # Too late to catch up without a burst: re-anchor so this frame is due now.
            self._start = now - self._index * FRAME_SECONDS
        self._index += 1
        samples = self.playout.next_frame()
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.time_base = TIME_BASE
        frame.pts = self._pts
        self._pts += FRAME_SAMPLES
        return frame
