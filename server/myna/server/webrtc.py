"""The WebRTC door: SDP signaling, one peer connection per session, the data channel.

``POST /api/offer`` (Pipecat SmallWebRTC compatible) becomes :meth:`Peers.offer`: the worker
admits the client, and the peer gets a :class:`~myna.session.Session` whose output is a paced
:class:`~myna.audio.playout.Playout`, drained by the peer's audio track
(:class:`~myna.rtc.track.PacedAudioTrack`): Opus, or G.711 (PCMU/PCMA) when that is what the
offer allows, encoded as G.711 (an offer with none of these is refused: 415
``unsupported_codec``, naming them). Each data-channel message goes into :meth:`Session.receive`
under the peer's message rate cap (which never cuts a turn already accepted); the session's events go back out on the
channel the client last spoke on, as JSON no larger than the peer's SCTP
``a=max-message-size`` (an event that cannot fit is dropped, and said once per event type).

``pc_id``: a renegotiation of a connection keeps its id; an offer with another connection's id
(or another client's) is refused (409 ``pc_id_in_use``) unless ``restart_pc`` is set, and then
the new connection replaces the old one once it is answered, taking over its session slot.
``PATCH /api/offer`` adds trickled ICE candidates (:meth:`Peers.add_candidates`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription, candidate_from_sdp

from myna.audio.playout import SAMPLE_RATE, Playout
from myna.engines import Engine
from myna.errors import HTTPError
from myna.events import MAX_MESSAGE_BYTES, Error, Event, encode_event
from myna.limits import MessageRate
from myna.messages import BadMessage, TurnDefaults, parse_turn_defaults
from myna.rtc.ice import rtc_configuration
from myna.rtc.track import PacedAudioTrack
from myna.session import Session

log = logging.getLogger(__name__)


@dataclass
class Peer:
    """A peer connection, the session it carries, and who owns it."""

    pc_id: str
    pc: RTCPeerConnection
    session: Session
    track: PacedAudioTrack
    owner: str  # the client it is counted against (token identity or address)
    release: Callable[[], None]  # gives the owner's session slot back (idempotent)
    rate: MessageRate
    channel: object | None = None  # where events go: the open channel the client last used
    channels: list = field(default_factory=list)
    connect_timer: asyncio.TimerHandle | None = None
    max_event_bytes: int = MAX_MESSAGE_BYTES  # the smaller of ours and the peer's SCTP max-message-size
    refused_kinds: set = field(default_factory=set)  # event types already reported as too large


class Peers:
    """The WebRTC peers of one worker (a :class:`myna.server.app.Worker`).

    Args:
        worker: the worker (engines, sessions, metrics, admission).
        ice_servers: STUN/TURN URLs offered to aiortc (none by default: nothing leaves the host).
        connect_timeout: seconds a new peer may take to connect before it is dropped.
    """

    def __init__(self, worker, ice_servers: list[str], connect_timeout: float):
        self.worker = worker
        self.ice_servers = ice_servers
        self.connect_timeout = connect_timeout
        self.peers: dict[str, Peer] = {}

    async def offer(self, body: dict, client: str = "local", grant=None) -> dict:
        """Answer an SDP offer, creating (or restarting) a peer and its session for ``client``.

        Raises:
            HTTPError: 400 for a malformed body, unknown engine or voice, ``bad_speed`` or
                ``bad_lexicon`` in ``request_data``, or unusable SDP; 409
                for another client's ``pc_id``; 503 while starting or draining.
            AuthError: 403 when ``grant`` may not use the engine.
            LimitExceeded: 503 ``full``, 429 ``too_many_sessions`` / ``rate_limited``.
        """
        worker = self.worker
        worker.refuse_while_draining()
        sdp, kind = body.get("sdp"), body.get("type")
        if not isinstance(sdp, str) or kind != "offer":
            raise HTTPError(400, "bad_request", 'the body needs "sdp" (string) and "type": "offer"')
        request_data = next((body[k] for k in ("request_data", "requestData") if body.get(k) is not None), {})
        if not isinstance(request_data, dict):
            raise HTTPError(400, "bad_request", '"request_data" must be an object')
        engine_name = request_data.get("engine")
        if not isinstance(engine_name, (str, type(None))):
            raise HTTPError(400, "bad_request", '"request_data.engine" must be a string')
        try:
            defaults = parse_turn_defaults(request_data)
        except BadMessage as exc:  # (bad_config: the offer's own code for a malformed body)
            raise HTTPError(400, "bad_request" if exc.code == "bad_config" else exc.code,
                            f"request_data: {exc.message}") from None
        engine, voice = worker.choose(engine_name or None, defaults.voice, grant)
        defaults = replace(defaults, voice=voice)
        if not worker.ready:
            raise HTTPError(503, "not_ready", "the worker is still loading its engines")
        if "\nm=audio " not in sdp.replace("\r\n", "\n"):
            raise HTTPError(400, "bad_sdp", "the offer needs an audio m-line (add a recvonly audio transceiver)")

        pc_id = body.get("pc_id")
        existing = self.peers.get(pc_id) if isinstance(pc_id, str) else None
        if existing is not None and existing.owner != client:
            raise HTTPError(409, "pc_id_in_use", "that pc_id belongs to another client; omit pc_id")
        if existing is not None and not body.get("restart_pc"):
            # Renegotiation keeps the ICE credentials; another peer's offer cannot reuse the id.
            if _ice_ufrag(sdp) != _ice_ufrag(existing.pc.remoteDescription.sdp):
                raise HTTPError(409, "pc_id_in_use", "that pc_id belongs to another connection; omit pc_id or set restart_pc")
            return await self._answer(existing, sdp)
        if existing is not None:  # a restart takes over the slot of the connection it replaces
            release, existing.release = existing.release, _nothing
        else:
            release = worker.admit(client, grant)
        peer = self._new_peer(existing.pc_id if existing else f"myna-{uuid.uuid4().hex}", engine, defaults, client,
                              release)
        try:
            answer = await self._answer(peer, sdp)
        except HTTPError:
            if existing is not None:
                peer.release, existing.release = _nothing, release  # the old connection keeps its slot
            await self._release(peer)
            raise
        if existing is not None:  # a restart replaces the old connection only once the new one is answered
            await self._release(existing)
        self.peers[peer.pc_id] = peer
        return answer

    def _new_peer(self, pc_id: str, engine: Engine, defaults: TurnDefaults, owner: str,
                  release: Callable[[], None]) -> Peer:
        worker = self.worker
        pc = RTCPeerConnection(rtc_configuration(self.ice_servers))
        peer: Peer

        def send(event: Event) -> None:
            self._send_event(peer, peer.channel, event)

        session = worker.sessions.open(engine, Playout.for_session, send, defaults=defaults)
        track = PacedAudioTrack(session.output, on_error=session.output_failed)
        peer = Peer(pc_id, pc, session, track, owner, release, worker.sessions.message_rate())
        pc.addTrack(track)

        @pc.on("datachannel")
        def on_datachannel(channel) -> None:
            peer.channels.append(channel)
            if peer.channel is None or peer.channel.readyState != "open":
                peer.channel = channel

            @channel.on("message")
            def on_message(message) -> None:
                peer.channel = channel  # events go to the channel the client last spoke on
                session.receive(message, peer.rate)  # (a turn already accepted is never cut for rate)

            @channel.on("close")
            def on_close() -> None:
                peer.channels.remove(channel)
                if peer.channel is channel:  # fall back to another open channel, if any
                    peer.channel = next((c for c in reversed(peer.channels) if c.readyState == "open"), None)

            self._send_event(peer, channel, session.ready_event(list(worker.engines), SAMPLE_RATE))

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            log.info("peer %s: %s", pc_id, pc.connectionState)
            if pc.connectionState in ("failed", "closed") and self.peers.get(pc_id) is peer:
                await self.close_peer(pc_id)

        peer.connect_timer = asyncio.get_running_loop().call_later(
            self.connect_timeout, self._drop_if_unconnected, pc_id, pc)
        return peer

    def _send_event(self, peer: Peer, channel, event: Event) -> None:
        """Send one event on ``channel``; one that cannot go (too large for the peer, channel
        failing) is dropped and counted, never raised into the caller (the track's frame loop)."""
        if channel is None or channel.readyState != "open":
            return
        metrics = self.worker.metrics
        text = encode_event(event, peer.max_event_bytes)
        if text is None:
            metrics.events_dropped.labels("too_large").inc()
            if event.type not in peer.refused_kinds:  # say so once per event type, if even that fits
                peer.refused_kinds.add(event.type)
                log.warning("peer %s: %s events exceed its max-message-size (%d bytes); dropped",
                            peer.pc_id, event.type, peer.max_event_bytes)
                notice = encode_event(Error(code="event_too_large", message=f"{event.type} events do not fit your "
                                                                            "max-message-size"), peer.max_event_bytes)
                if notice is not None:
                    self._send_text(peer, channel, notice)
            return
        self._send_text(peer, channel, text)

    def _send_text(self, peer: Peer, channel, text: str) -> None:
        try:
            channel.send(text)
        except Exception as exc:  # aiortc raises ValueError, InvalidStateError, ... mid-close
            self.worker.metrics.events_dropped.labels("send_failed").inc()
            log.info("peer %s: an event could not be sent: %s", peer.pc_id, exc)

    async def _answer(self, peer: Peer, sdp: str) -> dict:
        if not _offers_a_codec_we_send(sdp):
            raise HTTPError(415, "unsupported_codec", "the offer's audio m-line has no codec this worker can send; "
                            f"offer one of {', '.join(SUPPORTED_CODECS)}")
        try:
            await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await peer.pc.setLocalDescription(await peer.pc.createAnswer())
        except Exception as exc:  # aiortc raises ValueError, AssertionError, ... on bad SDP
            raise HTTPError(400, "bad_sdp", f"the offer could not be used: {exc or type(exc).__name__}") from None
        peer.track.use_codec(_audio_codec(peer.pc.localDescription.sdp))
        peer.max_event_bytes = _max_event_bytes(sdp)
        return {"sdp": peer.pc.localDescription.sdp, "type": peer.pc.localDescription.type, "pc_id": peer.pc_id}

    async def add_candidates(self, body: dict, client: str = "local") -> None:
        """Add trickled ICE candidates (``PATCH /api/offer``) to a peer of ``client``.

        Raises:
            HTTPError: 400 for a malformed body, 404 for an unknown ``pc_id`` (or another client's).
        """
        peer = self.peers.get(body.get("pc_id")) if isinstance(body.get("pc_id"), str) else None
        if peer is None or peer.owner != client:
            raise HTTPError(404, "unknown_pc", "no peer connection with that pc_id")
        candidates = body.get("candidates")
        if not isinstance(candidates, list):
            raise HTTPError(400, "bad_request", '"candidates" must be a list')
        for item in candidates:
            try:
                text = item.get("candidate") or ""
                if not text:
                    await peer.pc.addIceCandidate(None)  # end of candidates
                    continue
                candidate = candidate_from_sdp(text.removeprefix("candidate:"))
                candidate.sdpMid = item.get("sdp_mid", item.get("sdpMid"))
                candidate.sdpMLineIndex = item.get("sdp_mline_index", item.get("sdpMLineIndex"))
                await peer.pc.addIceCandidate(candidate)
            except Exception as exc:
                raise HTTPError(400, "bad_candidate", f"unusable ICE candidate: {exc}") from None

    def _drop_if_unconnected(self, pc_id: str, pc: RTCPeerConnection) -> None:
        peer = self.peers.get(pc_id)
        if peer is not None and peer.pc is pc and pc.connectionState != "connected":
            log.info("peer %s did not connect within %.0f s", pc_id, self.connect_timeout)
            asyncio.ensure_future(self.close_peer(pc_id))

    async def close_peer(self, pc_id: str) -> None:
        """Release everything a peer's session owns (idempotent)."""
        peer = self.peers.pop(pc_id, None)
        if peer is not None:
            await self._release(peer)

    @staticmethod
    async def _release(peer: Peer) -> None:
        """Close the session and the connection and drop every reference to them now (not
        when the connect timer fires: a closed connection must not outlive its close)."""
        peer.release()
        if peer.connect_timer is not None:
            peer.connect_timer.cancel()
            peer.connect_timer = None
        try:
            await peer.session.close()
        finally:
            peer.track.stop()
            await peer.pc.close()
            peer.pc.remove_all_listeners()  # the handlers close over the peer: break the cycle
            for channel in peer.channels:
                channel.remove_all_listeners()
            peer.channels.clear()
            peer.channel = None

    async def close(self) -> None:
        """Close every peer."""
        await asyncio.gather(*(self.close_peer(pc_id) for pc_id in list(self.peers)))


def _nothing() -> None:
    """A release function with nothing left to release."""


#: The audio codecs a worker sends (aiortc's: Opus encoded here, G.711 by aiortc), as an SDP names them.
SUPPORTED_CODECS = ("opus/48000/2", "PCMU/8000", "PCMA/8000")


def _audio_codec(answer_sdp: str) -> str:
    """The MIME type of the codec our answer sends audio with (the audio m-line's first)."""
    for media in SessionDescription.parse(answer_sdp).media:
        if media.kind == "audio" and media.rtp.codecs:
            return media.rtp.codecs[0].mimeType
    return "audio/opus"


def _offers_a_codec_we_send(offer_sdp: str) -> bool:
    """Whether the offer's audio m-lines name any of :data:`SUPPORTED_CODECS` (an offer whose
    SDP cannot be parsed at all counts as offering one: it is refused as ``bad_sdp``)."""
    try:
        media = [m for m in SessionDescription.parse(offer_sdp).media if m.kind == "audio"]
    except Exception:
        return True
    names = {c.split("/")[0].lower() for c in SUPPORTED_CODECS}
    return any(codec.name.lower() in names for m in media for codec in m.rtp.codecs)


def _max_event_bytes(sdp: str) -> int:
    """Our 16 KiB cap, or less when the peer's SDP says so (``a=max-message-size``,
    RFC 8841 §6: absent means 64 KiB, 0 means any size)."""
    sizes = [int(m) for m in re.findall(r"^a=max-message-size:\s*(\d+)", sdp, flags=re.MULTILINE)]
    return min([MAX_MESSAGE_BYTES, *(n for n in sizes if n > 0)])


def _ice_ufrag(sdp: str) -> str | None:
    for line in sdp.splitlines():
        if line.startswith("a=ice-ufrag:"):
            return line.split(":", 1)[1].strip()
    return None
