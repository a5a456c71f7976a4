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
