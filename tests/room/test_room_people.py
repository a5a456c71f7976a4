"""Rooms as people use them, against a real livekit-server: several speakers at
once, a listener who drops and comes back, two Mynas dispatched to one room, a full reconnect,
a text stream that never closes, shutdown mid-turn, and a worker offered more rooms than it takes.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request

import pytest
from livekit import api

from myna.bench.livekit_server import DEV_KEY, DEV_SECRET
from myna.bench.processes import free_port
from myna.room.client import RoomClient
from tests.e2e.test_serve import SENTENCES
from myna.limits import Limits
from myna.sessions import Sessions
from tests.room.support import Myna, myna_in_room, room_name, token

pytestmark = [pytest.mark.network, pytest.mark.asyncio(loop_scope="module")]


async def test_sigterm_mid_turn_drains_past_the_frameworks_shutdown_timeout(livekit_node):
    """livekit-agents gives a job's entry point 15 s once the job is asked to shut down; a turn
    longer than that still finishes within --drain-timeout, and the log says so."""
    worker = Myna("worker", "--url", livekit_node.url, "--agent-name", "myna-long-drain", "--drain-timeout", "40")
    try:
        await worker.wait_for("registered as agent 'myna-long-drain'")
        room = room_name()
        async with RoomClient(livekit_node.url, token(room, "alice", agent_dispatch="myna-long-drain")) as client:
            turn_id, _, sender = await client.start_turn(" ".join(SENTENCES + SENTENCES[:2]), tokens_per_s=None)
            await client.next_event("first_audio", timeout=60)
            t_signal = time.monotonic()
            worker.proc.send_signal(signal.SIGTERM)
            events = await client.turn_events(turn_id, timeout=90)
            await sender
            drained_s = time.monotonic() - t_signal
        done = events[-1]
        assert done["type"] == "turn_done" and not done.get("interrupted") and done["audio_ms"] > 20000, done
        assert drained_s > 16.0  # past livekit-agents' 15 s
        assert await worker.exit_code(timeout=60) == 0
        log = worker.output()
        assert "draining: 1 session(s) speaking in 1 room(s), up to 40 s" in log and "drained: every turn finished" in log, log[-3000:]
    finally:
        worker.stop()


def spoken(client: RoomClient, turn_id: str) -> list[str]:
    return [e["word"] for e in client.history if e.get("turn_id") == turn_id and e["type"] == "word"]


async def test_two_senders_at_once_each_turn_is_spoken_whole_in_the_order_it_began(livekit_node, engine):
    """A streams an 8-word reply; B starts one 150 ms later. Before: B's first chunk ended A's
    turn (A's later chunks refused turn_ended, 3 of 8 words spoken)."""
    room = room_name()
    async with myna_in_room(livekit_node, room, engine) as agent:
        async with RoomClient(livekit_node.url, token(room, "alice")) as a, \
                RoomClient(livekit_node.url, token(room, "bob")) as b:
            turn_a, _, sending_a = await a.start_turn("Our train leaves at seven, so pack tonight.", tokens_per_s=10)
            await asyncio.sleep(0.15)
            turn_b, _, sending_b = await b.start_turn("Thank you for calling today.", tokens_per_s=10)
            done_a = (await a.turn_events(turn_a))[-1]
            done_b = (await b.turn_events(turn_b))[-1]
            await asyncio.gather(sending_a, sending_b)
            await captions_final(a, 2)
            track = agent.publication.sid
    for client in (a, b):
        assert not [e for e in client.history if e["type"] == "error"], client.history
    assert not done_a.get("interrupted") and not done_b.get("interrupted")
    assert len(spoken(a, turn_a)) == 8 and len(spoken(b, turn_b)) == 5, (spoken(a, turn_a), spoken(b, turn_b))
    # One track, so the turns queue: A's turn (first chunk first) plays out before B's is
    # heard: B's first audio comes at least A's audio after B's first chunk.
    first_b = next(e for e in b.history if e["type"] == "first_audio")
    assert first_b["server_ttfa_ms"] > done_a["audio_ms"] - 650, (first_b, done_a)
    assert a.caption(turn_a).text.split() == spoken(a, turn_a) and b.caption(turn_b).text.split() == spoken(b, turn_b)
    assert all(s.track_id == track for s in a.segments.values())


async def captions_final(client: RoomClient, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not (len(client.segments) == count and all(s.final for s in client.segments.values())):
        assert time.monotonic() < deadline, client.segments
        await asyncio.sleep(0.05)


async def test_caption_segment_ids_are_unique_in_the_room_when_senders_share_turn_ids(livekit_node, engine):
    """Two senders both call their turn "1" (contract messages on topic myna). Before: both
    captions had lk.segment_id "1", and front-ends showed one replacing the other."""
    room = room_name()
    async with myna_in_room(livekit_node, room, engine):
        async with RoomClient(livekit_node.url, token(room, "alice")) as a, \
                RoomClient(livekit_node.url, token(room, "bob")) as b:
            for client, text in ((a, "Good morning."), (b, "Good night.")):
                await client.send({"type": "text", "turn_id": "1", "text": text})
                await client.send({"type": "end_turn", "turn_id": "1"})
            await a.turn_events("1")
            await b.turn_events("1")
            await captions_final(a, 2)
            await captions_final(b, 2)
    ids = [s.segment_id for s in a.segments.values()]
    assert len(set(ids)) == 2 and "1" not in ids and all(i.startswith("SG_") for i in ids), ids
    assert set(b.segments) == set(a.segments)  # every participant sees the same two segments
    assert a.caption("1").text.split() == ["Good", "morning"] and b.caption("1").text.split() == ["Good", "night"]


async def test_a_text_stream_that_never_closes_ends_after_the_idle_bound_and_the_room_is_idle_again(livekit_node, engine):
    """The sender writes one chunk and never closes its stream (crashed, trailer lost). Before:
    no turn_done ever, and the room counted as speaking forever."""
    room = room_name()
    sessions = Sessions(limits=Limits(turn_idle_s=1.0))
    async with myna_in_room(livekit_node, room, engine, sessions=sessions) as agent:
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            writer = await client.room.local_participant.stream_text(
                topic="myna.text", stream_id="open", destination_identities=[client.myna().identity])
            await writer.write("This stream is never closed")
            t0 = time.monotonic()
            events = await client.turn_events("open", timeout=30)
            waited = time.monotonic() - t0
            idle = [e for e in events if e["type"] == "error"]
            assert idle and idle[0]["code"] == "turn_idle" and idle[0]["turn_id"] == "open", events
            done = events[-1]
            assert done["type"] == "turn_done" and not done.get("interrupted"), done
            assert [e["word"] for e in events if e["type"] == "word"] == ["This", "stream", "is", "never", "closed"]
            assert 1.0 <= waited < 15.0
            assert not agent.router.speaking() and sessions.speaking() == 0
            # The room goes on: a chunk on the stale stream is refused, a new turn speaks.
            await writer.write(" more")
            refused = await client.next_event("error")
            assert refused["code"] == "turn_ended" and refused["turn_id"] == "open"
            result = await client.speak("Hello again.", tokens_per_s=None)
            assert result.events[-1]["type"] == "turn_done"


async def eventually(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_a_listener_who_drops_and_returns_finds_myna_there_until_the_grace_period_ends(livekit_node, engine):
    """The only listener leaves (a page reload) and comes back. Before: Myna left the moment it
    saw the room empty, and nothing brought it back."""
    room = room_name()
    async with myna_in_room(livekit_node, room, engine, leave_when_empty=True, departure_timeout=4.0) as agent:
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            assert (await client.speak("Hello.", tokens_per_s=None)).events[-1]["type"] == "turn_done"
        await eventually(lambda: not agent.others())  # Myna has seen the leave (LiveKit: within 3 s)
        await asyncio.sleep(1.5)
        assert agent.room.isconnected()
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:  # the same identity, reloaded
            result = await client.speak("Welcome back.", tokens_per_s=None)
            assert result.events[-1]["type"] == "turn_done" and result.perceived_ttfa_ms is not None
        await eventually(lambda: not agent.others())
        seen_empty = time.monotonic()
        await eventually(lambda: not agent.room.isconnected())
        assert 3.5 <= time.monotonic() - seen_empty <= 8.0


async def test_a_full_reconnect_republishes_the_track_and_captions_name_the_new_one(livekit_node, engine):
    """Before: after a full reconnect captions went on naming the old track SID."""
    from livekit import rtc

    room = room_name()
    async with myna_in_room(livekit_node, room, engine) as agent:
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            old = agent.publication.sid
            await agent.room.simulate_scenario(rtc.SimulateScenarioKind.SIMULATE_FULL_RECONNECT)
            await eventually(lambda: agent.publication.sid != old and client.track_sid == agent.publication.sid, timeout=30)
            result = await client.speak("Still here after the reconnect.", tokens_per_s=None)
            assert result.events[-1]["type"] == "turn_done" and result.perceived_ttfa_ms is not None
            await eventually(lambda: len(client.segments) == 1 and all(s.final for s in client.segments.values()))
            assert [s.track_id for s in client.segments.values()] == [client.track_sid] and client.track_sid != old


async def agents_in(node, room: str) -> list[str]:
    async with api.LiveKitAPI(node.http_url, DEV_KEY, DEV_SECRET) as lk:
        try:
            answer = await lk.room.list_participants(api.ListParticipantsRequest(room=room))
        except api.TwirpError:
            return []
        return [p.identity for p in answer.participants if p.kind == api.ParticipantInfo.Kind.AGENT]


async def test_two_dispatches_to_one_room_one_myna_answers_and_the_other_steps_aside(livekit_node):
    """Each CreateDispatch adds an agent. Before: both Mynas joined and spoke every turn. Now the
    worker refuses a second job for a room it serves."""
    worker = Myna("worker", "--url", livekit_node.url, "--agent-name", "myna-dup", "--capacity", "4",
                  "--departure-timeout", "0")
    try:
        await worker.wait_for("registered as agent 'myna-dup'")
        room = room_name()
        async with api.LiveKitAPI(livekit_node.http_url, DEV_KEY, DEV_SECRET) as lk:
            await asyncio.gather(*(lk.agent_dispatch.create_dispatch(
                api.CreateAgentDispatchRequest(agent_name="myna-dup", room=room)) for _ in range(2)))
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            await worker.wait_for("serves it already", timeout=30)
            await answered_once(livekit_node, room, client)
    finally:
        assert worker.stop() == 0


async def answered_once(node, room: str, client: RoomClient) -> None:
    """One Myna is left in ``room``, and a turn streamed to everyone gets one answer."""
    deadline = time.monotonic() + 15
    while len(await agents_in(node, room)) != 1:
        assert time.monotonic() < deadline, await agents_in(node, room)
        await asyncio.sleep(0.2)
    writer = await client.room.local_participant.stream_text(topic="myna.text")  # to everyone
    await writer.write("Just one voice.")
    await writer.aclose()
    events = await client.turn_events(writer.info.stream_id)
    assert events[-1]["type"] == "turn_done"
    await asyncio.sleep(1.0)
    kinds = [e["type"] for e in client.history]
    assert kinds.count("turn_started") == 1 and kinds.count("ready") == 1, client.history


async def test_two_mynas_joining_one_room_at_once_the_first_serves_it(livekit_node, engine):
    """Two Mynas (agents of one name, e.g. on two workers) join one room at the same moment: the
    one that joined first serves it, the other steps aside, whatever order they saw each other in."""
    from livekit import rtc

    from myna.room.agent import RoomAgent
    from myna.room.tokens import participant_token

    room = room_name()
    agents = [RoomAgent(rtc.Room(), engine, Sessions(), leave_when_empty=False) for _ in range(2)]

    async def join(agent: RoomAgent, identity: str) -> None:
        agent.attach()
        await agent.room.connect(livekit_node.url, participant_token(DEV_KEY, DEV_SECRET, room, identity, agent=True))
        await agent.start()

    await asyncio.gather(join(agents[0], "myna-a"), join(agents[1], "myna-b"))
    runs = [asyncio.get_running_loop().create_task(a.run()) for a in agents]
    try:
        await eventually(lambda: sum(a.stepped_aside is not None for a in agents) == 1)
        serving = next(a for a in agents if a.stepped_aside is None)
        aside = next(a for a in agents if a.stepped_aside is not None)
        assert aside.stepped_aside == serving.room.local_participant.identity
        assert serving.room.local_participant.joined_at <= aside.room.local_participant.joined_at
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            await answered_once(livekit_node, room, client)
        assert serving.room.isconnected() and not aside.room.isconnected()
    finally:
        for a in agents:
            a.stop()
        await asyncio.gather(*runs)


async def test_a_worker_takes_rooms_up_to_its_capacity_and_the_rest_go_to_another(livekit_node):
    """Two workers of capacity 3, eight rooms dispatched at once, no one speaking yet: each takes
    three (a burst up to capacity gets through), the other two are refused. Before: a worker took
    every room it was offered (its load counted speaking sessions: none yet)."""
    ports = [free_port() for _ in range(2)]
    workers = [Myna("worker", "--url", livekit_node.url, "--agent-name", "myna-cap", "--capacity", "3",
                    "--departure-timeout", "0", "--http-port", str(port)) for port in ports]
    rooms = [room_name() for _ in range(8)]
    try:
        for w in workers:
            await w.wait_for("registered as agent 'myna-cap' at", timeout=90)
        async with api.LiveKitAPI(livekit_node.http_url, DEV_KEY, DEV_SECRET) as lk:
            await asyncio.gather(*(lk.agent_dispatch.create_dispatch(
                api.CreateAgentDispatchRequest(agent_name="myna-cap", room=room)) for room in rooms))

            async def served() -> list[int]:
                return [len(await agents_in(livekit_node, room)) for room in rooms]

            deadline = time.monotonic() + 30
            while sum(await served()) < 6:
                assert time.monotonic() < deadline, await served()
                await asyncio.sleep(0.3)
            await asyncio.sleep(3.0)  # (a seventh would have joined by now)
            assert sorted(await served()) == [0, 0, 1, 1, 1, 1, 1, 1], await served()
            assert [w.output().count("accepted room") for w in workers] == [3, 3]
            assert [worker_load(port) for port in ports] == [1.0, 1.0]  # accepted rooms ÷ capacity, silent or not
            for room in rooms:
                await lk.room.delete_room(api.DeleteRoomRequest(room=room))
    finally:
        for w in workers:
            w.stop()  # (exit status not asserted: see the closing note on the SDK's concurrent joins)


def worker_load(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/worker", timeout=5) as r:
        return float(json.loads(r.read()).get("worker_load", 0.0))
