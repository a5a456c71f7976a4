"""``myna worker``: Myna registered with a LiveKit server, joining the rooms it is dispatched to.

This is livekit-agents' worker machinery (``AgentServer``) with a job entry point of our own and
no ``AgentSession``: the worker registers at ``<url>/agent`` under an agent name; the server
sends it a job for each dispatch (explicit: the dispatch API, a token's
``RoomConfiguration.agents``, or ``CreateRoom(agents=…)``; a named agent is never dispatched
automatically). :meth:`RoomWorker.entrypoint` joins the room with the server-minted token and
serves it with a :class:`~myna.room.agent.RoomAgent` until no one but agents has been left for
the departure timeout (a listener who reloads the page finds Myna still there).

- **Capacity.** The worker counts the rooms it has accepted (from its answer to the job request
  until it leaves the room) against its capacity (``--capacity``; by default the engine's
  capacity measured at start-up, as ``myna serve`` measures ``--max-sessions``) and refuses job
  requests beyond it, and while it drains (:meth:`RoomWorker.request`): the server offers the
  job to another worker.
- **Load.** :meth:`RoomWorker.load` is started rooms ÷ capacity (livekit-agents adds the rooms
  accepted but not started yet). The worker reports it every 2.5 s; the server picks a worker at random weighted by ``1 − load`` and skips a worker at
  capacity (load 1: the worker also marks itself full), so new rooms go to the less loaded
  worker; requests that come faster than the reports meet the count above.
- **One Myna per room.** A second dispatch of this agent to a room (one more ``CreateDispatch``)
  is refused by a worker that serves the room already; one that reaches another worker is
  accepted, and its Myna steps aside at once (:class:`~myna.room.agent.RoomAgent`): it leaves
  without answering anything.
- **One engine, many rooms.** Jobs run as threads of this process (``JobExecutorType.THREAD``),
  each room on its own event loop; they share the loaded engines through
  :class:`~myna.room.bridge.BridgedEngine`, and one :class:`~myna.sessions.Sessions` (the same
  limits as ``myna serve``).
- **Per-room settings.** A dispatch's metadata may be a JSON object with the turn defaults of
  the offer's ``request_data`` — ``voice``, ``speed``, ``lexicon``, ``normalise``
  (:func:`dispatch_defaults`); other keys are ignored. Unusable metadata is logged and each
  participant gets one ``error`` after ``ready``; the room speaks with the process's defaults.
- **Drain.** :meth:`RoomWorker.drain` (``myna worker`` on SIGTERM): the server is told the
  worker drains (new dispatches go to other workers), sessions refuse new turns and the turns
  speaking finish, up to ``--drain-timeout``; then every room is left. Myna leaves the rooms
  itself, so livekit-agents' own shutdown bounds (15 s for a job's entry point once the job is
  asked to shut down; ``shutdown_process_timeout``) only start after the drain, and the
  framework's ``drain_timeout`` and ``shutdown_process_timeout`` are set beyond it
  (:func:`agent_server`).
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
import json
import logging
import math
import os
import threading
from dataclasses import dataclass, field

from livekit.agents import AgentServer, AutoSubscribe, JobContext, JobExecutorType, JobRequest

from myna.engines.build import Engines
from myna.events import Error
from myna.messages import BadMessage, TurnDefaults, parse_turn_defaults, quote_input
from myna.room.agent import DEPARTURE_TIMEOUT, RoomAgent
from myna.room.bridge import BridgedEngine
from myna.sessions import Sessions

log = logging.getLogger(__name__)

DEFAULT_AGENT_NAME = "myna"
#: Participant attribute naming the worker that serves the room (its LiveKit worker id).
WORKER_ATTRIBUTE = "myna.worker"
#: Job threads livekit-agents keeps started ahead of dispatches (at most; see :func:`agent_server`).
MAX_IDLE_JOB_THREADS = 8
#: livekit-agents' loop-block monitor threshold (ms; "0" turns the monitor off).
LOOP_MONITOR_ENV = "LIVEKIT_AGENTS_LOOP_BLOCK_WARN_MS"


@dataclass(eq=False)
class RoomWorker:
    """The rooms one ``myna worker`` serves, and its load.

    Args:
        engines: the started engines; every room speaks with the default one.
        capacity: rooms the worker takes at once (it refuses job requests beyond them).
        sessions: the process's sessions (limits, metrics, drain).
        speak_for: identities allowed to speak through Myna (None: everyone).
        departure_timeout: seconds Myna stays in a room after the last participant other than
            agents left (0: it leaves at once).
    """

    engines: Engines
    capacity: int
    sessions: Sessions = field(default_factory=Sessions)
    speak_for: frozenset[str] | None = None
    departure_timeout: float = DEPARTURE_TIMEOUT
    agents: dict[RoomAgent, asyncio.AbstractEventLoop] = field(default_factory=dict)  # each room and its job's loop

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError("capacity must be at least 1 room")
        self._home = asyncio.get_running_loop()
        self._bridged = BridgedEngine(self.engines[self.engines.default], self._home)
        self._lock = threading.Lock()  # requests arrive on the home loop, rooms end on job threads
        self._accepted: set[str] = set()  # ids of the jobs accepted and not yet ended
        self._rooms: dict[str, str] = {}  # job id → room name, of those jobs
        self._started: set[str] = set()  # ids of the accepted jobs whose entry point runs
        self.refused = 0  # job requests refused (at capacity or draining)

    @property
    def accepted(self) -> int:
        """Rooms accepted and not yet left."""
        with self._lock:
            return len(self._accepted)

    def load(self) -> float:
        """Rooms whose job has started ÷ capacity, at most 1 (called from livekit-agents' thread
        pool). Rooms accepted but not yet started are left out: livekit-agents adds its own
        reserved slots for those (1 ÷ capacity each once a job runs), and counting them twice
        would refuse requests within capacity in a burst."""
        with self._lock:
            return min(1.0, len(self._started) / self.capacity)

    async def request(self, req: JobRequest) -> None:
        """Answer one job request: accept it while fewer than ``capacity`` rooms are accepted and
        the worker does not drain, else refuse it (the server offers it to another worker)."""
        with self._lock:
            served = req.room.name in self._rooms.values()
            full = self.sessions.draining or len(self._accepted) >= self.capacity
            if not (full or served):
                self._accepted.add(req.id)
                self._rooms[req.id] = req.room.name
            held = len(self._accepted)
        if served:
            self.refused += 1
            log.info("refused room %r: this worker serves it already (one Myna per room)", req.room.name)
            await req.reject(terminate=False)
            return
        if full:
            self.refused += 1
            log.info("refused room %r: %s (%d of %d rooms)", req.room.name,
                     "draining" if self.sessions.draining else "at capacity", held, self.capacity)
            await req.reject(terminate=False)
            return
        log.info("accepted room %r (%d of %d rooms)", req.room.name, held, self.capacity)
        try:
            await req.accept()
        except BaseException:  # the assignment never came: the room was never ours
            self._release(req.id)
            raise

    def _release(self, job_id: str) -> None:
        with self._lock:
            self._accepted.discard(job_id)
            self._rooms.pop(job_id, None)
            self._started.discard(job_id)

    async def entrypoint(self, ctx: JobContext) -> None:
        """One dispatched room (runs on the job's own thread and loop)."""
        with self._lock:
            self._started.add(ctx.job.id)
        try:
            defaults = TurnDefaults(voice=self.engines.voice_for(self.engines.default))
            notice = None
            try:
                defaults = dispatch_defaults(ctx.job.metadata, defaults, self._bridged.voices)
            except BadMessage as exc:
                log.warning("room %r: dispatch metadata: %s", ctx.room.name, exc.message)
                notice = Error(code=exc.code, message=f"dispatch metadata: {exc.message}; the room speaks with "
                                                      "the worker's defaults")
            agent = RoomAgent(ctx.room, self._bridged, self.sessions, engines=list(self.engines), defaults=defaults,
                              speak_for=self.speak_for, leave_when_empty=True,
                              attributes={WORKER_ATTRIBUTE: ctx.worker_id},
                              departure_timeout=self.departure_timeout, notice=notice)
            agent.attach()
            await ctx.connect(auto_subscribe=AutoSubscribe.SUBSCRIBE_NONE)
            await agent.start()
            self.agents[agent] = asyncio.get_running_loop()
            try:
                await agent.run()
            finally:
                self.agents.pop(agent, None)
        finally:
            self._release(ctx.job.id)
            ctx.shutdown("room served")

    async def drain(self, server: AgentServer, timeout: float) -> bool:
        """Drain (see the module docstring): returns True when every speaking turn finished
        within ``timeout`` s. Every room is left afterwards."""
        draining = asyncio.ensure_future(server.drain(timeout=None))  # the server dispatches elsewhere
        finished = await self.sessions.drain(timeout)
        for agent, loop in list(self.agents.items()):
            loop.call_soon_threadsafe(agent.stop)  # (each room lives on its job's own loop)
        try:
            await asyncio.wait_for(draining, 10.0)
        except asyncio.TimeoutError:
            log.warning("rooms still open 10 s after the drain; closing them")
        return finished


def _start_rtc_runtime() -> None:
    """Start livekit's native runtime (``FfiClient.instance``) here, before any job thread.

    Its first use otherwise happens in the first rooms' ``connect``, on their job threads at
    once, and the singleton is not created under a lock: two threads could each make one, a
    room subscribed to the one that lost never got its connect callback, and 15 s later the
    runtime signals the process, which drains the whole worker (3 of 9 runs of two rooms
    dispatched together, livekit 1.1.21). livekit-agents preloads the library but leaves the
    runtime to the first job, since in its process mode the runtime must start after fork;
    here jobs are threads of this process."""
    from livekit.rtc._ffi_client import FfiClient

    FfiClient.instance  # noqa: B018 (the property creates it)


def agent_server(worker: RoomWorker, url: str, key: str, secret: str, agent_name: str = DEFAULT_AGENT_NAME,
                 http_port: int = 0, max_retry: int = 16, drain_timeout: float = 30.0) -> AgentServer:
    """livekit-agents' ``AgentServer`` for ``worker``, registering as ``agent_name``.

    Its health endpoint (``GET /``, ``GET /worker``) binds 127.0.0.1 on ``http_port``
    (0: any free port). Job loops run without livekit-agents' loop-block monitor unless
    :data:`LOOP_MONITOR_ENV` is set (see the module docstring, "CPU"). Job requests go to
    :meth:`RoomWorker.request`; the framework's drain and shutdown bounds are set beyond
    ``drain_timeout`` (s) so that they never cut Myna's drain short (module docstring, "Drain").
    """
    os.environ.setdefault(LOOP_MONITOR_ENV, "0")  # read by each job thread as it starts
    _start_rtc_runtime()
    server = AgentServer(
        ws_url=url, api_key=key, api_secret=secret,
        job_executor_type=JobExecutorType.THREAD,
        load_fnc=worker.load, load_threshold=1.0,
        # livekit-agents reserves 1 / num_idle_processes of its load threshold per accepted job
        # while none has started yet: one idle job thread per room of capacity (up to 8) lets a
        # burst of dispatches up to capacity through (with 2, a third at once was refused).
        num_idle_processes=min(worker.capacity, MAX_IDLE_JOB_THREADS),
        host="127.0.0.1", port=http_port, max_retry=max_retry,
        drain_timeout=math.ceil(drain_timeout) + 30, shutdown_process_timeout=drain_timeout + 15.0,
    )
    server.rtc_session(worker.entrypoint, agent_name=agent_name, on_request=worker.request)
    return server


def dispatch_defaults(metadata: str, base: TurnDefaults, voices) -> TurnDefaults:
    """The turn defaults a dispatch's metadata asks for, over ``base`` (the module docstring).

    Args:
        metadata: the job's metadata as the server hands it ("" when the dispatch set none).
        base: the worker's defaults.
        voices: the voice names of the worker's engine.

    Raises:
        BadMessage: ``bad_config`` (not a JSON object, a field of the wrong type),
            ``unknown_voice``, ``bad_speed``, ``bad_lexicon``.
    """
    if not metadata.strip():
        return base
    try:
        obj = json.loads(metadata)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise BadMessage("bad_config", "not a JSON object")
    defaults = parse_turn_defaults(obj, base)
    if obj.get("voice") is not None and defaults.voice not in voices:
        raise BadMessage("unknown_voice", f"no voice {quote_input(defaults.voice)}; available: {', '.join(voices)}")
    return defaults
