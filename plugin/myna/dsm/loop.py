"""The DSM frame loop (dsm-inference §2.4–2.5, §5): one thread owns the model, its caches and the
device, and steps every live session in one batch, 80 ms of audio per step.

Sessions are *slots* of one preallocated state (:class:`~myna.dsm.frame.FrameState` and a Mimi
state for ``max_batch`` slots). They join and leave between steps: joining resets the slot's
caches and installs its conditions; a slot that cannot run this step (it waits for a word, or is
too far ahead of real time) is frozen through the per-slot ``exec_mask``, which leaves its state
exactly as it was. A step runs on the smallest *bucket* (a batch size from ``buckets``) that holds
its highest running slot, on views of the first ``bucket`` rows of the state (``narrow``), so
shapes are static: on CUDA one graph per bucket and phase is captured at warm-up, all in one
memory pool, and replayed while serving. Slots move between rows (every tensor of the state
exchanged, :meth:`FrameState.swap <myna.dsm.frame.FrameState.swap>`) so that busy slots fill the
first rows, and a session that has not made its first audio yet steps alone in the first rows
while the others are ahead of real time: a session joining a busy loop reaches its first audio
at the small bucket's pace, not the batch's (:meth:`FrameLoop._first_audio_first`).

A step is :class:`~myna.dsm.frame.FrameStep`, the same step ``DSMTTS.synthesize`` runs, and the
host's share of it is arranged so that the device waits for the host as little as it can:

1. launch the text phase (graph "text": temporal transformer → text logits → sample);
2. while it runs: draw this step's audio noise and the next step's text noise into pinned host
   buffers copied asynchronously, and hand out the previous step's PCM;
3. read the sampled tokens back (the step's one synchronisation) and run each slot's text state
   machine (consuming words; a consumed word is a word event);
4. launch the audio phase (depformer, commit and Mimi decode of the undelayed frame: graph
   "audio"), or "commit" when no running slot is past ``delay_steps`` (a text-only step), and start
   copying its PCM to the host; on CUDA the PCM goes to the sessions during the next step, right
   after that step's text launch (or at once when the loop has nothing else to do), on the CPU at
   the end of the step (``pipelined``).

Randomness is per session: each session draws its exponential-race noise (§2.6) from its own
``torch.Generator`` on the host, one draw per slot and phase, in the order and with the numbers
:meth:`DSMTTS.generate` draws them, and the noise enters the step as an input tensor. So a
session's tokens depend only on its seed and its text, not on who shares the batch, and a seeded
session matches ``DSMTTS.synthesize(seed=…)``.

Time comes from an injected ``clock``. Without a thread (``start(thread=False)``) the caller
drives the loop with :meth:`FrameLoop.tick`: the tests run it step by step, with no sleeps.

The loop never blocks on a session: callbacks must be cheap and thread-safe (e.g.
``loop.call_soon_threadsafe``); a callback or per-session failure ends that session only.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from .frame import FrameState, FrameStep
from .layers import swap_rows
from .state_machine import Entry, TextState, script_to_entries
from .tts import DSMTTS

log = logging.getLogger("myna.dsm.loop")


# ------------------------------------------------------------------------------ sessions

@dataclass
class _Inbox:
    words: list[str] = field(default_factory=list)
    ended: bool = False
    cancelled: bool = False


class LoopSession:
    """One turn in the frame loop (thread-safe handle; see :meth:`FrameLoop.open`).

    Callbacks run on the loop thread: ``on_audio(pcm float32 [1920])``, ``on_word(word, start_s)``
    (seconds into this turn's audio) and ``on_end(error)`` (None when the turn completed; called
    exactly once, also after :meth:`cancel`)."""

    def __init__(self, loop: "FrameLoop", voice, seed: int | None,
                 on_audio: Callable[[np.ndarray], None], on_word: Callable[[str, float], None],
                 on_end: Callable[[BaseException | None], None]):
        self._loop = loop
        self.voice = voice
        self.seed = seed
        self.on_audio, self.on_word, self.on_end = on_audio, on_word, on_end
        self._inbox = _Inbox()
        self._lock = threading.Lock()
        self.done = threading.Event()
        #: filled by the loop: the loop's step count when the session took its slot (its first
        #: step is the next one), the step (slot-local) that produced the first audio frame, and
        #: the time (the loop's clock) it was handed to ``on_audio``
        self.admitted_step: int | None = None
        self.first_audio_step: int | None = None
        self.first_audio_time: float | None = None
        self.opened_at = loop.clock()
        self.steps = 0
        self.tokens: list[tuple[int, int]] = []

    def push_words(self, words: Sequence[str]) -> None:
        """Add whole words (any thread)."""
        with self._lock:
            if not (self._inbox.ended or self._inbox.cancelled):
                self._inbox.words.extend(words)
        self._loop._wake()

    def end_input(self) -> None:
        """No more words: the slot finishes what it has."""
        with self._lock:
            self._inbox.ended = True
        self._loop._wake()

    def cancel(self) -> None:
        """Drop the turn; its slot is free within one step and ``on_end(None)`` follows."""
        with self._lock:
            self._inbox.cancelled = True
        self._loop._wake()

    def _take(self) -> tuple[list[str], bool, bool]:
        with self._lock:
            words, self._inbox.words = self._inbox.words, []
            return words, self._inbox.ended, self._inbox.cancelled


@dataclass
class _Slot:
    session: LoopSession
    index: int
    state: TextState
    gen: torch.Generator | None
    first_word: bool = True
    ended: bool = False
    t: int = 0                 # slot-local step
    frames: int = 0            # audio frames decoded (the first ``tts.skip_frames`` are dropped)
    audio_s: float = 0.0       # seconds of audio handed out
    words_out: int = 0         # transcript entries already published


# ------------------------------------------------------------------------------ host buffers and graphs

class _Pinned:
    """The host side of a step input or output: a buffer in pinned memory (on CUDA), copied to or
    from the device without temporaries and without waiting (``non_blocking``). An event recorded
    after each copy tells when the host buffer may be rewritten (after a push) or read (after a
    pull): :meth:`wait`. On the CPU copies are immediate and :meth:`wait` returns at once.

    The host rewrites each buffer at most once per step, and the copy it waits for was queued a
    step earlier, right behind work whose result the host has already read back: in steady state
    :meth:`wait` finds it done and returns at once, so one buffer per input is enough.
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, fill=0):
        cuda = device.type == "cuda"
        self.host = torch.full(shape, fill, dtype=dtype, pin_memory=cuda)
        self.array = self.host.numpy()  # the same memory, for cheap per-slot writes
        self._event = torch.cuda.Event() if cuda else None

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()

    def push(self, dst: torch.Tensor, n: int) -> None:
        """Copy rows [:n] to ``dst`` (a static device buffer)."""
        dst[:n].copy_(self.host[:n], non_blocking=True)
        self._record()

    def pull(self, src: torch.Tensor) -> None:
        """Start copying ``src`` (its rows) into the host buffer; :meth:`wait` before reading."""
        self.host[:src.shape[0]].copy_(src, non_blocking=True)
        self._record()

    def _record(self) -> None:
        if self._event is not None:
            self._event.record()


class GraphPhase:
    """One step phase for one bucket: ``fn`` run eagerly, or the CUDA graph captured from it by
    :meth:`capture` and replayed. Graph outputs are the same static tensors on every replay."""

    def __init__(self, fn: Callable[[], object]):
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: object = None

    def capture(self, pool) -> None:
        """Warm up on a side stream, then capture into the memory pool ``pool`` shared by every
        phase and bucket. Sharing is safe here because no graph output is read after another
        graph has replayed: a step replays "text" then "audio" (or "commit") of one bucket, and
        its outputs are consumed (or copied to the host) before the next step's first replay.
        ``thread_local`` capture lets other threads use CUDA meanwhile without breaking it."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            self.out = self.fn()

    def __call__(self):
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.out


# ------------------------------------------------------------------------------ the loop

def default_buckets(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, … up to and including ``max_batch``."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    out.append(max_batch)
    return tuple(out)


class FrameLoop:
    """The frame loop over a loaded :class:`DSMTTS` (see the module docstring).

    Args:
        tts: the model; its generation settings (temperature, top-k, ``padding_bonus``, ``n_q``,
            ``final_padding``, ``max_steps``) as they are now apply to every session.
        max_batch: slots (sessions stepping at once; more wait for a free slot).
        buckets: batch sizes a step may run at (default 1, 2, 4, … max_batch).
        max_ahead_s: a slot whose audio is more than this ahead of real time (since its first audio)
            pauses until real time catches up (backpressure). ``math.inf`` disables it.
        greedy: argmax sampling for every session (tests).
        cuda_graphs: capture graphs at :meth:`start` (default: on CUDA unless ``NO_CUDA_GRAPH=1``).
        clock: monotonic time in seconds (``time.monotonic``); inject a virtual one to drive the
            loop with :meth:`tick` in tests.
        pipelined: hand each step's PCM out during the next step, right after its text launch, so
            the device never waits for that copy (default: on CUDA, where launches return at once;
            on the CPU a launch runs the phase, and waiting for it would only delay the audio).
        threads: on the CPU, torch's intra-op threads on the loop thread (None: torch's count
            when :meth:`start` is called); other threads keep theirs. Unused with ``thread=False``.

    The state of every slot is allocated, and the phases built and warmed up, by :meth:`start`
    on the thread that will step them (see there why).
    """

    def __init__(self, tts: DSMTTS, *, max_batch: int = 16, buckets: Sequence[int] | None = None,
                 max_ahead_s: float = 3.0, greedy: bool = False, cuda_graphs: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, pipelined: bool | None = None,
                 threads: int | None = None):
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.tts = tts
        self.threads = threads
        self.lm, self.mimi, self.cfg = tts.lm, tts.mimi, tts.cfg
        self.device = self.lm.device
        self.max_batch = max_batch
        self.buckets = tuple(sorted(set(buckets or default_buckets(max_batch))))
        if self.buckets[-1] != max_batch:
            raise ValueError(f"the largest bucket must be max_batch ({max_batch}), got {self.buckets}")
        self.max_ahead_s = max_ahead_s
        self.greedy = greedy
        self._sampling, self._n_q = tts.sampling(greedy), tts.n_q  # the settings as they are now
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda" and os.environ.get("NO_CUDA_GRAPH", "") in ("", "0")
        self.cuda_graphs = cuda_graphs
        self.clock = clock
        self.pipelined = self.device.type == "cuda" if pipelined is None else pipelined
        self.frame_size = self.cfg.mimi.frame_size

        self._cond = threading.Condition()
        self._joins: deque[LoopSession] = deque()
        self._slots: dict[int, _Slot] = {}
        self._conditions: dict[object, tuple] = {}
        self._outbox: list[tuple[_Slot, int]] = []   # audio frames copied to self._pcm, to hand out
        self._finished: list[LoopSession] = []        # turns that end once their audio is out
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.steps = 0
        #: steps run per bucket (batch size), for benchmarks and tests
        self.bucket_steps: dict[int, int] = {}
        self.started = False

    # -- phases --------------------------------------------------------------------------
    def _make_phases(self, n: int) -> dict[str, GraphPhase]:
        step, ms, n_q = self.step.narrow(n), self.ms.narrow(n), self._n_q

        def audio() -> torch.Tensor:
            frame = step.audio()
            codes = frame[:, 1:1 + n_q, None].clamp(min=0)
            return self.mimi.decode(codes, ms)[:, 0].clamp(-1, 1)

        return {"text": GraphPhase(step.text), "audio": GraphPhase(audio), "commit": GraphPhase(step.commit)}

    # -- life cycle ----------------------------------------------------------------------
    def start(self, *, thread: bool = True) -> None:
        """Allocate the slots' state, build and warm up the phases (on CUDA: capture the graphs of
        every bucket and phase), then step sessions on the loop thread; with ``thread=False`` all
        of that happens on the caller's thread, which then drives the loop with :meth:`tick`.

        With a thread, the preparation runs on that thread and ``start`` returns once it is done
        (raising its error, with no thread left running), so every tensor op of the loop runs on
        one thread. On the CPU, a thread that has run a parallel op keeps an OpenMP team until it
        ends; once the process holds more OpenMP threads than cores, libgomp shortens every team's
        spin-wait, and the step's hundreds of small parallel regions each wait for a futex wake-up.
        Measured (``myna bench dsm-loop``, tiny config, 2 intra-op threads, 2 cores, one run
        each): with the state allocated and warmed on the caller's thread, 105 / 47 / 34 steps/s
        at 1 / 4 / 16 sessions; on the loop thread, 181 / 123 / 77 (with the depformer's host
        work cut too).

        Raises whatever the preparation raised (out of memory, a graph capture failure)."""
        if self.started:
            return
        if not thread:
            self._prepare()
            self.started = True
            return
        own_count = self.threads is not None and self.device.type == "cpu"
        counted, restored, warmed = threading.Event(), threading.Event(), threading.Event()
        failure: list[BaseException] = []

        def body() -> None:
            try:
                if own_count:
                    torch.get_num_threads()  # torch's per-thread set-up first, or it would undo this
                    torch.set_num_threads(self.threads)
                counted.set()
                restored.wait()  # the caller has put the process default back
                if self.device.type == "cuda" and self.device.index is not None:
                    torch.cuda.set_device(self.device)  # streams and events on the model's GPU
                self._prepare()
            except BaseException as exc:  # re-raised by start() on the caller's thread
                failure.append(exc)
                return
            finally:
                counted.set()
                warmed.set()
            self._run()

        others = torch.get_num_threads()
        loop_thread = threading.Thread(target=body, name="dsm-frame-loop", daemon=True)
        loop_thread.start()
        counted.wait()
        if own_count:  # torch.set_num_threads on the loop thread also set the default of new threads
            torch.set_num_threads(others)
        restored.set()
        warmed.wait()
        if failure:
            loop_thread.join()
            raise failure[0]
        self._thread = loop_thread
        self.started = True

    @torch.no_grad()
    def _prepare(self) -> None:
        """Allocate the state of every slot, the host buffers and the phases, and warm them up."""
        cross_len = self.cfg.max_speakers * 125 if self.cfg.cross_attention else 0
        B, dev = self.max_batch, self.device
        self.fs = FrameState.new(self.lm, B, cross_len)
        self.fs.exec_mask.fill_(False)
        self.ms = self.mimi.new_state(B)
        self.ms.exec_mask.fill_(False)
        self.step = FrameStep(self.lm, self.fs, self._sampling, self._n_q)
        self._draws = self.step.sampling.draws
        pad = self.step.pad
        self._text_noise = _Pinned(tuple(self.step.text_noise.shape), torch.float32, dev, 1.0)
        self._audio_noise = _Pinned(tuple(self.step.audio_noise.shape), torch.float32, dev, 1.0)
        self._text_in = _Pinned((B,), torch.long, dev, pad)
        self._exec = _Pinned((B,), torch.bool, dev)
        self._mimi_exec = _Pinned((B,), torch.bool, dev)
        self._sampled = _Pinned((B,), torch.long, dev)
        self._pcm = _Pinned((B, self.frame_size), torch.float32, dev)
        self._text_noise_pending = False  # rows drawn at admission, not yet on the device
        self._fresh_only = False          # the last step ran only slots with no audio yet
        #: the step's phases per bucket, as run (eagerly, or replayed as CUDA graphs)
        self.phases: dict[int, dict[str, GraphPhase]] = {n: self._make_phases(n) for n in self.buckets}

        pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        buckets = self.buckets if self.device.type == "cuda" else self.buckets[:1]
        for n in buckets:
            self._warm(n, pool)
        everything = torch.ones(self.max_batch, dtype=torch.bool, device=self.device)
        self.fs.reset(everything)
        self.ms.reset(everything)
        self.fs.exec_mask.fill_(False)
        self.ms.exec_mask.fill_(False)

    def _warm(self, n: int, pool) -> None:
        self.fs.exec_mask[:n] = True
        self.ms.exec_mask[:n] = True
        phases = self.phases[n]
        if self.cuda_graphs:
            # The text graph's h feeds the audio graph, so the text phase is captured first.
            for p in ("text", "audio", "commit"):
                phases[p].capture(pool)
            torch.cuda.synchronize()
        else:
            for _ in range(2):
                phases["text"]()
                phases["audio"]()
                phases["commit"]()

    def close(self) -> None:
        """Stop the loop; live sessions end with an error (finished turns complete first)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        elif self.started:
            self._shutdown()

    def open(self, *, voice=None, seed: int | None = None, on_audio: Callable[[np.ndarray], None] = lambda pcm: None,
             on_word: Callable[[str, float], None] = lambda w, s: None,
             on_end: Callable[[BaseException | None], None] = lambda e: None) -> LoopSession:
        """A new session (any thread); it takes a slot at the next step (or when one frees)."""
        session = LoopSession(self, voice, seed, on_audio, on_word, on_end)
        with self._cond:
            if self._stopping:
                raise RuntimeError("frame loop is closed")
            self._joins.append(session)
            self._cond.notify_all()
        return session

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    @property
    def busy_slots(self) -> int:
        """Slots held by sessions (tests, metrics)."""
        return len(self._slots)

    @property
    def waiting_sessions(self) -> int:
        return len(self._joins)

    @property
    def idle(self) -> bool:
        """No session holds or waits for a slot, and all produced audio and ends are handed out."""
        return not (self._slots or self._joins or self._outbox or self._finished)

    # -- driving it ----------------------------------------------------------------------
    @torch.no_grad()
    def tick(self) -> float | None:
        """One turn of the loop: admit waiting sessions, take their new words, and run one step
        for the slots that can run. Returns 0.0 when it should be called again at once (a step
        ran, or a session has something for the loop); otherwise, after handing out what is
        pending, how long (clock seconds) until a paused slot may run, or None when nothing can
        happen until a session acts. The loop thread calls it; so may the caller of a loop
        started with ``thread=False`` (then callbacks run on the caller's thread)."""
        self._admit()
        self._intake()
        run, wait = self._runnable()
        if run:
            self._step(self._first_audio_first(run))
            return 0.0
        self._deliver()
        return 0.0 if self._pending_work() else wait

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                if self._stopping:
                    break
            try:
                wait = self.tick()
            except Exception as exc:  # a bug in a step or the bookkeeping: fail everyone, keep serving
                log.exception("frame loop step failed")
                self._fail_all(exc)
                continue
            if wait == 0.0:
                continue
            with self._cond:  # a session acting since tick() looked notifies, or is seen here
                if not self._stopping and not self._pending_work():
                    self._cond.wait(timeout=wait if wait is not None else 1.0)
        self._shutdown()

    def _shutdown(self) -> None:
        self._deliver()
        self._fail_all(RuntimeError("frame loop closed"))
        for s in list(self._joins):
            self._end(s, RuntimeError("frame loop closed"))
        self._joins.clear()

    def _pending_work(self) -> bool:
        if self._joins and (len(self._slots) < self.max_batch or any(s._inbox.cancelled for s in self._joins)):
            return True
        for slot in self._slots.values():
            inbox = slot.session._inbox
            if inbox.words or inbox.cancelled or (inbox.ended and not slot.ended):
                return True
        return False

    def _admit(self) -> None:
        with self._cond:  # a session cancelled while it waited for a slot ends here
            dropped = [s for s in self._joins if s._inbox.cancelled]
            for s in dropped:
                self._joins.remove(s)
        for s in dropped:
            self._end(s, None)
        while True:
            with self._cond:
                if not self._joins or len(self._slots) >= self.max_batch:
                    return
                session = self._joins.popleft()
            index = min(set(range(self.max_batch)) - set(self._slots))
            try:
                cond_sum, cross = self._conditions_for(session.voice)
                mask = torch.zeros(self.max_batch, dtype=torch.bool, device=self.device)
                mask[index] = True
                self.fs.reset(mask)
                self.ms.reset(mask)
                self.lm.set_conditions(self.fs.temporal, slice(index, index + 1), cond_sum, cross)
            except Exception as exc:
                self._end(session, exc)
                continue
            gen = None
            if self._draws:
                gen = torch.Generator()
                gen.manual_seed(session.seed if session.seed is not None else random.getrandbits(63))
                # the slot's first text draw; later ones are drawn a step ahead (see _draw_noise)
                self._text_noise.wait()
                self._text_noise.host[index].exponential_(1, generator=gen)
                self._text_noise_pending = True
            self._slots[index] = _Slot(session, index, self.tts.machine.new_state([]), gen)
            session.admitted_step = self.steps

    def _conditions_for(self, voice) -> tuple:
        key = voice if isinstance(voice, (str, os.PathLike, type(None))) else id(voice)
        if key not in self._conditions:
            self._conditions[key] = self.tts.conditions(voice)
        return self._conditions[key]

    def _entries(self, slot: _Slot, words: list[str]) -> list[Entry]:
        tts = self.tts
        out: list[Entry] = []
        for word in words:
            entries = script_to_entries(lambda w: tts.tokenizer.encode(w), [word], tts.ids, self.cfg.mimi.frame_rate,
                                        multi_speaker=tts.needs_voice and slot.first_word, padding_between=1)
            if entries:
                slot.first_word = False
            out.extend(entries)
        return out

    def _intake(self) -> None:
        for index, slot in list(self._slots.items()):
            try:
                words, ended, cancelled = slot.session._take()
                if cancelled:
                    self._free(slot, None)
                    continue
                if words:
                    slot.state.entries.extend(self._entries(slot, words))
                slot.ended = ended
            except Exception as exc:
                self._free(slot, exc)

    def _needs_word(self, slot: _Slot) -> bool:
        """True when this step might consume a word whose lookahead is not there yet."""
        st = self.tts.machine
        s = slot.state
        if slot.ended or s.queued or s.forced > 0:
            return False
        return len(s.entries) < 1 + st.second_stream_ahead

    def _runnable(self) -> tuple[list[_Slot], float | None]:
        now = self.clock()
        run, wait = [], None
        for slot in self._slots.values():
            if self._needs_word(slot):
                continue
            first = slot.session.first_audio_time
            if first is not None and math.isfinite(self.max_ahead_s):
                ahead = slot.audio_s - (now - first)
                if ahead > self.max_ahead_s:
                    release = ahead - self.max_ahead_s
                    wait = release if wait is None else min(wait, release)
                    continue
            run.append(slot)
        return run, wait

    def _first_audio_first(self, run: list[_Slot]) -> list[_Slot]:
        """The slots this step runs, moved to the first rows of the state. A session's steps
        until its first audio frame (its text-only lead-in, then the steps that fill the audio
        delays) decide its time to first audio; stepped with a full batch they would take the
        batch's time each, so a session joining a busy loop would reach its first audio several
        times later than a lone one. Instead, while some runnable slots have not made audio yet
        and others have, the former step alone in the first rows (the smallest bucket, the others
        frozen) — back to back while every other running slot is at least a frame ahead of real
        time (its listener does not notice the pause), else every other step. Busy slots are
        kept in the first rows too (:meth:`_compact`)."""
        self._compact()
        fresh = [slot for slot in run if slot.session.first_audio_step is None]
        if fresh and len(fresh) < len(run):
            now = self.clock()
            slack = min((slot.audio_s - (now - slot.session.first_audio_time)
                         if slot.session.first_audio_time is not None else 0.0)
                        for slot in run if slot.session.first_audio_step is not None)
            if not self._fresh_only or slack >= self.frame_size / self.cfg.mimi.sample_rate:
                self._fresh_only = True
                self._to_front(fresh)
                return fresh
        self._fresh_only = False
        return run

    def _compact(self) -> None:
        """Move the highest busy slots into free rows below them, so the busy slots hold rows
        0 … busy − 1 and a step's bucket is no larger than the number of sessions needs."""
        free = sorted(set(range(len(self._slots))) - set(self._slots))
        for row in free:
            self._swap(max(self._slots), row)

    def _to_front(self, slots: list[_Slot]) -> None:
        """Move ``slots`` to rows 0 … len(slots) − 1, exchanging them with whoever is there."""
        rows = {slot.index for slot in slots}
        targets = [row for row in range(len(slots)) if row not in rows]
        movers = [slot for slot in slots if slot.index >= len(slots)]
        for slot, row in zip(movers, targets):
            self._swap(slot.index, row)

    def _swap(self, a: int, b: int) -> None:
        """Exchange rows a and b: the model's and Mimi's state, the next text draw (host and
        device copies), and the slots' indices (either row may be free). Frames already in the
        outbox keep the row they were copied from."""
        self.fs.swap(a, b)
        self.ms.swap(a, b)
        self._text_noise.wait()
        swap_rows(self._text_noise.host, a, b)
        swap_rows(self.step.text_noise, a, b)
        slot_a, slot_b = self._slots.pop(a, None), self._slots.pop(b, None)
        for slot, row in ((slot_a, b), (slot_b, a)):
            if slot is not None:
                slot.index = row
                self._slots[row] = slot

    # -- one step ------------------------------------------------------------------------
    def _step(self, run: list[_Slot]) -> None:
        cfg, tts = self.cfg, self.tts
        n = next(b for b in self.buckets if b > max(slot.index for slot in run))  # rows past n stay as they are
        self.bucket_steps[n] = self.bucket_steps.get(n, 0) + 1
        phases = self.phases[n]
        audio_start = cfg.max_delay + cfg.delay_steps
        depformer = any(slot.t >= cfg.delay_steps for slot in run)

        # 1. the text phase's inputs, then its launch
        for pinned in (self._exec, self._mimi_exec):
            pinned.wait()
            pinned.array[:] = False
        for slot in run:
            self._exec.array[slot.index] = True
            if slot.t >= audio_start:
                self._mimi_exec.array[slot.index] = True
        self._exec.push(self.fs.exec_mask, n)
        self._mimi_exec.push(self.ms.exec_mask, n)
        if self._text_noise_pending:  # every row: an admitted slot may sit past this step's bucket
            self._text_noise.push(self.step.text_noise, self.max_batch)
            self._text_noise_pending = False
        self._sampled.pull(phases["text"]())

        # 2. host work while the text phase runs
        self._draw_noise(run, n, depformer)
        if self.pipelined:
            self._deliver()

        # 3. the readback, and the text state machine of each running slot
        self._sampled.wait()
        sampled = self._sampled.host[:n].tolist()
        self._text_in.wait()
        fed = self._text_in.array
        fed[:] = tts.ids.pad
        failed: list[tuple[_Slot, BaseException]] = []
        for slot in run:
            try:
                tok = sampled[slot.index]
                fed[slot.index] = tts.machine.process(slot.t, slot.state, tok)
                slot.session.tokens.append((tok, int(fed[slot.index])))
            except Exception as exc:
                failed.append((slot, exc))
        self._text_in.push(self.step.text_in, n)

        # 4. the audio (or text-only) phase; its PCM goes out after the next text launch (pipelined)
        if depformer:
            pcm = phases["audio"]()
            if self._mimi_exec.array[:n].any():
                self._pcm.pull(pcm)
        else:
            phases["commit"]()
        self.steps += 1

        for slot, exc in failed:
            self._free(slot, exc)
        failed_ids = {id(s) for s, _ in failed}
        for slot in run:
            if id(slot) in failed_ids:
                continue
            try:
                self._publish(slot)
            except Exception as exc:
                self._free(slot, exc)
        if not self.pipelined:
            self._deliver()

    def _draw_noise(self, run: list[_Slot], n: int, depformer: bool) -> None:
        """Each running slot's audio draws for this step (one [n_q, k_audio] draw, past
        ``delay_steps``) and its text draw for its next step, in the order ``generate`` draws
        them, copied to the device behind the text phase that is running."""
        if not self._draws:
            return
        delay = self.cfg.delay_steps
        self._audio_noise.wait()
        self._text_noise.wait()
        for slot in run:
            if slot.t >= delay:
                self._audio_noise.host[slot.index].exponential_(1, generator=slot.gen)
            self._text_noise.host[slot.index].exponential_(1, generator=slot.gen)
        if depformer:
            self._audio_noise.push(self.step.audio_noise, n)
        self._text_noise.push(self.step.text_noise, n)

    def _publish(self, slot: _Slot) -> None:
        """Word events, the accounting of the slot's audio frame (handed out by :meth:`_deliver`),
        and the end of its turn."""
        cfg, tts = self.cfg, self.tts
        s, session = slot.state, slot.session
        while slot.words_out < len(s.transcript):
            word, step = s.transcript[slot.words_out]
            slot.words_out += 1
            session.on_word(word, tts.word_start_s(step))
        t = slot.t
        slot.t += 1
        session.steps = slot.t
        frames = tts.turn_frames(s.end_step)
        if t >= cfg.max_delay + cfg.delay_steps and (frames is None or slot.frames < frames):
            if slot.frames >= tts.skip_frames:
                if session.first_audio_step is None:
                    session.first_audio_step = t
                slot.audio_s += self.frame_size / cfg.mimi.sample_rate
                self._outbox.append((slot, slot.index))
            slot.frames += 1
        done = frames is not None and slot.frames >= frames
        if done or (s.end_step is not None and slot.t >= s.end_step + cfg.delay_steps + tts.final_padding) \
                or slot.t >= tts.max_steps:
            self._free(slot, None, after_audio=True)

    def _deliver(self) -> None:
        """Hand out the audio frames of the last step, then end the turns that finished."""
        if self._outbox:
            self._pcm.wait()
            for slot, index in self._outbox:
                session = slot.session
                if session.done.is_set():
                    continue
                try:
                    if session.first_audio_time is None:
                        session.first_audio_time = self.clock()
                    session.on_audio(self._pcm.array[index].copy())
                except Exception as exc:
                    self._free(slot, exc)
            self._outbox.clear()
        finished, self._finished = self._finished, []
        for session in finished:
            self._end(session, None)

    def _free(self, slot: _Slot, error: BaseException | None, after_audio: bool = False) -> None:
        """Release the slot now; end its session now, or (``after_audio``) once its last audio is out."""
        if self._slots.get(slot.index) is slot:
            del self._slots[slot.index]
        if after_audio:
            self._finished.append(slot.session)
        else:
            self._end(slot.session, error)

    def _end(self, session: LoopSession, error: BaseException | None) -> None:
        if session.done.is_set():
            return
        session.done.set()
        try:
            session.on_end(error)
        except Exception:
            log.exception("on_end callback failed")

    def _fail_all(self, exc: BaseException) -> None:
        self._outbox.clear()
        for slot in list(self._slots.values()):
            self._free(slot, exc)
        for session in self._finished:
            self._end(session, exc)
        self._finished.clear()
