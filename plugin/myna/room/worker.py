"""``myna worker``: Myna registered with a LiveKit server, joining the rooms it is dispatched to.

This is livekit-agents' worker machinery (``AgentServer``) with a job entry point of our own and
no ``AgentSession``: the worker registers at ``<url>/agent`` under an agent name; the server
sends it a job for each dispatch (explicit: the dispatch API, a token's
``RoomConfiguration.agents``, or ``CreateRoom(agents=…)``; a named agent is never dispatched
automatically). :meth:`RoomWorker.entrypoint` joins the room with the server-minted token and
serves it with a :class:`~myna.room.agent.RoomAgent` until no one but agents is left.

- **Load.** :meth:`RoomWorker.load` is speaking sessions ÷ capacity (a session speaks while one
  of its turns is queued or playing). The worker reports it every 2.5 s; the server picks a
  worker at random weighted by ``1 − load`` and skips a worker at capacity (load 1: the
  worker also marks itself full), so new rooms go to the less loaded worker.
- **One engine, many rooms.** Jobs run as threads of this process (``JobExecutorType.THREAD``),
  each room on its own event loop; they share the one loaded engine through
  :class:`~myna.room.bridge.BridgedEngine`.
- **CPU.** livekit-agents watches every job's event loop for blocking (a 20 ms heartbeat on the
  loop and a watchdog thread per room); that costs ~5 ms of CPU per second per room, about a
  sixth of a silent room's cost, so :func:`agent_server` turns it off unless
  ``LIVEKIT_AGENTS_LOOP_BLOCK_WARN_MS`` is set (a value in ms turns it back on).
- **Failures.** A room that closes, or a server that dies, ends that room's job cleanly. The
  worker itself reconnects to the server (livekit-agents: up to ``max_retry`` attempts, 0–10 s
  apart) and exits with status 1 once they are spent. Jobs of a worker that stops are not
  handed to another worker (self-hosted LiveKit does not re-dispatch); new dispatches go to
  the workers still registered.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field

from livekit.agents import AgentServer, AutoSubscribe, JobContext, JobExecutorType

from myna.engines import Engine
from myna.metrics import Metrics
from myna.room.agent import RoomAgent
from myna.room.bridge import BridgedEngine

log = logging.getLogger(__name__)

DEFAULT_AGENT_NAME = "myna"
#: Participant attribute naming the worker that serves the room (its LiveKit worker id).
WORKER_ATTRIBUTE = "myna.worker"
#: livekit-agents' loop-block monitor threshold (ms; "0" turns the monitor off).
LOOP_MONITOR_ENV = "LIVEKIT_AGENTS_LOOP_BLOCK_WARN_MS"


@dataclass(eq=False)
class RoomWorker:
    """The rooms one ``myna worker`` serves, and its load.

    Args:
        engine: the started engine every room speaks with.
        capacity: speaking sessions the worker takes before it reports itself full.
        metrics: the process's metrics.
        voice: voice name (None: the engine's default).
        speak_for: identities allowed to speak through Myna (None: everyone).
    """

    engine: Engine
    capacity: int
    metrics: Metrics = field(default_factory=Metrics)
    voice: str | None = None
    speak_for: frozenset[str] | None = None
    agents: set[RoomAgent] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError("capacity must be at least 1 speaking session")
        self._bridged = BridgedEngine(self.engine, asyncio.get_running_loop())

    def load(self) -> float:
        """Speaking sessions ÷ capacity, at most 1 (called from livekit-agents' thread pool)."""
        speaking = sum(1 for agent in list(self.agents) if agent.router is not None and agent.router.speaking())
        return min(1.0, speaking / self.capacity)

    async def entrypoint(self, ctx: JobContext) -> None:
        """One dispatched room (runs on the job's own thread and loop)."""
        agent = RoomAgent(ctx.room, self._bridged, self.metrics, voice=self.voice, speak_for=self.speak_for,
                          leave_when_empty=True, attributes={WORKER_ATTRIBUTE: ctx.worker_id})
        agent.attach()
        await ctx.connect(auto_subscribe=AutoSubscribe.SUBSCRIBE_NONE)
        await agent.start()
        self.agents.add(agent)
        try:
            await agent.run()
        finally:
            self.agents.discard(agent)
            ctx.shutdown("room served")


def agent_server(worker: RoomWorker, url: str, key: str, secret: str, agent_name: str = DEFAULT_AGENT_NAME,
                 http_port: int = 0, max_retry: int = 16) -> AgentServer:
    """livekit-agents' ``AgentServer`` for ``worker``, registering as ``agent_name``.

    Its health endpoint (``GET /``, ``GET /worker``) binds 127.0.0.1 on ``http_port``
    (0: any free port). Job loops run without livekit-agents' loop-block monitor unless
    :data:`LOOP_MONITOR_ENV` is set (see the module docstring, "CPU").
    """
    os.environ.setdefault(LOOP_MONITOR_ENV, "0")  # read by each job thread as it starts
    server = AgentServer(
        ws_url=url, api_key=key, api_secret=secret,
        job_executor_type=JobExecutorType.THREAD,
        load_fnc=worker.load, load_threshold=1.0,
        num_idle_processes=2,
        host="127.0.0.1", port=http_port, max_retry=max_retry,
    )
    server.rtc_session(worker.entrypoint, agent_name=agent_name)
    return server
