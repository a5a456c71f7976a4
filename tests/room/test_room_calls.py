"""Phone callers in a room, against a real livekit-server: the hold while a call rings and the end
of an answered call. The caller here is a participant of kind SIP joined with a token, its
``sip.callStatus`` set as LiveKit's SIP service sets it (``ringing``, then ``active``); the real
service and a real phone are in tests/room/test_phone.py, where the call is answered within
~100 ms of Myna's join and the hold is too short to test.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from livekit import api

from myna.audio.onset import first_audible_sample
from myna.audio.playout import SAMPLE_RATE
from myna.bench.livekit_server import DEV_KEY, DEV_SECRET
from myna.room.client import RoomClient
from myna.room.tokens import participant_token
from tests.room.support import myna_in_room, room_name, token

pytestmark = [pytest.mark.network, pytest.mark.asyncio(loop_scope="module")]

GREETING = "Thanks for calling the corner bakery, how can I help?"


def caller_token(room: str, status: str) -> str:
    """A SIP participant's token, as LiveKit's SIP service joins a caller."""
    return (api.AccessToken(DEV_KEY, DEV_SECRET).with_identity("sip_caller").with_kind("sip")
            .with_attributes({"sip.callStatus": status})
            .with_grants(api.VideoGrants(room_join=True, room=room, can_subscribe=True, can_publish=True,
                                         can_publish_data=True, can_update_own_metadata=True))).to_jwt()


def agent_token(room: str) -> str:
    return participant_token(DEV_KEY, DEV_SECRET, room, "llm", agent=True)


def heard_from(client: RoomClient, since: float) -> float | None:
    """When the first audible sample received after ``since`` (monotonic s) arrived (None: none yet)."""
    frames = [(at, pcm) for at, pcm in client.frames if at >= since]
    if not frames:
        return None
    onset = first_audible_sample(np.concatenate([pcm for _, pcm in frames]), SAMPLE_RATE)
    if onset is None:
        return None
    for at, pcm in frames:
        if onset < len(pcm):
            return at
        onset -= len(pcm)
    return None


async def until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_a_greeting_sent_while_the_phone_rings_waits_for_the_call_and_is_heard_whole(livekit_node, engine):
    room = room_name()
    async with myna_in_room(livekit_node, room, engine, leave_when_empty=True, departure_timeout=30) as myna:
        async with RoomClient(livekit_node.url, caller_token(room, "ringing")) as caller, \
                RoomClient(livekit_node.url, agent_token(room)) as agent:
            assert await until(lambda: not myna.line.is_set(), 5)
            since = time.monotonic()
            turn_id, _, sender = await agent.start_turn(GREETING, tokens_per_s=None)
            await asyncio.sleep(1.0)  # synthesised by now, and held
            assert heard_from(caller, since) is None
            assert not any(e["type"] == "first_audio" for e in agent.history)
            answered = time.monotonic()
            await caller.room.local_participant.set_attributes({"sip.callStatus": "active"})
            events = await agent.turn_events(turn_id, timeout=30)
            await sender
            done = events[-1]
            assert done["type"] == "turn_done" and not done.get("interrupted"), done
            assert await until(lambda: heard_from(caller, since) is not None, 5)
            assert heard_from(caller, since) > answered
            # Its first word first: what was held went out from the start, nothing dropped.
            assert [e["word"] for e in events if e["type"] == "word"][0] == "Thanks"
            assert done["audio_ms"] > 2000
            # The call ends: Myna leaves at once, not after its 30 s grace period.
            hung_up = time.monotonic()
            await caller.close()
            assert await until(lambda: agent.left, 2.0)
            assert time.monotonic() - hung_up < 2.0


async def test_a_call_that_was_never_answered_leaves_myna_its_grace_period(livekit_node, engine):
    """A failed outbound dial, or a caller who gave up while it rang: an agent may dial again."""
    room = room_name()
    async with myna_in_room(livekit_node, room, engine, leave_when_empty=True, departure_timeout=30) as myna:
        async with RoomClient(livekit_node.url, agent_token(room)) as agent:
            async with RoomClient(livekit_node.url, caller_token(room, "dialing")):
                assert await until(lambda: not myna.line.is_set(), 5)
            assert await until(lambda: myna.line.is_set(), 10)  # the departure reached Myna (1–3 s here)
            await asyncio.sleep(1.0)
            assert not agent.left and myna._departure is not None  # the grace period runs


async def test_a_second_call_ringing_does_not_mute_the_one_already_talking(livekit_node, engine):
    """A caller on the line, and the agent dials a second number (a transfer): Myna keeps speaking."""
    room = room_name()
    async with myna_in_room(livekit_node, room, engine, leave_when_empty=True, departure_timeout=30) as myna:
        async with RoomClient(livekit_node.url, caller_token(room, "active")) as caller, \
                RoomClient(livekit_node.url, agent_token(room)) as agent:
            async with RoomClient(livekit_node.url, token(room, "listener")):  # (and a WebRTC listener)
                pass
            second = api.AccessToken(DEV_KEY, DEV_SECRET).with_identity("sip_second").with_kind("sip") \
                .with_attributes({"sip.callStatus": "dialing"}) \
                .with_grants(api.VideoGrants(room_join=True, room=room, can_subscribe=True)).to_jwt()
            async with RoomClient(livekit_node.url, second, myna_identity=myna.room.local_participant.identity):
                assert myna.line.is_set()
                since = time.monotonic()
                result = await agent.speak(GREETING, tokens_per_s=None)
                assert result.events[-1]["type"] == "turn_done" and heard_from(caller, since) is not None
