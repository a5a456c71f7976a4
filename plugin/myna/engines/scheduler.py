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
- **Drop.** :meth:`DeadlineScheduler.drop` (barge-in) removes an owner's queued jobs at once;
  their callers see :class:`asyncio.CancelledError`. A running job finishes, unseen.

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


class DeadlineScheduler:
    """Runs blocking jobs on a thread pool, earliest deadline first (see the module docstring).

    Args:
        workers: threads.
        thread_name_prefix: name prefix of the threads.
        niceness: added to each thread's nice value (:func:`lower_thread_priority`), so that
            the event loop's thread wins a core the threads also want.
        horizon_s: a job whose deadline is further than this in the future waits (s).
        clock: monotonic clock in seconds; deadlines are on this clock.
        call_later: ``(delay_s, callback)`` timer used to wake up for a job held by the horizon;
            defaults to the running event loop's ``call_later``.
    """

    def __init__(self, workers: int, thread_name_prefix: str, *, horizon_s: float = HORIZON_S,
                 clock: Callable[[], float] = time.monotonic,
                 call_later: Callable[[float, Callable[[], None]], object] | None = None, niceness: int = 0):
        if workers < 1:
            raise ValueError("a scheduler needs at least one worker thread")
        self.workers = workers
        self.horizon_s = horizon_s
        self._clock = clock
        self._call_later = call_later
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix,
                                        initializer=lower_thread_priority, initargs=(niceness,))
        self._queue: list[_Job] = []  # a heap
        self._seq = itertools.count()
        self._running = 0
        self._timer = None  # pending wake-up for a job held by the horizon
        self._timer_at = float("inf")

    @property
    def queued(self) -> int:
        """Jobs waiting (cancelled ones excluded)."""
        return sum(1 for job in self._queue if not job.future.done())

    async def run(self, fn: Callable, *args, deadline: float | None = None, owner: object = None):
        """Run ``fn(*args)`` on a thread when its turn comes; returns its result.

        Args:
            deadline: when the caller's queued audio runs out (clock s); None means now.
            owner: who the job belongs to, for :meth:`drop` (e.g. a turn's stream).

        Raises:
            asyncio.CancelledError: the job was dropped (or the caller cancelled) before it ran.
            Exception: whatever ``fn`` raised.
        """
        future = asyncio.get_running_loop().create_future()
        deadline = self._clock() if deadline is None else deadline
        heapq.heappush(self._queue, _Job(deadline, next(self._seq), owner, fn, args, future))
        self.dispatch()
        return await future

    def drop(self, owner: object) -> int:
        """Remove every queued job of ``owner`` now (barge-in); returns how many were dropped."""
        mine = [job for job in self._queue if owner is not None and job.owner is owner]
        if mine:
            self._queue = [job for job in self._queue if job.owner is not owner]
            heapq.heapify(self._queue)
        return sum(job.future.cancel() for job in mine)

    def dispatch(self) -> None:
        """Start queued jobs on free threads, earliest deadline first, within the horizon.

        Called on submission, when a job finishes and when a job held by the horizon comes
        within it; calling it at any other time is harmless.
        """
        while self._running < self.workers and self._queue:
            job = self._queue[0]
            if job.future.done():  # dropped, or its caller gave up
                heapq.heappop(self._queue)
                continue
            wait = job.deadline - self.horizon_s - self._clock()
            if wait > 0:
                self._wake_in(wait)
                return
            heapq.heappop(self._queue)
            self._running += 1
            done = asyncio.wrap_future(self._pool.submit(job.fn, *job.args))
            done.add_done_callback(lambda d, future=job.future: self._finished(d, future))

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

    def _finished(self, done: asyncio.Future, future: asyncio.Future) -> None:
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
        for job in self._queue:
            job.future.cancel()
        self._queue.clear()
        if self._timer is not None:
            self._timer.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

