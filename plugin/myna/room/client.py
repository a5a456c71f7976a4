"""A Python participant that talks to Myna in a LiveKit room (``myna talk``, tests, ``myna bench``).

It joins the room with its own token, waits for Myna (the participant whose ``myna.ready``
attribute is set) and subscribes to its track, streams a turn's text over ``myna.text`` as
token-sized chunks at a chosen rate, records Myna's audio with arrival times, collects the
``myna.events`` packets and the ``lk.transcription`` segments, and measures perceived TTFA on
the received samples exactly like the WebRTC client (:func:`myna.rtc.client.measure_turn`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
from livekit import rtc

from myna.audio.playout import SAMPLE_RATE
from myna.room.agent import READY_ATTRIBUTE, RPC_INTERRUPT, TOPIC_EVENTS, TOPIC_MESSAGES, TOPIC_TEXT, TOPIC_TRANSCRIPTION
from myna.rtc.client import TurnResult, measure_turn, token_chunks


class JoinTimeout(TimeoutError):
    """The server did not answer the join in time (a :class:`TimeoutError`, apart from Myna not
    showing up in a room that was joined)."""

    def __init__(self) -> None:
        super().__init__("the server did not answer the join")


class MynaLeft(ConnectionError):
    """Myna is not in the room (it left, was removed, or stopped being ready): no turn can go to it."""

    def __init__(self) -> None:
        super().__init__("Myna left the room")


#: The event :class:`RoomClient` queues when Myna leaves (:meth:`RoomClient.next_event` raises :class:`MynaLeft`).
_LEFT = {"type": "myna_left"}


@dataclass
class Segment:
    """One ``lk.transcription`` segment as received: its text and whether it closed final."""

    segment_id: str
    track_id: str
    turn_id: str = ""  # myna.turn_id: the sender's turn
    participant: str = ""  # myna.participant: the turn's sender
    text: str = ""
    final: bool = False


@dataclass
class RoomClient:
    """A participant speaking to Myna through a room.

    Use as ``async with RoomClient(url, token) as client: result = await client.speak("Hi.")``.

    Args:
        url: the server's WebSocket URL.
        token: a join token for this participant (see :func:`participant_token`).
        myna_identity: Myna's identity (None: the first participant with ``myna.ready`` set).
    """

    url: str
    token: str
    myna_identity: str | None = None
    room: rtc.Room = field(init=False)
    history: list[dict] = field(init=False, default_factory=list)  # every event, in arrival order
    frames: list[tuple[float, np.ndarray]] = field(init=False, default_factory=list)
    segments: dict[str, Segment] = field(init=False, default_factory=dict)
    ready: dict | None = field(init=False, default=None)
    left: bool = field(init=False, default=False)  # Myna was here and is away now

    async def __aenter__(self) -> "RoomClient":
        await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def connect(self, timeout: float = 30.0) -> None:
        """Join, then wait until Myna is present, its track subscribed, and its ``ready`` event here.

        Raises:
            JoinTimeout: the server did not answer the join within ``timeout`` seconds (2 at least).
            TimeoutError: Myna did not show up within ``timeout`` seconds.
            rtc.ConnectError: the server refused the join.
        """
        self.room = rtc.Room()
        self._events: asyncio.Queue[dict] = asyncio.Queue()
        self._tasks: set[asyncio.Task] = set()
        self._subscribed = asyncio.Event()
        self.room.on("data_received", self._on_data)
        self.room.on("track_subscribed", self._on_track)
        self.room.on("participant_disconnected", self._on_participant_disconnected)
        self.room.on("participant_connected", self._on_participant_connected)
        self._arrivals: dict[int, float] = {}  # id(event) -> when it came (monotonic s)
        self._myna_seen: str | None = None
        self.room.register_text_stream_handler(TOPIC_TRANSCRIPTION, self._on_transcription)
        deadline = time.monotonic() + timeout
        try:  # --wait bounds the join too: the SDK retries a silent server for 10 s a try otherwise
            await asyncio.wait_for(self.room.connect(self.url, self.token, rtc.RoomOptions(
                auto_subscribe=True, connect_timeout=min(10.0, max(2.0, timeout)))), max(2.0, timeout))
        except TimeoutError:
            raise JoinTimeout() from None
        while (myna := self.myna()) is None:
            if time.monotonic() > deadline:
                raise TimeoutError("Myna did not join the room")
            await asyncio.sleep(0.05)
        self._myna_seen = myna.identity
        await asyncio.wait_for(self._subscribed.wait(), max(0.1, deadline - time.monotonic()))
        await self.next_event("ready", timeout=max(0.1, deadline - time.monotonic()))

    @property
    def events(self) -> asyncio.Queue:
        """Myna's events not read yet, in arrival order (what :meth:`next_event` reads)."""
        return self._events

    def myna(self) -> rtc.RemoteParticipant | None:
        """Myna's participant once it is ready (None before)."""
        for p in self.room.remote_participants.values():
            if (self.myna_identity in (None, p.identity)) and p.attributes.get(READY_ATTRIBUTE) == "true":
                return p
        return None

    def _myna_identity(self) -> str:
        """Myna's identity, to send to it.

        Raises:
            MynaLeft: Myna is not (or no longer) in the room and ready.
        """
        myna = None if self.left else self.myna()
        if myna is None:
            raise MynaLeft()
        return myna.identity

    def _on_participant_disconnected(self, participant: rtc.RemoteParticipant) -> None:
        if self._myna_seen is not None and participant.identity == self._myna_seen and not self.left:
            self.left = True
            self._events.put_nowait(_LEFT)

    def _on_participant_connected(self, participant: rtc.RemoteParticipant) -> None:
        if participant.identity == self._myna_seen:  # back (e.g. after a full reconnect)
            self.left = False

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_data(self, packet: rtc.DataPacket) -> None:
        if packet.topic == TOPIC_EVENTS:
            event = json.loads(packet.data)
            self.history.append(event)
            self._arrivals[id(event)] = time.monotonic()
            if event["type"] == "ready":
                self.ready = event
            self._events.put_nowait(event)

    def _on_track(self, track: rtc.Track, publication, participant: rtc.RemoteParticipant) -> None:
        if track.kind == rtc.TrackKind.KIND_AUDIO and participant.attributes.get(READY_ATTRIBUTE) == "true":
            self.track_sid = publication.sid
            self._spawn(self._record(track))
            self._subscribed.set()

    async def _record(self, track: rtc.Track) -> None:
        async for event in rtc.AudioStream.from_track(track=track, sample_rate=SAMPLE_RATE, num_channels=1):
            self.frames.append((time.monotonic(), np.frombuffer(event.frame.data, dtype=np.int16).copy()))

    def _on_transcription(self, reader: rtc.TextStreamReader, identity: str) -> None:
        attributes = reader.info.attributes or {}
        segment = Segment(attributes.get("lk.segment_id", ""), attributes.get("lk.transcribed_track_id", ""),
                          attributes.get("myna.turn_id", ""), attributes.get("myna.participant", ""))
        self.segments[segment.segment_id] = segment

        async def read() -> None:
            async for chunk in reader:
                segment.text += chunk
            segment.final = (reader.info.attributes or {}).get("lk.transcription_final") == "true"

        self._spawn(read())

    def caption(self, turn_id: str) -> Segment | None:
        """The caption segment of this participant's turn ``turn_id`` (None before its first word)."""
        me = self.room.local_participant.identity
        for segment in self.segments.values():
            if segment.turn_id == turn_id and segment.participant == me:
                return segment
        return None

    # -- sending ----------------------------------------------------------------------------
    async def send(self, message: dict | str | bytes, topic: str = TOPIC_MESSAGES) -> None:
        """One reliable data packet to Myna (dicts are JSON-encoded)."""
        payload = json.dumps(message) if isinstance(message, dict) else message
        await self.room.local_participant.publish_data(payload, reliable=True, topic=topic,
                                                       destination_identities=[self._myna_identity()])

    async def interrupt(self) -> dict:
        """Call ``myna.interrupt``; returns its answer (``{"interrupted": [turn_id, ...]}``).

        Raises:
            rtc.RpcError: refused (e.g. this participant may not speak through Myna).
        """
        answer = await self.room.local_participant.perform_rpc(
            destination_identity=self._myna_identity(), method=RPC_INTERRUPT, payload="")
        return json.loads(answer)

    async def next_event(self, kind: str | None = None, timeout: float = 30.0) -> dict:
        """The next event (of type ``kind``) from Myna.

        Raises:
            MynaLeft: Myna left the room (at once, not after ``timeout``).
        """
        async def wait() -> dict:
            while True:
                event = await self._events.get()
                if event is _LEFT:
                    if not self.left:  # it came back since
                        continue
                    self._events.put_nowait(_LEFT)  # every later wait raises too, while it is away
                    raise MynaLeft()
                if kind is None or event["type"] == kind:
                    return event

        return await asyncio.wait_for(wait(), timeout)

    async def start_turn(self, text: str, tokens_per_s: float | None = 30.0, turn_id: str | None = None,
                         attributes: dict[str, str] | None = None) -> tuple[str, float, asyncio.Task]:
        """Start streaming one turn over ``myna.text``; returns (turn_id, t0, the sending task).

        ``t0`` is when the stream was opened with its first chunk (monotonic s); ``attributes``
        are the stream's (the turn's options: ``{"speed": "1.5"}``).
        """
        turn_id = turn_id or uuid.uuid4().hex[:12]
        chunks = token_chunks(text)
        t0 = time.monotonic()
        writer = await self.room.local_participant.stream_text(
            topic=TOPIC_TEXT, stream_id=turn_id, destination_identities=[self._myna_identity()], attributes=attributes)

        async def send_chunks() -> None:
            try:
                for i, chunk in enumerate(chunks):
                    if tokens_per_s:
                        await asyncio.sleep(max(0.0, t0 + i / tokens_per_s - time.monotonic()))
                    await writer.write(chunk)
            finally:
                await writer.aclose()

        task = asyncio.get_running_loop().create_task(send_chunks())
        return turn_id, t0, task

    async def speak(self, text: str, tokens_per_s: float | None = 30.0, turn_id: str | None = None,
                    timeout: float = 60.0, attributes: dict[str, str] | None = None) -> TurnResult:
        """Stream one turn, wait for its ``turn_done``; the result as :class:`~myna.rtc.client.TurnResult`.

        The recording is this turn's: it starts when the turn's ``turn_started`` came (held
        until the turns before it are done; audio lags the events), not at the first frame after ``t0``
        (another participant's turn may be playing then), and ends at its ``turn_done`` (a
        sender still writing chunks then is cancelled).

        Raises:
            MynaLeft: Myna left the room before the turn was done.
        """
        start = len(self.frames)
        turn_id, t0, sender = await self.start_turn(text, tokens_per_s, turn_id, attributes)
        stopped = False
        try:
            events = await self.turn_events(turn_id, timeout)
        finally:
            if not sender.done():
                stopped = True
                sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        if not stopped and not sender.cancelled() and sender.exception() is not None:
            raise sender.exception()
        await asyncio.sleep(0.15)  # the last frames are in flight when turn_done is sent
        done = self._arrivals.get(id(events[-1]), time.monotonic()) + 0.15
        mark = next((e for e in events if e["type"] == "turn_started"), None) or next(
            (e for e in events if e["type"] == "first_audio"), None)
        begin = self._arrivals.get(id(mark), t0) if mark is not None else t0
        frames = [(at, pcm) for at, pcm in self.frames[start:] if begin <= at <= done]
        return measure_turn(turn_id, events, frames, t0)

    async def turn_events(self, turn_id: str, timeout: float = 60.0) -> list[dict]:
        """Events of ``turn_id`` (and events without a turn) up to its ``turn_done``."""
        events = []
        while True:
            event = await self.next_event(timeout=timeout)
            if event.get("turn_id") not in (turn_id, None):
                continue
            events.append(event)
            if event["type"] == "turn_done":
                return events

    async def close(self) -> None:
        """Leave the room."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.wait_for(self.room.disconnect(), 5.0)
