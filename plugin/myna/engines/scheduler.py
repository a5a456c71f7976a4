"""One deadline-ordered scheduler for an engine's synthesis threads, shared by all sessions.

An engine that is not a frame loop (Piper) turns text into audio one job at a time: a unit's
latent, or a chunk of its audio, and a job cannot be preempted once it runs. Which job runs next decides who waits:

- **Deadline.** Every job carries the instant its session's queued audio runs out: the moment the
  listener would hear a gap if the job's audio were not there. A turn's first job has nothing
  queued ahead of it, so its deadline is *now*. Whenever a thread is free it takes the job with
  the earliest deadline (earliest deadline first, EDF), ties in submission order. A session that
  has seconds of audio buffered therefore yields the thread to one whose listener is waiting for
  the first syllable, and gets it back before its own buffer runs dry.
- **Horizon.** A job whose deadline is more than ``horizon_s`` (default 3 s) away waits until it
  is within the horizon, even when a thread is idle: a session far ahead of its playout has
  nothing to gain from more audio, and an idle thread is what a new session's first job needs.
- **Short jobs.** EDF only helps if nothing blocks a thread for long, so engines keep jobs
  short without cutting the text: Piper encodes a unit's latent whole (bounded by the unit's
  length) and decodes its audio in chunks of at most ~0.5 s of speech
  (:mod:`myna.engines.piper`, :mod:`myna.engines.vits`). A waiting urgent job then waits at
  most one chunk per thread.
- **Ahead (background) jobs.** A job submitted with ``ahead`` belongs to a session whose
  consumer keeps whatever it is given and plays none of it through Myna (a file download from
  ``POST /v1/audio/speech``): audio made early is never wasted there, so the horizon does not
  hold it. Within :data:`AHEAD_DUE_S` of its deadline (when the audio made so far would run
  out that soon if it were played) such a job takes a synthesis thread, ordered by its
  deadline like any other (a client that plays the download as it arrives is served as a
  listener would be); before that, it runs as *background* work, on the scheduler's own
  background threads (``background_threads``, at a much lower priority,
  :data:`BACKGROUND_NICENESS`), so a download's early audio never holds a synthesis thread a
  listener's first unit needs:

  - it never starts while a due job waits for a synthesis thread, so background work only
    ever takes what the real-time sessions leave;
  - it never holds a synthesis thread a real-time job could need: the two kinds of work have
    their own threads, and the kernel gives a running background job's core to a synthesis
    thread that wants it (CFS weights: nice 19 gets ~1/7 of a core contended by nice 10), which
    is the preemption a job cannot have here;
  - background jobs go earliest deadline first among themselves (the session whose audio,
    played in real time, would run out soonest);
  - ``ahead`` may be a callable, asked each time the job could start as background work:
    False holds it until it is due or the callable says True again, re-asked every
    :data:`AHEAD_RECHECK_S` meanwhile (a consumer that is not reading fast enough, whose
    queue must not grow without bound).

  A session that is being synthesised ahead and is then starved of background time falls back
  to its deadline: its job becomes due and competes like any other, so a client that plays
  it as it comes is not left without audio.
- **Urgent jobs.** A job whose deadline has come (a turn's first job, or a session whose audio
  has run out) while every synthesis thread runs another job does not wait for one of them to
  finish: it starts on one of the scheduler's *urgent* threads (``urgent_threads``), which run
  at a higher priority than the synthesis threads (:data:`URGENT_NICENESS`), so the kernel
  gives it most of a core the running chunk also wants (CFS weights: nice 5 against nice 10 is
  ~3:1). That is the preemption a running job cannot have: the chunk it shares a core with
  belongs to a session with audio queued, and finishes a little later.
- **Drop.** :meth:`DeadlineScheduler.drop` (barge-in, a closed request) removes an owner's
  queued jobs at once; their callers see :class:`asyncio.CancelledError`. A running job
  finishes, unseen.

All methods are called on the event loop; jobs run on the scheduler's threads.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

#: Default horizon: audio (s) a session may be ahead of its playout before its next job waits.
HORIZON_S = 3.0
#: Nice value added to the background threads (ahead jobs beyond the horizon): the most there
#: is (19), below the synthesis threads' (:data:`myna.engines.piper.SYNTHESIS_NICENESS`).
BACKGROUND_NICENESS = 19
#: How close to its deadline (s) an ahead job must be to take a synthesis thread: until then it
#: is background work, so a download's early audio never holds a thread a listener's first
#: unit needs; within it, it competes by deadline (a client playing the download as it comes).
AHEAD_DUE_S = 0.5
#: How often an ahead job held by its ``ahead`` callable (False) is asked again (s).
AHEAD_RECHECK_S = 0.05
#: Nice value added to the urgent threads (jobs past their deadline while every synthesis
#: thread is busy): above the synthesis threads' priority, below the event loop's.
URGENT_NICENESS = 5


def lower_thread_priority(niceness: int) -> None:
    """Add ``niceness`` to the calling thread's nice value (Linux: a thread's own; elsewhere,
    or where the system refuses, nothing changes). Lowering a priority needs no privilege.

    Why: on a two-core host, synthesis on both cores leaves none to the event loop that paces
    every session's packets; at a lower priority the synthesis threads take what the loop
    leaves (CFS weights: nice 10 gets ~1/10 of a contended core against nice 0)."""
    if niceness <= 0:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    except (AttributeError, OSError):
        pass


@dataclass(order=True)
class _Job:
    deadline: float
    seq: int
    owner: object = field(compare=False)
    fn: Callable = field(compare=False)
    args: tuple = field(compare=False)
    future: asyncio.Future = field(compare=False)
    ahead: bool | Callable[[], bool] = field(compare=False, default=False)

    def may_run_ahead(self) -> bool:
        """May this job run beyond the horizon now (as background work)?"""
        return self.ahead() if callable(self.ahead) else bool(self.ahead)


class DeadlineScheduler:
    """Runs blocking jobs on a thread pool, earliest deadline first (see the module docstring).

    Args:
        workers: synthesis threads (real-time work: every job within the horizon).
        thread_name_prefix: name prefix of the threads.
        niceness: added to each synthesis thread's nice value (:func:`lower_thread_priority`),
            so that the event loop's thread wins a core the threads also want.
        horizon_s: a job whose deadline is further than this in the future waits (s), unless
            it may run ahead (background work, ``ahead`` in :meth:`run`).
        clock: monotonic clock in seconds; deadlines are on this clock.
        call_later: ``(delay_s, callback)`` timer used to wake up for a job held by the horizon;
            defaults to the running event loop's ``call_later``.
        background_threads: threads for ahead jobs beyond the horizon (default: ``workers``);
            0 never runs a job beyond the horizon.
        background_niceness: added to each background thread's nice value (default
            :data:`BACKGROUND_NICENESS`: the lowest priority there is).
        urgent_threads: threads for jobs past their deadline while every synthesis thread is
            busy (default 0: they wait for one).
        urgent_niceness: added to each urgent thread's nice value (default :data:`URGENT_NICENESS`).
    """

    def __init__(self, workers: int, thread_name_prefix: str, *, horizon_s: float = HORIZON_S,
                 clock: Callable[[], float] = time.monotonic,
                 call_later: Callable[[float, Callable[[], None]], object] | None = None, niceness: int = 0,
                 background_threads: int | None = None, background_niceness: int = BACKGROUND_NICENESS,
                 urgent_threads: int = 0, urgent_niceness: int = URGENT_NICENESS):
        if workers < 1:
            raise ValueError("a scheduler needs at least one worker thread")
        self.workers = workers
        self.background_threads = workers if background_threads is None else max(0, background_threads)
        self.horizon_s = horizon_s
        self._clock = clock
        self._call_later = call_later
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix,
                                        initializer=lower_thread_priority, initargs=(niceness,))
        # (threads start only when a job needs one: a worker that never gets a file request has none)
        self._background = ThreadPoolExecutor(max_workers=max(1, self.background_threads),
                                              thread_name_prefix=f"{thread_name_prefix}-bg",
                                              initializer=lower_thread_priority, initargs=(background_niceness,))
        self.urgent_threads = max(0, urgent_threads)
        self._urgent = ThreadPoolExecutor(max_workers=max(1, self.urgent_threads),
                                          thread_name_prefix=f"{thread_name_prefix}-urgent",
                                          initializer=lower_thread_priority, initargs=(urgent_niceness,))
        self._queue: list[_Job] = []  # a heap: jobs the horizon holds
        self._ahead: list[_Job] = []  # a heap: jobs that may run ahead of it
        self._seq = itertools.count()
        self._running = 0  # jobs on the synthesis threads
        self._running_background = 0  # jobs on the background threads
        self._running_urgent = 0  # jobs on the urgent threads
        self._timer = None  # pending wake-up for a job held by the horizon
        self._timer_at = float("inf")
        #: Jobs started beyond the horizon since start-up (ahead jobs run as background work).
        self.background_runs = 0
        #: Jobs started on an urgent thread since start-up.
        self.urgent_runs = 0

    @property
    def queued(self) -> int:
        """Jobs waiting (cancelled ones excluded)."""
        return sum(1 for job in (*self._queue, *self._ahead) if not job.future.done())

    async def run(self, fn: Callable, *args, deadline: float | None = None, owner: object = None,
                  ahead: bool | Callable[[], bool] = False):
        """Run ``fn(*args)`` on a thread when its turn comes; returns its result.

        Args:
            deadline: when the caller's queued audio runs out (clock s); None means now.
            owner: who the job belongs to, for :meth:`drop` (e.g. a turn's stream).
            ahead: the job may run beyond the horizon, as background work (see the module
                docstring): True, or a callable asked each time it could start (False: the
                horizon holds it for now).

        Raises:
            asyncio.CancelledError: the job was dropped (or the caller cancelled) before it ran.
            Exception: whatever ``fn`` raised.
        """
        future = asyncio.get_running_loop().create_future()
        deadline = self._clock() if deadline is None else deadline
        job = _Job(deadline, next(self._seq), owner, fn, args, future, ahead)
        heapq.heappush(self._ahead if ahead else self._queue, job)
        self.dispatch()
        return await future

    def drop(self, owner: object) -> int:
        """Remove every queued job of ``owner`` now (barge-in); returns how many were dropped."""
        if owner is None:
            return 0
        mine = [job for job in (*self._queue, *self._ahead) if job.owner is owner]
        if mine:
            self._queue = [job for job in self._queue if job.owner is not owner]
            self._ahead = [job for job in self._ahead if job.owner is not owner]
            heapq.heapify(self._queue)
            heapq.heapify(self._ahead)
        return sum(job.future.cancel() for job in mine)

    def dispatch(self) -> None:
        """Start queued jobs: on free synthesis threads every *due* job (within the horizon; an
        ahead job within :data:`AHEAD_DUE_S` of its deadline), earliest deadline first; on free
        urgent threads those whose deadline has come; then, when no due job waits, ahead jobs on
        free background threads, earliest deadline first.

        Called on submission, when a job finishes and when a job held by the horizon comes
        within it; calling it at any other time is harmless.
        """
        now = self._clock()
        while self._running < self.workers:
            job = self._earliest_due(now)
            if job is None:
                break
            self._start(job, "synthesis")
        while self._running_urgent < self.urgent_threads:
            job = self._earliest_due(now)
            if job is None or job.deadline > now:
                break
            self._start(job, "urgent")
        if self._earliest_due(now) is not None:
            return  # a due job waits for a synthesis thread: nothing goes before it
        held = False  # an ahead job its callable holds back (asked again soon)
        if self._running_background < self.background_threads and self._ahead:
            started = []
            for job in sorted(self._ahead):
                if self._running_background + len(started) >= self.background_threads:
                    break
                if job.future.done():
                    continue
                if job.may_run_ahead():
                    started.append(job)
                else:
                    held = True
            if started:
                self._ahead = [job for job in self._ahead if job not in started]
                heapq.heapify(self._ahead)
                for job in started:
                    self._start(job, "background")
        due_in = [heap[0].deadline - lead - now for heap, lead in self._heaps_and_leads() if heap]
        if due_in:
            self._wake_in(min(due_in))
        if held:
            self._wake_in(AHEAD_RECHECK_S)

    def _earliest_due(self, now: float) -> _Job | None:
        """The due job with the earliest deadline (ties: the first submitted), either kind; None
        when none is due (see :meth:`dispatch`)."""
        for heap in (self._queue, self._ahead):
            while heap and heap[0].future.done():  # dropped, or its caller gave up
                heapq.heappop(heap)
        due = [heap[0] for heap, lead in self._heaps_and_leads() if heap and heap[0].deadline <= now + lead]
        return min(due) if due else None

    def _heaps_and_leads(self) -> tuple[tuple[list[_Job], float], ...]:
        """Each queue with how long before its jobs' deadlines they are due (s): real-time jobs
        the horizon, ahead jobs :data:`AHEAD_DUE_S`."""
        return (self._queue, self.horizon_s), (self._ahead, AHEAD_DUE_S)

    def _start(self, job: _Job, kind: str) -> None:
        """Run ``job`` on a thread of ``kind``: "synthesis", "urgent" or "background"."""
        if kind == "background":
            self._running_background += 1
            self.background_runs += 1
            pool = self._background
        else:
            heapq.heappop(self._queue if self._queue and self._queue[0] is job else self._ahead)
            if kind == "urgent":
                self._running_urgent += 1
                self.urgent_runs += 1
                pool = self._urgent
            else:
                self._running += 1
                pool = self._pool
        done = asyncio.wrap_future(pool.submit(job.fn, *job.args))
        done.add_done_callback(lambda d, future=job.future: self._finished(d, future, kind))

    def _wake_in(self, delay: float) -> None:
        at = self._clock() + delay
        if self._timer is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        call_later = self._call_later or asyncio.get_running_loop().call_later
        self._timer_at = at
        self._timer = call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        self.dispatch()

    def _finished(self, done: asyncio.Future, future: asyncio.Future, kind: str) -> None:
        if kind == "background":
            self._running_background -= 1
        elif kind == "urgent":
            self._running_urgent -= 1
        else:
            self._running -= 1
        if not future.done():
            if done.cancelled():
                future.cancel()
            elif done.exception() is not None:
                future.set_exception(done.exception())
            else:
                future.set_result(done.result())
        self.dispatch()

    def shutdown(self) -> None:
        """Stop the threads; queued jobs are cancelled, a running one finishes unseen."""
        for job in (*self._queue, *self._ahead):
            job.future.cancel()
        self._queue.clear()
        self._ahead.clear()
        if self._timer is not None:
            self._timer.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._background.shutdown(wait=False, cancel_futures=True)
        self._urgent.shutdown(wait=False, cancel_futures=True)
