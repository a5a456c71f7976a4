"""Scale-out with LiveKit itself: two server nodes sharing Redis, two ``myna worker``s.

Each worker registers with a different node; dispatch travels on the Redis-backed bus, so
either worker can serve a room hosted on either node. Workers run with capacity 1 (room), so a worker
that serves a room reports load 1 and the server sends new rooms to the other one.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest
import pytest_asyncio

from myna.room.client import RoomClient
from myna.bench.processes import free_port
from tests.e2e.test_serve import SENTENCES
from tests.room.support import Myna, room_name, token

pytestmark = [pytest.mark.network, pytest.mark.asyncio(loop_scope="module")]

AGENT = "myna-scale"


class Worker:
    """A ``myna worker`` of capacity 1 on ``node``, with its health endpoint on a known port."""

    def __init__(self, node):
        self.http_port = free_port()
        self.myna = Myna("worker", "--url", node.url, "--agent-name", AGENT, "--capacity", "1",
                         "--departure-timeout", "0", "--http-port", str(self.http_port))

    async def registered(self) -> str:
        await self.myna.wait_for("registered as agent")
        return self.myna.output().split("myna: worker ", 1)[1].split()[0]

    def load(self) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/worker", timeout=5) as r:
            return float(json.loads(r.read()).get("worker_load", 0.0))


def hosting(node, room: str) -> bool:
    """Whether ``node`` hosts ``room``: its log shows an RTC session starting in it."""
    return any("starting RTC session" in line and f'"room": "{room}"' in line
               for line in node.log_path.read_text(errors="replace").splitlines())


async def dispatched(node, room: str, workers: list[Worker], takers: list[Worker], timeout: float = 12.0) -> None:
    """Create ``room`` on ``node`` with Myna dispatched to it; return once one of ``takers`` (of
    ``workers``) accepted it. A worker that is not a taker and accepts it fails the test.

    livekit-server gives a dispatch one job request of at most 3 s (psrpc's default client
    timeout) and never retries it. On a starved machine (CI: four test processes on two cores)
    the request can expire before any worker answers, and the room never gets Myna. What these
    tests check is which worker takes a room, so a dispatch that no taker heard of is made again
    (``CreateDispatch``); one that a taker heard of and refused fails the test at once.
    """
    from livekit import api

    from myna.bench.livekit_server import DEV_KEY, DEV_SECRET

    async with api.LiveKitAPI(node.http_url, DEV_KEY, DEV_SECRET) as lk:
        await lk.room.create_room(api.CreateRoomRequest(
            name=room, node_id=node.node_id, agents=[api.RoomAgentDispatch(agent_name=AGENT)]))
        for attempt in range(3):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                heard = {w: [line for line in w.myna.output().splitlines() if f"room {room!r}" in line] for w in workers}
                assert not any("accepted" in line for w in workers if w not in takers for line in heard[w]), heard
                assert not any("refused" in line for w in takers for line in heard[w]), heard
                if any("accepted" in line for w in takers for line in heard[w]):
                    return
                await asyncio.sleep(0.1)
            await lk.agent_dispatch.create_dispatch(api.CreateAgentDispatchRequest(agent_name=AGENT, room=room))
    raise AssertionError(f"no dispatch of {room} reached a worker in 3 tries:\n{takers[0].myna.output()[-3000:]}")


async def wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workers(livekit_cluster):
    ws = [Worker(node) for node in livekit_cluster]
    try:
        ids = [await w.registered() for w in ws]
        yield ws, ids
    finally:
        for w in ws:
            w.myna.stop()


async def test_rooms_hosted_on_either_node_are_served(livekit_cluster, workers):
    """A room is created on each node (with Myna dispatched); its participant joins through the
    other node, and Myna, registered with either node, serves it."""
    ws, ids = workers
    for host, entry in ((0, 1), (1, 0)):
        room = room_name()
        await dispatched(livekit_cluster[host], room, ws, ws)
        async with RoomClient(livekit_cluster[entry].url, token(room, "alice")) as client:
            assert client.myna().attributes["myna.worker"] in ids
            result = await client.speak(SENTENCES[host], tokens_per_s=None)
            assert result.perceived_ttfa_ms is not None and result.events[-1]["type"] == "turn_done"
        assert hosting(livekit_cluster[host], room) and not hosting(livekit_cluster[entry], room)


async def test_a_busy_worker_is_skipped_and_a_stopped_worker_leaves_the_other_serving(livekit_cluster, workers):
    ws, ids = workers
    node = livekit_cluster[0]
    # Both workers free, and the servers told so, before the dispatch: a room whose dispatch
    # finds every worker full is never dispatched again ("no servers available"), and the rooms
    # of the test before may still hold a worker for a few seconds after their callers left.
    for w in ws:
        await wait_until(lambda w=w: w.load() == 0.0)
    await asyncio.sleep(4.0)  # workers report their status every 2.5 s
    busy_room = room_name()
    await dispatched(node, busy_room, ws, ws)
    async with RoomClient(node.url, token(busy_room, "alice")) as busy:
        busy_worker = ids.index(busy.myna().attributes["myna.worker"])
        await busy.start_turn(" ".join(SENTENCES * 4), tokens_per_s=None)
        await busy.next_event("first_audio")
        await wait_until(lambda: ws[busy_worker].load() == 1.0)
        await wait_until(lambda: ws[1 - busy_worker].load() == 0.0)  # (the last test's room may still be open)
        await asyncio.sleep(4.0)  # workers report their status every 2.5 s
        other = ids[1 - busy_worker]
        room = room_name()  # the busy worker is full (its room counts) and refuses more: no chance involved
        await dispatched(node, room, ws, [ws[1 - busy_worker]])
        async with RoomClient(node.url, token(room, "bob")) as client:
            assert client.myna().attributes["myna.worker"] == other
        await busy.interrupt()
    # Stop the worker that was busy: the other one takes every new room.
    assert ws[busy_worker].myna.stop() == 0
    remaining = ws[1 - busy_worker]
    for entry in livekit_cluster:
        await wait_until(lambda: remaining.load() == 0.0)
        await asyncio.sleep(4.0)  # its status (not full) has reached the server
        room = room_name()
        await dispatched(entry, room, [remaining], [remaining])
        async with RoomClient(entry.url, token(room, "carol")) as client:
            assert client.myna().attributes["myna.worker"] == other
            result = await client.speak(SENTENCES[1], tokens_per_s=None)
            assert result.perceived_ttfa_ms is not None
