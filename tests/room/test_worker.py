"""``myna worker``'s AgentServer settings that need no server."""

from __future__ import annotations

import asyncio

from livekit.agents.telemetry import loop_monitor

from myna.engines.build import Engines
from myna.room.worker import LOOP_MONITOR_ENV, RoomWorker, agent_server
from tests.room.test_bridge import LoopBound


def _job_loop_is_monitored() -> bool:
    """Start a job loop the way livekit-agents' job threads do; is a block monitor attached?"""
    loop = asyncio.new_event_loop()
    try:
        monitor = loop_monitor.start_monitoring(loop, name="job")
        if monitor is None:
            return False
        loop_monitor.stop_monitoring(loop)
        return True
    finally:
        loop.close()


async def test_job_loops_run_without_the_block_monitor_unless_asked_for(monkeypatch):
    monkeypatch.delenv(LOOP_MONITOR_ENV, raising=False)
    agent_server(RoomWorker(Engines({"loop-bound": LoopBound()}), capacity=1), "ws://127.0.0.1:9", "key", "secret")
    assert not _job_loop_is_monitored()

    monkeypatch.setenv(LOOP_MONITOR_ENV, "200")  # the operator's choice is kept
    agent_server(RoomWorker(Engines({"loop-bound": LoopBound()}), capacity=1), "ws://127.0.0.1:9", "key", "secret")
    assert _job_loop_is_monitored()


class FakeRequest:
    """The part of livekit-agents' JobRequest that RoomWorker.request uses."""

    def __init__(self, job_id: str, room: str):
        from types import SimpleNamespace

        self.id, self.room, self.answer = job_id, SimpleNamespace(name=room, sid=""), None

    async def accept(self, **_):
        self.answer = "accepted"

    async def reject(self, terminate: bool = True):
        self.answer = "refused"


async def test_requests_beyond_capacity_for_a_served_room_or_while_draining_are_refused():
    worker = RoomWorker(Engines({"loop-bound": LoopBound()}), capacity=2)
    answers = []
    for job, room in (("j1", "a"), ("j2", "a"), ("j3", "b"), ("j4", "c")):
        req = FakeRequest(job, room)
        await worker.request(req)
        answers.append(req.answer)
    assert answers == ["accepted", "refused", "accepted", "refused"]  # one Myna per room; capacity 2
    assert worker.accepted == 2 and worker.refused == 2
    worker._release("j1")  # the room's job ended
    req = FakeRequest("j5", "c")
    await worker.request(req)
    assert req.answer == "accepted" and worker.accepted == 2
    worker._release("j3")
    await worker.sessions.drain(0.0)
    req = FakeRequest("j6", "d")
    await worker.request(req)
    assert req.answer == "refused" and worker.accepted == 1
