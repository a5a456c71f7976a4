"""Myna in one LiveKit room: the room contract (README "LiveKit rooms") on the SDK.

Follow one turn. A participant opens a text stream on topic ``myna.text``
(:meth:`RoomAgent._on_text_stream`); each chunk goes through the :class:`~myna.room.routing.Router`
into the room's one :class:`~myna.session.Session` (the same session, limits and drain as every
other door, opened from the process's :class:`~myna.sessions.Sessions`), whose
:class:`~myna.room.audio.SourceOutput` plays it on Myna's track.
The session's events come back through the router to :meth:`RoomAgent._deliver`: a data packet
on ``myna.events`` to the turn's sender, and for ``word`` / ``turn_done`` a line of the
standard ``lk.transcription`` stream (:class:`Captions`). Sends leave in order through one task
(:class:`Outbox`), so event callbacks never wait on the network.

Other ways in: contract JSON as reliable data packets on topic ``myna``; the RPC method
``myna.interrupt``. Unknown ``myna*`` topics get an ``error`` event; other topics belong to
other applications in the room and only get a debug log line.

Lifetime: :meth:`RoomAgent.attach` before ``room.connect`` (stream handlers must exist before
the first stream arrives), :meth:`RoomAgent.start` after it, then :meth:`RoomAgent.run` until
the room disconnects (closed, server gone, removed), :meth:`RoomAgent.stop` is called, or, with
``leave_when_empty``, ``departure_timeout`` seconds after the last participant other than
agents left with no one back meanwhile (a reload, a dropped connection that comes back: Myna
is still there; an agent dispatched into an empty room waits for someone to come and go).
Without it (``myna room``) the room's own end ends it: LiveKit closes a room its
``departure_timeout`` after the last participant other than agents left (20 s by default);
one log line says so when the room empties.
:meth:`RoomAgent.close` releases everything: turns, the pacer, the track, the room connection.

Phone calls (docs/phone.md): LiveKit's SIP service brings a caller in as a
participant of kind SIP. Until its ``sip.callStatus`` attribute says ``active`` (the call was
answered and the caller's media arrived) it is ``ringing`` or ``dialing`` (``automation`` while
the bridge dials an extension's digits). While such a caller is the only one who would hear Myna
(no other participant but agents is in the room), Myna holds its audio back
(:attr:`RoomAgent.line`): turns are synthesised meanwhile and the first syllable goes out when
the line opens, so a greeting sent early is heard from its start. A call that was answered and
ends does not come back: when the last participant other than agents that leaves is such a
caller, Myna leaves at once, whatever ``departure_timeout`` says. A call that was never answered
(a failed outbound dial, a caller who gave up while it rang) leaves the room to the grace period,
as an agent may dial again.

One Myna per room: Myna instances recognise each other (participant attribute ``myna.ready``,
or the same ``lk.agent.name`` as this one's); of those in the room, the one that joined first
(``joined_at``, then SID) serves it, and any other steps aside: it leaves without publishing,
or, when it learns of an earlier one only later (two joins at once), as soon as it does
(:attr:`RoomAgent.stepped_aside`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from livekit import rtc

from myna.audio.playout import SAMPLE_RATE
from myna.engines import Engine
from myna.events import Error, Event, TurnDone, Word, encode_event
from myna.messages import TurnDefaults
from myna.room.audio import SourceOutput, new_source
from myna.room.routing import Router
from myna.session import EventSink, Session
from myna.sessions import Sessions

log = logging.getLogger(__name__)

TOPIC_TEXT = "myna.text"  # text stream: one turn
TOPIC_MESSAGES = "myna"  # data packets: contract JSON messages
TOPIC_EVENTS = "myna.events"  # data packets: contract events, to the turn's sender
TOPIC_TRANSCRIPTION = "lk.transcription"  # LiveKit's standard captions stream
RPC_INTERRUPT = "myna.interrupt"
#: Participant attribute set once Myna listens and its track is published.
READY_ATTRIBUTE = "myna.ready"
TRACK_NAME = "myna"
#: Seconds a disconnect may take before it is abandoned (it waits on the SDK's core, which can
#: hang when the server is gone; livekit.md §5 item 12).
DISCONNECT_TIMEOUT = 5.0
_ACTIVE = 2  # ParticipantState.PARTICIPANT_STATE_ACTIVE
#: Seconds Myna stays after the last participant other than agents left (LiveKit's own default
#: ``departure_timeout`` for a room).
DEPARTURE_TIMEOUT = 20.0
AGENT_NAME_ATTRIBUTE = "lk.agent.name"  # set by LiveKit on a dispatched agent, from its join
#: Set by LiveKit's SIP service on a caller: ``dialing`` / ``ringing`` (``automation``) until the call is answered
#: and its media flows, then ``active`` (then ``hangup``).
SIP_CALL_STATUS_ATTRIBUTE = "sip.callStatus"
_SIP_NOT_UP = frozenset({"dialing", "ringing", "automation"})


class Outbox:
    """Sends in order on one task: event callbacks queue coroutines and return at once.

    A send that fails (the room is going away, the receiver left) is logged and skipped.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Callable[[], Awaitable[None]] | None] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="myna-room-outbox")

    def put(self, send: Callable[[], Awaitable[None]]) -> None:
        self._queue.put_nowait(send)

    async def _run(self) -> None:
        while (send := await self._queue.get()) is not None:
            try:
                await send()
            except Exception as exc:  # PublishDataError, a closed stream, a disconnected room
                log.debug("room send dropped: %s", exc)

    async def aclose(self, drain_timeout: float = 1.0) -> None:
        """Send what is queued (for at most ``drain_timeout`` s), then stop."""
        self._queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._task), drain_timeout)
        except asyncio.TimeoutError:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class Captions:
    """Turns as LiveKit transcription segments: one ``lk.transcription`` text stream per turn.

    Attributes follow LiveKit Agents (``lk.segment_id`` = an id no other segment in the room
    has, :meth:`~myna.room.routing.Router.segment_id`; ``lk.transcribed_track_id`` = Myna's
    track as published now, so it follows a republish after a full reconnect;
    ``lk.transcription_final`` "false" then "true"), so LiveKit's front-end components show them
    as captions; ``myna.turn_id`` and ``myna.participant`` name the turn and its sender. Words
    are written as they are about to be heard (the ``word`` events), each followed by a space;
    the stream closes final at ``turn_done``.

    Args:
        participant: Myna's local participant.
        track_sid: returns the SID of Myna's track as published now.
    """

    def __init__(self, participant: rtc.LocalParticipant, track_sid: Callable[[], str]):
        self._participant = participant
        self._track_sid = track_sid
        self._writers: dict[str, tuple[rtc.TextStreamWriter, dict[str, str]]] = {}  # segment → (writer, attributes)

    async def word(self, segment: str, identity: str, turn_id: str, word: str) -> None:
        """Write ``word`` to ``segment`` (opened on its first word), the caption of ``identity``'s turn."""
        if segment not in self._writers:
            attributes = {"lk.segment_id": segment, "lk.transcribed_track_id": self._track_sid(),
                          "myna.turn_id": turn_id, "myna.participant": identity}
            writer = await self._participant.stream_text(
                topic=TOPIC_TRANSCRIPTION, attributes={**attributes, "lk.transcription_final": "false"})
            self._writers[segment] = (writer, attributes)
        await self._writers[segment][0].write(word + " ")

    async def final(self, segment: str) -> None:
        """Close ``segment`` as final (a turn without words has none)."""
        writer, attributes = self._writers.pop(segment, (None, None))
        if writer is not None:
            await writer.aclose(attributes={**attributes, "lk.transcribed_track_id": self._track_sid(),
                                            "lk.transcription_final": "true"})

    async def aclose(self) -> None:
        """Close every open segment as final."""
        for segment in list(self._writers):
            await self.final(segment)


class RoomAgent:
    """Myna as a participant of one room.

    Args:
        room: the room, not yet connected (see the module docstring for the order of calls).
        engine: the engine turns are spoken with.
        sessions: the process's sessions (limits, metrics, drain).
        engines: engine names for the ``ready`` event.
        defaults: the room's session's turn defaults (:class:`myna.messages.TurnDefaults`:
            voice, speed, lexicon, normalise; e.g. from the dispatch's metadata).
        notice: an error each participant gets right after ``ready`` (e.g. unusable dispatch
            metadata: the room speaks with the process's defaults instead).
        speak_for: identities allowed to speak through Myna (None: every participant).
        leave_when_empty: end once no participant other than agents is left, after
            ``departure_timeout`` seconds with no one back.
        attributes: extra participant attributes to publish beside ``myna.ready``.
        departure_timeout: the grace period of ``leave_when_empty`` (s; 0 leaves at once).
    """

    def __init__(self, room: rtc.Room, engine: Engine, sessions: Sessions, engines: list[str] | None = None,
                 defaults: TurnDefaults = TurnDefaults(), speak_for: frozenset[str] | None = None,
                 leave_when_empty: bool = False, attributes: dict[str, str] | None = None,
                 departure_timeout: float = DEPARTURE_TIMEOUT, notice: Error | None = None):
        self.room = room
        self.defaults = defaults
        self.notice = notice
        self.engine = engine
        self.sessions = sessions
        self.engines = engines or [engine.name]
        self.speak_for = speak_for
        self.leave_when_empty = leave_when_empty
        self.attributes = attributes or {}
        self.departure_timeout = departure_timeout
        #: The identity of the Myna this one stepped aside for (None: it serves the room).
        self.stepped_aside: str | None = None
        self.router: Router | None = None
        self.output: SourceOutput | None = None
        self.publication: rtc.LocalTrackPublication | None = None
        self.disconnect_reason: int | None = None  # an rtc.DisconnectReason once the room is gone
        self._source: rtc.AudioSource | None = None
        self._outbox: Outbox | None = None
        self._captions: Captions | None = None
        self._readers: set[asyncio.Task] = set()
        self._greeted: set[str] = set()  # identities sent ``ready``
        self._done = asyncio.Event()
        self._closed = False
        self._departure: asyncio.TimerHandle | None = None
        self._emptied = False  # (without leave_when_empty) the last participant left, no one came back yet
        self._left: set[str] = set()  # identities that were here and left (whose return is "back")
        #: Open while Myna's audio may go out: closed while a SIP caller's line is not up yet.
        self.line = asyncio.Event()
        self.line.set()
        self._answered: set[str] = set()  # SIP callers whose call was up at some point

    # -- lifetime ---------------------------------------------------------------------------
    def attach(self) -> None:
        """Set up the session and register the room handlers; call before ``room.connect``
        (a stream may arrive as soon as the room is joined)."""
        self._source = new_source()
        self._outbox = Outbox()

        def session(send: EventSink) -> Session:
            return self.sessions.open(self.engine, self._new_output, send, defaults=self.defaults)

        self.router = Router(session, self._deliver, self.speak_for, message_rate=self.sessions.message_rate)
        self.room.register_text_stream_handler(TOPIC_TEXT, self._on_text_stream)
        self.room.on("data_received", self._on_data)
        self.room.on("participant_active", self._on_participant_active)
        self.room.on("participant_connected", self._on_participant_connected)
        self.room.on("participant_attributes_changed", self._on_attributes_changed)
        self.room.on("participant_disconnected", self._on_participant_disconnected)
        self.room.on("disconnected", self._on_disconnected)

    async def start(self) -> None:
        """Publish the track and start listening; call once the room is connected. When
        another Myna serves the room already, step aside instead (:attr:`stepped_aside`; :meth:`run`
        then returns at once)."""
        if self._senior_myna() is not None:
            self._step_aside(self._senior_myna())
            return
        local = self.room.local_participant
        track = rtc.LocalAudioTrack.create_audio_track(TRACK_NAME, self._source)
        self.publication = await local.publish_track(
            track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
        self._captions = Captions(local, self.track_sid)
        if self.stepped_aside is not None:  # an earlier Myna showed up while the track was published
            return
        local.register_rpc_method(RPC_INTERRUPT, self._on_interrupt_rpc)
        await local.set_attributes({**self.attributes, READY_ATTRIBUTE: "true"})
        for participant in self.room.remote_participants.values():
            if participant.state == _ACTIVE:  # the others get it once active (participant_active)
                self._send_ready(participant.identity)
        self._check_line()
        log.info("joined room %r as %r (speaking for %s)", self.room.name, local.identity,
                 ", ".join(sorted(self.speak_for)) if self.speak_for else "everyone")

    def track_sid(self) -> str:
        """The SID of Myna's track as published now (a full reconnect republishes it under a new one)."""
        for publication in self.room.local_participant.track_publications.values():
            if publication.name == TRACK_NAME:
                self.publication = publication
                return publication.sid
        return self.publication.sid if self.publication is not None else ""

    def _new_output(self, session: Session) -> SourceOutput:
        self.output = SourceOutput.for_session(session, self._source, line=self.line)
        return self.output

    async def run(self) -> None:
        """Serve the room until it ends (see the module docstring), then :meth:`close`."""
        try:
            await self._done.wait()
        finally:
            await self.close()

    def stop(self) -> None:
        """Make :meth:`run` return (e.g. on a signal)."""
        self._done.set()

    async def close(self) -> None:
        """Cancel every turn, stop the pacer, close captions, leave the room (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._done.set()
        if self._departure is not None:
            self._departure.cancel()
        for task in list(self._readers):
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        if self.router is not None:
            await self.router.session.close()
        if self.output is not None:
            await self.output.aclose()
        if self._captions is not None and self.room.isconnected():
            self._outbox.put(self._captions.aclose)
        if self._outbox is not None:
            await self._outbox.aclose()
        if self.room.isconnected():
            try:
                await asyncio.wait_for(self.room.disconnect(), DISCONNECT_TIMEOUT)
            except (asyncio.TimeoutError, Exception) as exc:  # the server may be gone
                log.warning("leaving room %r: %s", self.room.name, str(exc) or type(exc).__name__)
        log.info("left room %r", self.room.name)

    # -- one Myna per room ---------------------------------------------------------------------
    def _is_myna(self, participant: rtc.RemoteParticipant) -> bool:
        """Whether ``participant`` is a Myna (ready, or dispatched under this one's agent name)."""
        if participant.kind != rtc.ParticipantKind.PARTICIPANT_KIND_AGENT:
            return False
        mine = self.room.local_participant.attributes.get(AGENT_NAME_ATTRIBUTE)
        return READY_ATTRIBUTE in participant.attributes or (
            mine is not None and participant.attributes.get(AGENT_NAME_ATTRIBUTE) == mine)

    @staticmethod
    def _seniority(participant: rtc.Participant) -> tuple[float, str]:
        joined = participant.joined_at
        return (joined.timestamp() if joined is not None else float("inf"), participant.sid)

    def _senior_myna(self) -> str | None:
        """The identity of a Myna in the room that joined before this one, if any."""
        me = self._seniority(self.room.local_participant)
        seniors = [p for p in self.room.remote_participants.values() if self._is_myna(p) and self._seniority(p) < me]
        return min(seniors, key=self._seniority).identity if seniors else None

    def _step_aside(self, other: str) -> None:
        if self.stepped_aside is None:
            self.stepped_aside = other
            log.info("room %r: Myna %r serves it already; stepping aside", self.room.name, other)
            self._done.set()

    def _on_participant_connected(self, participant: rtc.RemoteParticipant) -> None:
        if self._closed:
            return
        # "back" only for someone who was here before; anyone else "joined".
        came = "is back" if participant.identity in self._left else "joined"
        if participant.kind != rtc.ParticipantKind.PARTICIPANT_KIND_AGENT and self._departure is not None:
            log.info("room %r: %r %s; staying", self.room.name, participant.identity, came)
            self._departure.cancel()
            self._departure = None
        if participant.kind != rtc.ParticipantKind.PARTICIPANT_KIND_AGENT and self._emptied:
            self._emptied = False
            log.info("room %r: %r %s", self.room.name, participant.identity, came)
        self._check_seniority()
        self._check_line()

    def _on_attributes_changed(self, _changed: dict[str, str], participant: rtc.Participant) -> None:
        if not self._closed and participant is not self.room.local_participant:
            self._check_seniority()
            self._check_line()

    # -- phone calls ------------------------------------------------------------------------
    def _is_caller(self, participant: rtc.RemoteParticipant) -> bool:
        return participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_SIP

    def _check_line(self, leaving: str | None = None) -> None:
        """Open or close :attr:`line` (module docstring): closed while every participant but
        agents (and but ``leaving``, who is still listed while it leaves) is a caller whose call
        is not up yet. Notes which callers' calls were answered."""
        waiting, hearing = [], False
        for p in self.room.remote_participants.values():
            if p.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT or p.identity == leaving:
                continue
            if self._is_caller(p) and p.attributes.get(SIP_CALL_STATUS_ATTRIBUTE) in _SIP_NOT_UP:
                waiting.append(p.identity)
            else:
                hearing = True
                if self._is_caller(p):
                    self._answered.add(p.identity)
        if waiting and not hearing and self.line.is_set():
            self.line.clear()
            log.info("room %r: holding Myna's audio until %s answers", self.room.name, ", ".join(map(repr, waiting)))
        elif (hearing or not waiting) and not self.line.is_set():
            self.line.set()
            log.info("room %r: the call is up; Myna's audio goes out", self.room.name)

    def _check_seniority(self) -> None:
        if (other := self._senior_myna()) is not None:
            self._step_aside(other)

    # -- in -----------------------------------------------------------------------------------
    def _on_text_stream(self, reader: rtc.TextStreamReader, identity: str) -> None:
        if self._closed or self.stepped_aside is not None:
            reader.close()
            return
        task = asyncio.get_running_loop().create_task(self._read_turn(reader, identity))
        self._readers.add(task)
        task.add_done_callback(self._readers.discard)

    async def _read_turn(self, reader: rtc.TextStreamReader, identity: str) -> None:
        """A ``myna.text`` stream is one turn: stream id = turn_id, chunks = text, close = end;
        its attributes ``voice``, ``speed``, ``language`` are the turn's options."""
        turn_id = reader.info.stream_id
        allowed = self.router.allowed(identity)
        options = None
        if not allowed:
            self.router.end_turn(identity, turn_id)  # → not_allowed
        else:
            options = self.router.stream_options(identity, turn_id, reader.info.attributes or {})
            allowed = options is not None
        try:
            async for chunk in reader:  # (a refused stream is read and dropped: bounded memory)
                if allowed:
                    self.router.text(identity, turn_id, chunk, options)
                    options = None
        except rtc.StreamError as exc:  # aborted by the sender, or the sender left
            log.info("text stream %s from %r ended early: %s", turn_id, identity, exc)
        if allowed:
            self.router.end_turn(identity, turn_id)

    def _on_data(self, packet: rtc.DataPacket) -> None:
        if self._closed or self.stepped_aside is not None:
            return
        if packet.participant is None:  # the server, or a sender the room has not announced yet
            log.warning("ignored a data packet on topic %r from a sender not (yet) in the room: senders "
                        "should wait for Myna's ready event", packet.topic)
            return
        identity = packet.participant.identity
        if packet.topic == TOPIC_MESSAGES:
            self.router.packet(identity, packet.data)
        elif packet.topic.startswith(TOPIC_MESSAGES) and packet.topic != TOPIC_EVENTS:
            self._deliver(identity, Error(code="unknown_topic", message=
                                          f"Myna reads data packets on topic {TOPIC_MESSAGES!r}, not {packet.topic!r}"))
        else:
            log.debug("ignored a data packet on topic %r from %r", packet.topic, identity)

    async def _on_interrupt_rpc(self, data: rtc.RpcInvocationData) -> str:
        try:
            dropped = self.router.interrupt(data.caller_identity)
        except PermissionError as exc:
            raise rtc.RpcError(rtc.RpcError.ErrorCode.APPLICATION_ERROR, str(exc)) from None
        return json.dumps({"interrupted": dropped})

    def _on_participant_active(self, participant: rtc.RemoteParticipant) -> None:
        # Active = ready to receive data (a packet sent on join may arrive after later ones).
        if not self._closed:
            self._send_ready(participant.identity)

    def _on_participant_disconnected(self, participant: rtc.RemoteParticipant) -> None:
        if not self._closed:
            self.router.participant_left(participant.identity)
            self._greeted.discard(participant.identity)
            self._left.add(participant.identity)
            self._check_line(leaving=participant.identity)
            if self.leave_when_empty and not self.others() and participant.identity in self._answered:
                log.info("room %r: the call with %r ended; leaving", self.room.name, participant.identity)
                self._done.set()  # an ended call does not come back: no departure grace
            elif self.leave_when_empty and not self.others() and self._departure is None:
                log.info("room %r has no one left to speak to; leaving in %g s unless someone comes back",
                         self.room.name, self.departure_timeout)
                self._departure = asyncio.get_running_loop().call_later(self.departure_timeout, self._leave_if_empty)
            elif not self.leave_when_empty and not self.others() and not self._emptied:
                # (`myna room`): it stays as long as the room does, and the server ends the room.
                self._emptied = True
                after = f"{self.room.departure_timeout:g} s" if self.room.departure_timeout else "some time"
                log.info("room %r has no one left to speak to; LiveKit closes it %s after the last participant "
                         "left (the room's departure_timeout) unless someone comes back, and Myna leaves with it",
                         self.room.name, after)

    def _leave_if_empty(self) -> None:
        self._departure = None
        if not self._closed and not self.others():
            log.info("room %r: no one came back in %g s; leaving", self.room.name, self.departure_timeout)
            self._done.set()

    def _on_disconnected(self, reason: int) -> None:
        self.disconnect_reason = reason
        log.info("room %r disconnected: %s", self.room.name, rtc.DisconnectReason.Name(reason))
        self._done.set()

    def others(self) -> list[rtc.RemoteParticipant]:
        """Participants other than agents (Myna instances included)."""
        return [p for p in self.room.remote_participants.values() if p.kind != rtc.ParticipantKind.PARTICIPANT_KIND_AGENT]

    # -- out ----------------------------------------------------------------------------------
    def _ready(self) -> Event:
        return self.router.session.ready_event(self.engines, SAMPLE_RATE)

    def _send_ready(self, identity: str) -> None:
        if identity not in self._greeted:
            self._deliver(identity, self._ready())

    def _deliver(self, identity: str, event: Event) -> None:
        """One event to ``identity`` on ``myna.events`` (``ready`` first, once, then
        :attr:`notice` if any); words and
        turn ends also go to captions."""
        if self._outbox is None or self._closed or self.stepped_aside is not None:
            return
        if identity not in self._greeted:  # ready first, then the notice, then the event
            self._greeted.add(identity)
            self._deliver(identity, self._ready())
            if self.notice is not None:
                self._deliver(identity, self.notice)
            if event.type == "ready":
                return
        payload = encode_event(event)
        if payload is None:  # a word or turn_id that large is refused on input
            log.error("room: a %s event does not fit in a message; dropped", event.type)
            return
        self._outbox.put(lambda: self.room.local_participant.publish_data(
            payload, reliable=True, destination_identities=[identity], topic=TOPIC_EVENTS))
        if self._captions is None:  # (before start: nothing has been heard yet)
            return
        if isinstance(event, (Word, TurnDone)):
            segment = self.router.segment_id(identity, event.turn_id)
            if segment is None:
                return
            if isinstance(event, Word):
                self._outbox.put(lambda: self._captions.word(segment, identity, event.turn_id, event.word))
            else:
                self._outbox.put(lambda: self._captions.final(segment))
