"""Opus for one mono voice: the settings we encode with, and an encoder that makes RTP payloads.

aiortc encodes every outgoing audio frame itself (``aiortc.codecs.opus.OpusEncoder``): PyAV's
libopus at 48 kHz **stereo**, 96 kbit/s, ``application=voip``, with no knob; and before each
frame its sender computes the RFC 6464 audio level in a pure-Python loop over the samples. A
track may instead return ``av.Packet`` objects, which aiortc sends as they are (its ``pack``
path: no resampling, no encoding, no executor hop, no audio level). :class:`VoiceOpusEncoder`
makes those packets for :class:`myna.rtc.track.PacedAudioTrack` (``opus=`` argument):

- **mono** (a voice has one channel; the SDP stays ``opus/48000/2``, which RFC 7587 lets a
  sender fill with mono packets; decoders up-mix);
- **32 kbit/s VBR** (``application=voip``): Opus's full-band speech range; measured against 96
  kbit/s stereo in ``myna bench playout`` (bitrate, encode CPU, SNR after decoding);
- **in-band FEC** with an expected loss of 10 %: the packet after a lost one carries a
  low-bitrate copy, which Chromium's NetEq uses; it costs bitrate only when speech is present;
- **no DTX**: the libopus in PyAV's FFmpeg does not expose it, and we do better while idle: after
  :data:`SETTLE_FRAMES` frames of silence the encoder is skipped and a cached 3-byte silent
  packet is sent (1.2 kbit/s), so an idle session costs no encoding at all.

RTP timestamps come from each frame's ``pts`` (1/48000 s), so they stay continuous across idle
time and turns exactly as the track's ``pts`` do.
"""

from __future__ import annotations

import fractions
from dataclasses import dataclass

import av
import numpy as np

from myna.audio.playout import FRAME_SAMPLES, SAMPLE_RATE

#: pts units of every frame and packet: 1/48000 s (a sample).
TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
#: Silent frames still fed to the encoder after audio (its state decays to silence) before the
#: cached silent packet takes over.
SETTLE_FRAMES = 5


def audio_frame(samples: np.ndarray, pts: int) -> av.AudioFrame:
    """One frame as PyAV takes it: int16 mono ``[960]`` samples at 48 kHz, ``pts`` in 1/48000 s."""
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, dtype=np.int16).reshape(1, -1), format="s16",
                                       layout="mono")
    frame.sample_rate = SAMPLE_RATE
    frame.time_base = TIME_BASE
    frame.pts = pts
    return frame


@dataclass(frozen=True)
class OpusSettings:
    """Encoder settings.

    Args:
        bitrate: target bit rate (bit/s).
        fec: in-band forward error correction.
        packet_loss: expected loss (%) the encoder plans FEC for.
        complexity: libopus complexity 0–10 (CPU against quality).
        channels: 1 (mono) or 2.
    """

    bitrate: int = 32_000
    fec: bool = True
    packet_loss: int = 10
    complexity: int = 10
    channels: int = 1

    def codec(self) -> av.CodecContext:
        """An open libopus encoder context with these settings (s16, 48 kHz)."""
        ctx = av.CodecContext.create("libopus", "w")
        ctx.bit_rate = self.bitrate
        ctx.format = "s16"
        ctx.layout = "mono" if self.channels == 1 else "stereo"
        ctx.sample_rate = SAMPLE_RATE
        ctx.time_base = TIME_BASE
        ctx.options = {
            "application": "voip",
            "fec": "1" if self.fec else "0",
            "packet_loss": str(self.packet_loss),
            "compression_level": str(self.complexity),
        }
        ctx.open()
        return ctx


class VoiceOpusEncoder:
    """20 ms int16 mono frames in, one Opus packet (an ``av.Packet`` with ``pts``) out.

    Args:
        settings: encoder settings.
    """

    def __init__(self, settings: OpusSettings | None = None):
        self.settings = settings or OpusSettings()
        self._ctx = self.settings.codec()
        self._silent_run = 0  # consecutive silent frames handed in
        self._silent_payload = _silent_payload(self.settings)
        self._next_pts = 0  # encoder-side pts: libopus's own delay is kept out of the RTP clock

    def skips(self, silent: bool) -> bool:
        """True when :meth:`encode` of the next frame will not run the codec (settled idle):
        cheap enough to call on the event loop; otherwise run it on a worker thread (PyAV
        releases the GIL while libopus encodes)."""
        return silent and self._silent_run >= SETTLE_FRAMES

    def encode(self, samples: np.ndarray, pts: int, silent: bool = False) -> av.Packet:
        """Encode one frame.

        Args:
            samples: int16 ``[960]`` mono.
            pts: the frame's pts in 1/48000 s (becomes the RTP timestamp offset).
            silent: the caller knows the frame is digital silence (the idle fast path).
        """
        self._silent_run = self._silent_run + 1 if silent else 0
        if self._silent_run > SETTLE_FRAMES:
            payload = self._silent_payload
        else:
            frame = audio_frame(samples, self._next_pts)
            self._next_pts += FRAME_SAMPLES
            packets = self._ctx.encode(frame)
            # libopus answers each 20 ms frame with exactly one packet (no look-ahead queue).
            payload = bytes(packets[0]) if packets else self._silent_payload
        packet = av.Packet(payload)
        packet.pts = pts
        packet.time_base = TIME_BASE
        return packet


def _silent_payload(settings: OpusSettings) -> bytes:
    """A 3-byte CELT packet of digital silence. At speech bit rates libopus codes silence in
    SILK mode (20–35 bytes a packet without DTX); at 64 kbit/s it uses CELT, whose silence flag
    makes the whole packet 3 bytes. Opus packets are self-describing, so mixing modes is legal."""
    ctx = OpusSettings(64_000, False, 0, 10, settings.channels).codec()
    zeros = np.zeros(FRAME_SAMPLES, dtype=np.int16)
    payload = b""
    for i in range(2 * SETTLE_FRAMES + 5):
        for p in ctx.encode(audio_frame(zeros, i * FRAME_SAMPLES)):
            payload = bytes(p)
    return payload
