"""Encoded audio out: s16 mono PCM → a streamed file or a raw codec stream, by PyAV (FFmpeg).

One job: turn the s16le mono PCM an :class:`~myna.audio.unpaced.UnpacedOutput` hands out into
the bytes of one :class:`AudioFormat`, piece by piece as it comes, so that a door can send each
piece on at once (the speech endpoint's chunked response, the WebSocket's binary messages).
Nothing is encoded by hand: every format is an FFmpeg muxer and encoder, through PyAV.

The formats (:data:`FORMATS`), each at a fixed rate the output resamples to:

======================  ============================  ==========  =========================
name                    FFmpeg muxer / encoder         rate (Hz)   notes
======================  ============================  ==========  =========================
``pcm``                 ``s16le`` / ``pcm_s16le``      24000       OpenAI's ``pcm``: raw, no header
``wav``                 ``wav`` / ``pcm_s16le``        24000       streamed: RIFF and data sizes 0xFFFFFFFF
``mp3``                 ``mp3`` / ``libmp3lame``       24000
``aac``                 ``adts`` / ``aac``             24000       ADTS frames (no MP4 box to seek back to)
``opus``                ``ogg`` / ``libopus``          24000       Ogg Opus, a page every 20 ms
``flac``                ``flac`` / ``flac``            24000
``pcm_mulaw``           ``mulaw`` / ``pcm_mulaw``      8000        G.711 µ-law, raw, one byte a sample
``pcm_alaw``            ``alaw`` / ``pcm_alaw``        8000        G.711 A-law, raw, one byte a sample
======================  ============================  ==========  =========================

A format whose encoder this PyAV build lacks is left out of :func:`available_formats`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import numpy as np

#: G.711's rate (Hz): µ-law and A-law are defined at 8 kHz.
G711_RATE = 8000
#: OpenAI's rate for every speech format (Hz).
OPENAI_RATE = 24000


@dataclass(frozen=True)
class AudioFormat:
    """One way of sending audio.

    Attributes:
        name: the name clients use (``response_format``, the WebSocket's ``config.format``).
        container: the FFmpeg muxer.
        codec: the FFmpeg encoder.
        rate: the rate the audio is encoded at (Hz; the output resamples to it).
        content_type: the HTTP ``Content-Type`` of a response in this format.
        options: muxer options (e.g. Ogg's page duration, in µs).
    """

    name: str
    container: str
    codec: str
    rate: int
    content_type: str
    options: dict[str, str] = field(default_factory=dict)


FORMATS: dict[str, AudioFormat] = {f.name: f for f in (
    AudioFormat("pcm", "s16le", "pcm_s16le", OPENAI_RATE, "audio/pcm"),
    AudioFormat("wav", "wav", "pcm_s16le", OPENAI_RATE, "audio/wav"),
    AudioFormat("mp3", "mp3", "libmp3lame", OPENAI_RATE, "audio/mpeg"),
    AudioFormat("aac", "adts", "aac", OPENAI_RATE, "audio/aac"),
    AudioFormat("opus", "ogg", "libopus", OPENAI_RATE, "audio/ogg", {"page_duration": "20000"}),
    AudioFormat("flac", "flac", "flac", OPENAI_RATE, "audio/flac"),
    AudioFormat("pcm_mulaw", "mulaw", "pcm_mulaw", G711_RATE, "audio/basic"),
    AudioFormat("pcm_alaw", "alaw", "pcm_alaw", G711_RATE, "audio/x-alaw-basic"),
)}

#: The G.711 formats (raw, 8 kHz), offered on the WebSocket as well.
G711_FORMATS = ("pcm_mulaw", "pcm_alaw")


@cache
def available_formats() -> tuple[str, ...]:
    """The names of :data:`FORMATS` whose muxer and encoder this PyAV build has, in table order."""
    import av

    names = []
    for fmt in FORMATS.values():
        try:
            av.codec.Codec(fmt.codec, "w")
            av.format.ContainerFormat(fmt.container, "w")
        except Exception:  # (PyAV raises its own error types, by version)
            continue
        names.append(fmt.name)
    return tuple(names)


class _Collector:
    """The file object PyAV writes into: it keeps what was written until :meth:`take`."""

    def __init__(self):
        self._buf = bytearray()

    def write(self, data) -> int:
        self._buf += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


class StreamEncoder:
    """One stream of one :class:`AudioFormat`: s16le mono PCM at ``fmt.rate`` in, encoded bytes
    out as soon as FFmpeg has them (the output is not seekable, so every muxer streams: a WAV
    header says its sizes are unknown).

    The encoder opens at the first :meth:`encode` (so the first bytes, the container's header
    included, come with the first audio). An encoder with a frame size (MP3, AAC, Opus) holds
    back less than one frame until :meth:`finish`.

    Args:
        fmt: the format.

    Raises:
        ValueError: this PyAV build cannot encode ``fmt``.
    """

    def __init__(self, fmt: AudioFormat):
        if fmt.name not in available_formats():
            raise ValueError(f"this build of FFmpeg cannot encode {fmt.name} ({fmt.codec} in {fmt.container})")
        self.fmt = fmt
        self._out = _Collector()
        self._container = None
        self._stream = None
        self._pts = 0
        self._finished = False

    def _open(self) -> None:
        import av

        self._container = av.open(self._out, "w", format=self.fmt.container, options=dict(self.fmt.options))
        self._stream = self._container.add_stream(self.fmt.codec, rate=self.fmt.rate, layout="mono")

    def encode(self, pcm: bytes) -> bytes:
        """Encode s16le mono PCM at ``fmt.rate`` (an even number of bytes); returns the bytes
        the muxer wrote (possibly none yet).

        Raises:
            ValueError: an odd number of bytes, or the stream has finished.
        """
        import av

        if self._finished:
            raise ValueError("the stream has finished")
        if len(pcm) % 2:
            raise ValueError("s16 PCM has an even number of bytes")
        if not pcm:
            return b""
        if self._container is None:
            self._open()
        samples = np.frombuffer(pcm, dtype="<i2").reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self.fmt.rate
        frame.pts = self._pts
        self._pts += samples.shape[1]
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._out.take()

    def finish(self) -> bytes:
        """Flush the encoder and close the container; returns the last bytes (empty when
        nothing was ever encoded). Idempotent."""
        if self._finished:
            return b""
        self._finished = True
        if self._container is None:
            return b""
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return self._out.take()

    def close(self) -> None:
        """Drop the stream without finishing it (the client went away)."""
        self._finished = True
        if self._container is not None:
            try:
                self._container.close()
            except Exception:  # closing a half-written stream is best effort
                pass


class EncodingSink:
    """An :class:`~myna.audio.unpaced.AudioSink` that encodes each piece of PCM into ``fmt``
    before handing it to ``sink`` (for a raw codec such as G.711, whose pieces stand alone:
    one encoder serves every turn of the connection).

    Args:
        sink: where the encoded bytes go (``put_audio``/``drop_audio``).
        fmt: a format with no container header (``pcm_mulaw``, ``pcm_alaw``).
    """

    def __init__(self, sink, fmt: AudioFormat):
        self._sink = sink
        self._encoder = StreamEncoder(fmt)

    def put_audio(self, turn_id: str, pcm: bytes) -> None:
        data = self._encoder.encode(pcm)
        if data:
            self._sink.put_audio(turn_id, data)

    def drop_audio(self, turn_id: str | None = None) -> None:
        self._sink.drop_audio(turn_id)
