"""The outgoing audio track: one 20 ms frame per absolute monotonic deadline.

aiortc's sender never paces: it calls ``recv()`` in a loop and sends whatever it gets
(``aiortc.rtcrtpsender.RTCRtpSender._run_rtp``). So ``recv()`` is the clock. Frame ``n`` is due at
``start + n × 20 ms`` on the monotonic clock (never accumulated sleeps, so no drift); after a
late wake-up at most :data:`MAX_CATCH_UP` frames go out back to back, and beyond that the
schedule is moved forward instead of bursting. ``pts`` rises by exactly 960 per frame for the
life of the track, across turns and idle time, whatever the wall clock does.

The frame loop never dies: aiortc's sender stops for good at the first exception ``recv()``
raises, so a frame that cannot be built or encoded is replaced by silence and reported to
``on_error`` (the session drops the turns whose audio failed and sends an ``error`` event).

Two output modes:

- ``opus=OpusSettings(...)`` (the default): ``recv()`` returns ready Opus packets
  (``av.Packet``) from a :class:`~myna.audio.opus.VoiceOpusEncoder` (mono, 32 kbit/s, in-band
  FEC); aiortc sends them as they are. Speech is encoded on the default thread pool (as aiortc
  does; PyAV releases the GIL while libopus runs); settled idle time costs no encoding at all
  (a cached silent packet, built on the event loop).
  Measured in ``myna bench playout``: the send path of an idle session costs ~12 µs a frame
  instead of ~440 µs, a speaking one ~25 % less, at a third of the bit rate. The RTP
  audio-level header extension (RFC 6464) is not sent in this mode.
- ``opus=None``: ``recv()`` returns ``av.AudioFrame`` objects and aiortc encodes them (48 kHz
  stereo, 96 kbit/s, audio level computed per frame in Python; ecosystem.md §3.2). Also what
  a connection that negotiated another codec than Opus gets (:meth:`PacedAudioTrack.use_codec`:
  aiortc's G.711 encoder for PCMU/PCMA).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from myna.audio.opus import OpusSettings, VoiceOpusEncoder, audio_frame
from myna.audio.playout import FRAME_SAMPLES, FRAME_SECONDS, IDLE_FRAME, Playout

log = logging.getLogger(__name__)

#: Frames that may be sent back to back after a late wake-up before the schedule slips.
MAX_CATCH_UP = 2


@dataclass(frozen=True)
class TrackStats:
    """A :class:`PacedAudioTrack`'s pacing as of one moment (:meth:`PacedAudioTrack.stats`).

    Attributes:
        frames: frames returned so far.
        deadline: when the last frame was due, before any re-anchoring (clock s).
        lateness: how late the last frame's wake-up was against its deadline (s).
        slips: times the schedule was moved forward after a late wake-up.
        errors: frames replaced by silence because building them failed.
    """

    frames: int
    deadline: float
    lateness: float
    slips: int
    errors: int


class PacedAudioTrack(MediaStreamTrack):
    """An aiortc audio track fed by a :class:`~myna.audio.playout.Playout`.

    Each ``recv()`` returns an ``av.AudioFrame``: s16, mono, 48 kHz, 960 samples,
    ``time_base`` 1/48000, ``pts`` = 960 × frame index; or, with ``opus``, an ``av.Packet``
    holding that frame encoded, with the same ``pts`` and ``time_base``.

    Args:
        playout: the session's playout.
        clock: monotonic clock in seconds.
        sleep: coroutine sleeping a number of seconds (injectable for tests).
        opus: encode here with these settings; None leaves encoding to aiortc.
        on_error: called with the exception when a frame could not be built (the frame goes
            out as silence instead).
        on_frame: called with each frame's lateness against its deadline (s), for benchmarks.

    Its pacing is read-only: :attr:`deadline`, :attr:`lateness`, :attr:`slips`, :attr:`errors`,
    or all at once with :meth:`stats` (like aiortc's ``getStats()``).
    """

    kind = "audio"

    def __init__(
        self,
        playout: Playout,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = asyncio.sleep,
        opus: OpusSettings | None = OpusSettings(),
        on_error: Callable[[BaseException], None] | None = None,
        on_frame: Callable[[float], None] | None = None,
    ):
        super().__init__()
        self.playout = playout
        self._clock = clock
        self._sleep = sleep
        self._encoder = VoiceOpusEncoder(opus) if opus is not None else None
        self._start: float | None = None
        self._index = 0  # frame index since the schedule's anchor
        self._pts = 0
        self._deadline = 0.0
        self._lateness = 0.0
        self._slips = 0
        self._errors = 0
        self._on_error = on_error
        self.on_frame = on_frame

    def use_codec(self, mime_type: str) -> None:
        """Send what the connection negotiated (``mime_type``, e.g. ``"audio/opus"``,
        ``"audio/PCMU"``): Opus packets are made here; for any other codec the track returns
        frames and aiortc's encoder for that codec encodes them (G.711 at 8 kHz), never Opus
        packets under another codec's payload type."""
        if mime_type.lower() != "audio/opus":
            self._encoder = None

    @property
    def deadline(self) -> float:
        """When the frame just returned was due, before any re-anchoring (clock s)."""
        return self._deadline

    @property
    def lateness(self) -> float:
        """How late the last frame's wake-up was against its deadline (s)."""
        return self._lateness

    @property
    def slips(self) -> int:
        """Times the schedule was moved forward after a late wake-up."""
        return self._slips

    @property
    def errors(self) -> int:
        """Frames replaced by silence because building them failed."""
        return self._errors

    def stats(self) -> TrackStats:
        """The pacing figures now, as one snapshot (compare two to measure an interval)."""
        return TrackStats(self._pts // FRAME_SAMPLES, self._deadline, self._lateness, self._slips, self._errors)

    async def recv(self) -> av.AudioFrame | av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        now = self._clock()
        if self._start is None:
            self._start = now
        deadline = self._start + self._index * FRAME_SECONDS
        self._deadline = deadline
        if deadline > now:
            await self._sleep(deadline - now)
            now = self._clock()
        self._lateness = now - deadline
        if now - deadline > MAX_CATCH_UP * FRAME_SECONDS:
            # Too late to catch up without a burst: re-anchor so this frame is due now.
            self._start = now - self._index * FRAME_SECONDS
            self._slips += 1
        self._index += 1
        if self.on_frame is not None:
            self.on_frame(self._lateness)
        pts = self._pts
        self._pts += FRAME_SAMPLES
        try:
            return await self._build(pts, due=deadline)
        except Exception as exc:  # a frame is lost, never the sender
            self._errors += 1
            log.exception("audio frame %d failed; sending silence", pts // FRAME_SAMPLES)
            if self._on_error is not None:
                try:
                    self._on_error(exc)
                except Exception:
                    log.exception("reporting a failed frame failed")
            return await self._build(pts, IDLE_FRAME)

    async def _build(self, pts: int, samples=None, due: float | None = None) -> av.AudioFrame | av.Packet:
        """Frame ``pts`` from the playout (or the given int16 ``samples``), encoded when set to;
        ``due`` is the frame's deadline (clock s), which the playout times pre-roll against."""
        if samples is None:
            samples = self.playout.next_frame(due=due)
        if self._encoder is not None:
            silent = samples is IDLE_FRAME
            if self._encoder.skips(silent):
                return self._encoder.encode(samples, pts, silent)
            # Encoding takes ~0.5 ms; like aiortc, keep it off the event loop (other cores).
            return await asyncio.get_running_loop().run_in_executor(None, self._encoder.encode, samples, pts, silent)
        return audio_frame(samples, pts)
