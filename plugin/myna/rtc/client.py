"""A Python WebRTC client of a Myna worker (``myna say --server``, tests, benchmarks).

It connects the way a browser does (``POST /api/offer``, a ``"myna"`` data channel, one
receive-only audio transceiver, no STUN), streams a turn's text as token-sized chunks at a
chosen rate, records the decoded audio with arrival times, and measures TTFA on the received
samples by the audible-onset rule (myna.audio.onset), two ways:

- **arrival TTFA**: first chunk sent → the arrival of the RTP packet that carries the first
  audible sample (plus the onset's place in it): the packet decoded as it arrives, with no
  receive jitter buffer (the convention of Coval's TTS benchmarks, and how `myna bench ttfa`
  measures every system);
- **perceived TTFA**: the same onset when aiortc's receiver hands the decoded frame out, after
  its jitter buffer has held 4 packets (~80 ms on a quiet loopback; what the benchmarks
  reported before arrival TTFA).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlparse

import aiohttp
import numpy as np
from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from myna.access import AccessRefused, Credentials
from myna.audio.onset import first_audible_sample
from myna.audio.playout import SAMPLE_RATE
from myna.rtc.ice import enable_loopback_candidates, is_loopback_host, rtc_configuration


def token_chunks(text: str, piece: int = 4) -> list[str]:
    """Split text the way an LLM streams it: words with their leading space, long words in pieces.

    >>> token_chunks("Hello wonderful world")
    ['Hello', ' wond', 'erfu', 'l', ' world']
    """
    chunks = []
    for word in re.findall(r"\s*\S+", text):
        head, rest = word[: len(word) - len(word.lstrip())], word.lstrip()
        if len(rest) <= piece + 2:
            chunks.append(word)
            continue
        pieces = [rest[i : i + piece] for i in range(0, len(rest), piece)]
        chunks.append(head + pieces[0])
        chunks.extend(pieces[1:])
    return chunks


async def wait_until_ready(url: str, timeout: float = 60.0, *, starting: bool = True) -> None:
    """Wait until ``GET {url}/healthz`` answers 200 (the worker's engines are warm).

    Only a worker that is still loading its engines (HTTP 503) is worth waiting for: any other
    answer fails at once, and so does a URL that is not http(s).

    Args:
        url: the worker's base URL, e.g. ``http://127.0.0.1:8080``.
        timeout: seconds to wait for a loading worker.
        starting: the worker may not be listening yet (one this process has just started), so
            a refused connection is retried too. With False it fails at once.

    Raises:
        ValueError: ``url`` is not an http(s) URL with a host.
        ConnectionError: nothing answers at ``url`` (only with ``starting=False``).
        RuntimeError: something answers at ``url``, but not as a worker (neither 200 nor 503).
        TimeoutError: still loading (or, with ``starting``, not listening) after ``timeout`` s.
    """
    parts = urlparse(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not a worker URL: give it with its scheme, e.g. http://127.0.0.1:8080")
    deadline = time.monotonic() + timeout
    last = "no answer"
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(f"{url}/healthz", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    if resp.status == 200:
                        return
                    if resp.status != 503:
                        raise RuntimeError(f"{url}/healthz answered HTTP {resp.status} {resp.reason}: not a Myna "
                                           "worker (give the worker's base URL, e.g. http://127.0.0.1:8080)")
                    last = "HTTP 503, still loading"
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                reason = _connection_failure(exc)
                if not starting:
                    hint = " (is `myna serve` running there?)" if reason == "connection refused" else ""
                    raise ConnectionError(f"cannot reach {url}: {reason}{hint}") from None
                last = reason
            await asyncio.sleep(0.25)
    raise TimeoutError(f"{url} is not ready after {timeout:.0f} s ({last})")


def _connection_failure(exc: BaseException) -> str:
    """A short reason for a failed request: "connection refused", "no answer within 5 s"…"""
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer within 5 s"
    os_error = getattr(exc, "os_error", None)
    if isinstance(os_error, socket.gaierror):
        return f"unknown host ({os_error.strerror})"
    if isinstance(os_error, OSError) and os_error.errno:
        return os.strerror(os_error.errno).lower()  # "connection refused", not asyncio's wording
    return str(exc) or type(exc).__name__


@dataclass
class TurnResult:
    """What one turn produced at the client.

    Attributes:
        turn_id: the turn.
        events: data-channel events of the turn, in arrival order.
        pcm: int16 mono samples at 48 kHz received from the first chunk sent to ``turn_done``.
        perceived_ttfa_ms: first chunk sent → first audible sample out of aiortc's jitter
            buffer (None if silent).
        server_ttfa_ms: from the ``first_audio`` event (None if there was none).
        arrival_ttfa_ms: first chunk sent → arrival of the packet with the first audible
            sample (None if silent; the perceived figure where arrivals were not recorded).
    """

    turn_id: str
    events: list[dict]
    pcm: np.ndarray
    perceived_ttfa_ms: float | None
    server_ttfa_ms: float | None
    arrival_ttfa_ms: float | None = None

    def event_types(self) -> list[str]:
        return [e["type"] for e in self.events]


@dataclass
class MynaClient:
    """A WebRTC client session with a worker.

    Use as ``async with MynaClient(url) as client: result = await client.speak("Hi.")``.

    Args:
        url: the worker's base URL, e.g. ``http://127.0.0.1:8080``.
        engine: ``request_data.engine`` (None: the worker's default).
        voice: ``request_data.voice``.
        token: access token for a worker that has keys (sent as ``Authorization: Bearer``);
            None: ``MYNA_TOKEN``, else one minted from ``MYNA_API_KEY``/``MYNA_API_SECRET``
            (:class:`myna.access.Credentials`), else none.
        turn_defaults: more of ``request_data``: the session's turn defaults (``speed``,
            ``lexicon``, ``normalise``; :class:`myna.messages.TurnDefaults`).
        codecs: the audio codecs to offer, as MIME types in order of preference (e.g.
            ``["audio/PCMU"]``, as a SIP gateway would); None: aiortc's (Opus first). The
            recorded frames are at the negotiated codec's rate (8 kHz for G.711).
    """

    url: str
    engine: str | None = None
    voice: str | None = None
    token: str | None = None
    codecs: list[str] | None = None
    turn_defaults: dict | None = None
    pc: RTCPeerConnection = field(init=False)
    events: asyncio.Queue = field(init=False)
    ready: dict | None = field(init=False, default=None)
    frames: list[tuple[float, np.ndarray]] = field(init=False, default_factory=list)
    frame_pts: list[int] = field(init=False, default_factory=list)
    frame_arrivals: list[float] = field(init=False, default_factory=list)  # each frame's packet's arrival (monotonic s)
    history: list[dict] = field(init=False, default_factory=list)  # every event, in arrival order

    async def __aenter__(self) -> "MynaClient":
        await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def connect(self, timeout: float = 15.0) -> None:
        """Negotiate, wait for the data channel's ``ready`` event.

        Raises:
            AccessRefused: the worker refused the token (a RuntimeError naming the fix).
            RuntimeError: when the worker answers the offer with another error.
            TimeoutError: when the connection does not come up within ``timeout`` seconds.
        """
        if is_loopback_host(urlparse(self.url).hostname or ""):
            enable_loopback_candidates()  # a worker on loopback is only reachable there
        wanted = None
        if self.codecs is not None:
            available = RTCRtpReceiver.getCapabilities("audio").codecs
            wanted = [c for mime in self.codecs for c in available if c.mimeType.lower() == mime.lower()]
            if not wanted:
                raise ValueError(f"none of {self.codecs} is an audio codec aiortc has")
        self.events = asyncio.Queue()
        self.pc = RTCPeerConnection(rtc_configuration())
        self.channel = self.pc.createDataChannel("myna")
        self.channel.on("message", self._on_message)
        transceiver = self.pc.addTransceiver("audio", direction="recvonly")
        if wanted is not None:
            transceiver.setCodecPreferences(wanted)
        self._watch_arrivals(transceiver.receiver)
        self._recorder: asyncio.Task | None = None

        @self.pc.on("track")
        def on_track(track) -> None:
            self._recorder = asyncio.ensure_future(self._record(track))

        await self.pc.setLocalDescription(await self.pc.createOffer())
        request_data = {**(self.turn_defaults or {}),
                        **{k: v for k, v in (("engine", self.engine), ("voice", self.voice)) if v}}
        body = {"sdp": self.pc.localDescription.sdp, "type": "offer", "request_data": request_data}
        try:
            answer = await self._post_offer(body)
        except BaseException:
            await self.pc.close()  # a refused offer leaves no peer connection behind
            raise
        self.pc_id = answer["pc_id"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        self.ready = await asyncio.wait_for(self._next_event("ready"), timeout)

    async def _post_offer(self, body: dict) -> dict:
        """``POST /api/offer`` with the token; the answer, or the refusal raised."""
        headers = Credentials(self.token).headers()
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{self.url}/api/offer", json=body, headers=headers) as resp:
                raw = await resp.read()
                try:
                    answer = json.loads(raw)
                except ValueError:  # not the contract's JSON (a proxy, another server): say what came
                    text = raw.decode("utf-8", "replace").strip().splitlines()
                    raise RuntimeError(f"offer refused ({resp.status} {resp.reason}): "
                                       f"{text[0][:200] if text else 'no body'}") from None
                error = answer.get("error") if isinstance(answer, dict) else None
                if resp.status in (401, 403, 431) and isinstance(error, dict):
                    raise AccessRefused(resp.status, error.get("code", ""), error.get("message", ""))
                if resp.status != 200:
                    if isinstance(error, dict):
                        raise RuntimeError(f"offer refused ({resp.status} {error.get('code')}): {error.get('message')}")
                    raise RuntimeError(f"offer refused ({resp.status}): {answer}")
                return answer

    def _on_message(self, message: str) -> None:
        event = json.loads(message)
        self.history.append(event)
        self.events.put_nowait(event)

    def _watch_arrivals(self, receiver) -> None:
        """Note when each RTP packet arrives, by its RTP timestamp, before aiortc's jitter
        buffer holds it. A decoded frame's ``pts`` is its packet's timestamp less the first
        packet's (aiortc's timestamp mapper). aiortc has no public hook for this: the
        receiver's packet handler is wrapped (aiortc 1.x ``RTCRtpReceiver._handle_rtp_packet``);
        without it, arrival TTFA falls back to the decoded figure."""
        self._arrivals: dict[int, float] = {}
        self._first_timestamp: int | None = None
        handle = getattr(receiver, "_handle_rtp_packet", None)
        if handle is None:
            return

        async def on_packet(packet, arrival_time_ms):
            if self._first_timestamp is None:
                self._first_timestamp = packet.timestamp
            self._arrivals.setdefault(packet.timestamp, time.monotonic())
            await handle(packet, arrival_time_ms)

        receiver._handle_rtp_packet = on_packet

    async def _record(self, track) -> None:
        try:
            while True:
                frame = await track.recv()
                now = time.monotonic()
                pcm = frame.to_ndarray().reshape(-1, len(frame.layout.channels))[:, 0].copy()
                self.frames.append((now, pcm))
                self.frame_pts.append(frame.pts)
                rtp = ((self._first_timestamp or 0) + frame.pts) & 0xFFFFFFFF
                self.frame_arrivals.append(min(now, self._arrivals.pop(rtp, now)))
        except MediaStreamError:
            pass

    async def _next_event(self, kind: str | None = None) -> dict:
        while True:
            event = await self.events.get()
            if kind is None or event["type"] == kind:
                return event

    def send(self, message: dict | str | bytes) -> None:
        """Send one raw message on the data channel (dicts are JSON-encoded)."""
        self.channel.send(json.dumps(message) if isinstance(message, dict) else message)

    async def speak(self, text: str, tokens_per_s: float | None = 30.0, turn_id: str | None = None,
                    timeout: float = 60.0, quiet_tail_s: float | None = None, voice: str | None = None,
                    speed: float | None = None) -> TurnResult:
        """Stream one turn's text as token chunks, then ``end_turn``; wait for ``turn_done``.

        Args:
            text: the turn's text.
            tokens_per_s: chunk rate, like an LLM writing; None sends all chunks at once.
            turn_id: defaults to a fresh id.
            timeout: seconds to wait for ``turn_done``.
            quiet_tail_s: after ``turn_done``, keep recording until this much received audio
                has been inaudible (for a peer that reports the end before its transport has
                sent the audio; at most ``timeout``). None: Myna's ``turn_done`` follows the
                last frame, so only the frames in flight are waited for.
            voice, speed: the turn's options, sent on its first chunk (``text.voice``,
                ``text.speed``; None: the session's).
        """
        turn_id = turn_id or uuid.uuid4().hex[:12]
        start = len(self.frames)
        t0 = time.monotonic()
        options = {k: v for k, v in (("voice", voice), ("speed", speed)) if v is not None}
        sender = asyncio.ensure_future(self._send_chunks(turn_id, text, tokens_per_s, options))
        events = []
        try:
            while True:
                event = await asyncio.wait_for(self._next_event(), timeout)
                if event.get("turn_id") not in (turn_id, None):
                    continue
                events.append(event)
                if event["type"] == "turn_done":
                    break
        finally:
            sender.cancel()
        await asyncio.sleep(0.1)  # the last frames are in flight when turn_done is sent
        if quiet_tail_s is not None:
            await self._until_quiet(start, quiet_tail_s, timeout)
        frames = self.frames[start:]
        return measure_turn(turn_id, events, frames, t0, self.frame_arrivals[start : start + len(frames)])

    async def _until_quiet(self, start: int, quiet_s: float, timeout: float, silent_s: float = 10.0) -> None:
        """Wait until audio was heard since frame ``start`` and its last ``quiet_s`` is
        inaudible (or ``silent_s`` passed with nothing heard, or ``timeout``)."""
        t0 = time.monotonic()
        heard = False
        while time.monotonic() - t0 < timeout:
            frames = [pcm for _, pcm in self.frames[start:]]
            heard = heard or (bool(frames) and first_audible_sample(np.concatenate(frames), SAMPLE_RATE) is not None)
            tail = frames[-max(1, int(quiet_s * 50)) :]  # 20 ms frames
            quiet = sum(len(p) for p in tail) >= quiet_s * SAMPLE_RATE and first_audible_sample(np.concatenate(tail), SAMPLE_RATE) is None
            if quiet and (heard or time.monotonic() - t0 >= silent_s):
                return
            await asyncio.sleep(quiet_s / 4)

    async def _send_chunks(self, turn_id: str, text: str, tokens_per_s: float | None, options: dict | None = None) -> None:
        t0 = time.monotonic()
        for i, chunk in enumerate(token_chunks(text)):
            if tokens_per_s:
                await asyncio.sleep(max(0.0, t0 + i / tokens_per_s - time.monotonic()))
            self.send({"type": "text", "turn_id": turn_id, "text": chunk, **((options or {}) if i == 0 else {})})
        self.send({"type": "end_turn", "turn_id": turn_id})

    async def close(self) -> None:
        """Close the peer connection."""
        await self.pc.close()
        if self._recorder is not None:
            self._recorder.cancel()


def measure_turn(turn_id: str, events: list[dict], frames: list[tuple[float, np.ndarray]], t0: float,
                 arrivals: list[float] | None = None) -> TurnResult:
    """A turn's result from its events and the audio received since its first chunk.

    Args:
        frames: ``(decoded, pcm)`` pairs, ``decoded`` when the receiver handed the frame out
            (monotonic clock, s), ``pcm`` int16 mono at 48 kHz, in order.
        t0: when the turn's first text chunk was sent (monotonic s).
        arrivals: when each frame's packet arrived (monotonic s; None: not recorded).
    """
    pcm = np.concatenate([f for _, f in frames]) if frames else np.zeros(0, np.int16)
    onset = first_audible_sample(pcm, SAMPLE_RATE)
    perceived = arrival = None
    if onset is not None:
        # The frame that carries the onset came at `decoded`; the onset plays that much later
        # within it.
        offset = 0
        for i, (decoded, f) in enumerate(frames):
            if onset < offset + len(f):
                within = (onset - offset) / SAMPLE_RATE
                perceived = 1000.0 * (decoded - t0 + within)
                arrival = 1000.0 * (arrivals[i] - t0 + within) if arrivals and i < len(arrivals) else perceived
                break
            offset += len(f)
    server = next((e["server_ttfa_ms"] for e in events if e["type"] == "first_audio"), None)
    return TurnResult(turn_id, events, pcm, perceived, server, arrival)
