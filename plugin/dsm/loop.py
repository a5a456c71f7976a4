"""The DSM frame loop (dsm_spec §2.4–2.5, §5): one thread owns the model, its caches and the
device, and steps every live session in one batch, 80 ms of audio per step.

Sessions are *slots* of one preallocated state (:class:`~myna.dsm.frame.FrameState` and a Mimi
state for ``max_batch`` slots). They join and leave between steps: joining resets the slot's
caches and installs its conditions; a slot that cannot run this step (it waits for a word, or is
too far ahead of real time) is frozen through the per-slot ``exec_mask``, which leaves its state
exactly as it was. A step runs on the smallest *bucket* (a batch size from ``buckets``) that holds
the highest busy slot, on views of the first ``bucket`` rows of the state, so shapes are static:
on CUDA one graph per bucket and phase is captured at warm-up and replayed while serving.

One step, for the slots that run:

1. text: temporal transformer → text logits → sample (graph "text");
2. host: the text state machine of each slot maps its sampled token to the token it reads next
   (consuming words; a consumed word is a word event at its consumption step);
3. audio: depformer (only when some running slot is past ``delay_steps``), commit, and Mimi decode
   of the undelayed frame for the slots that have one (graph "audio"; "commit" when no slot is past
   the delay: a text-only step);
4. host: each slot's 1920-sample PCM frame goes to its session's callback.

Randomness is per session: each session draws its exponential-race noise (§2.6) from its own
``torch.Generator`` on the host, in the order and shapes :meth:`DSMTTS.generate` draws them, and
the noise enters the step as an input tensor. So a session's tokens depend only on its seed and
its text, not on who shares the batch, and a seeded session matches ``DSMTTS.synthesize(seed=…)``.

The loop never blocks on a session: callbacks must be cheap and thread-safe (e.g.
``loop.call_soon_threadsafe``); a callback or per-session failure ends that session only.
"""

from __future__ import annotations

import copy
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

from .frame import FrameState, step_commit, step_depformer, step_text
from .mimi import MimiState
from .state_machine import Entry, TextState, script_to_entries
from .tts import DSMTTS

log = logging.getLogger("myna.dsm.loop")

#: Decoded frames dropped at the start of a turn (the forced initial padding; as ``synthesize``).
SKIP_FRAMES = 2


def sample_with_noise(logits: torch.Tensor, temperature: float, top_k: int, noise: torch.Tensor | None) -> torch.Tensor:
    """:func:`myna.dsm.sampling.sample_token` with the Exp(1) draws given: logits [B, V],
    noise [B, k] (k = min(top_k, V)), or None for greedy argmax → int64 [B]."""
    logits = logits.float()
    if noise is None or temperature <= 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    probs, indices = torch.topk(probs, noise.shape[-1], dim=-1)
    choice = (probs / noise).argmax(dim=-1)
    return indices.gather(-1, choice[:, None])[:, 0]


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
        #: filled by the loop: step (slot-local) and wall time of the first audio frame
        self.first_audio_step: int | None = None
        self.first_audio_time: float | None = None
        self.opened_at = time.monotonic()
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
    frames: int = 0            # audio frames decoded (the first SKIP_FRAMES are dropped)
    audio_s: float = 0.0       # seconds of audio handed out
    words_out: int = 0         # transcript entries already published


# ------------------------------------------------------------------------------ views and graphs

def _narrow_ring(cache, n: int):
    v = copy.copy(cache)
    v.__dict__["_buffers"] = {k: b[:n] for k, b in cache._buffers.items()}
    return v


def _frame_view(fs: FrameState, n: int) -> FrameState:
    """The first n slots of ``fs`` as a FrameState sharing its storage (in-place writes go through)."""
    ts = fs.temporal
    tv = copy.copy(ts)
    dims = {"cross_k": 1, "cross_v": 1}
    tv.__dict__["_buffers"] = {k: b.narrow(dims.get(k, 0), 0, n) for k, b in ts._buffers.items()}
    tv.__dict__["_modules"] = {"caches": torch.nn.ModuleList([_narrow_ring(c, n) for c in ts.caches])}
    tv.batch_size = n
    v = copy.copy(fs)
    v.__dict__["_buffers"] = {k: (b.narrow(2, 0, n) if k == "dep_cache" else b if k in ("initial", "delays") else b[:n])
                              for k, b in fs._buffers.items()}
    v.__dict__["_modules"] = {"temporal": tv}
    v.batch_size = n
    return v


def _mimi_view(ms: MimiState, n: int) -> MimiState:
    v = MimiState({k: b[:n] for k, b in ms.buffers.items()}, [_narrow_ring(c, n) for c in ms.caches], ms.offset[:n])
    v.exec_mask = ms.exec_mask[:n]
    return v


class _Phase:
    """One step phase for one bucket: run eagerly, or replay a CUDA graph captured by :meth:`capture`."""

    def __init__(self, fn: Callable[[], object]):
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: object = None

    def capture(self, pool=None) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
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
    """The frame loop thread over a loaded :class:`DSMTTS` (see the module docstring).

    Args:
        tts: the model; its generation settings (temperature, top-k, ``n_q``, ``final_padding``,
            ``max_steps``) apply to every session.
        max_batch: slots (sessions stepping at once; more wait for a free slot).
        buckets: batch sizes a step may run at (default 1, 2, 4, … max_batch).
        max_ahead_s: a slot whose audio is more than this ahead of real time (since its first audio)
            pauses until real time catches up (backpressure). ``math.inf`` disables it.
        greedy: argmax sampling for every session (tests).
        cuda_graphs: capture graphs at :meth:`start` (default: on CUDA unless ``NO_CUDA_GRAPH=1``).
    """

    def __init__(self, tts: DSMTTS, *, max_batch: int = 16, buckets: Sequence[int] | None = None,
                 max_ahead_s: float = 3.0, greedy: bool = False, cuda_graphs: bool | None = None):
        self.tts = tts
        self.lm, self.mimi, self.cfg = tts.lm, tts.mimi, tts.cfg
        self.device = self.lm.device
        self.max_batch = max_batch
        self.buckets = tuple(sorted(set(buckets or default_buckets(max_batch))))
        if self.buckets[-1] != max_batch:
            raise ValueError(f"the largest bucket must be max_batch ({max_batch}), got {self.buckets}")
        self.max_ahead_s = max_ahead_s
        self.greedy = greedy
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda" and os.environ.get("NO_CUDA_GRAPH", "") in ("", "0")
        self.cuda_graphs = cuda_graphs
        self.n_q = tts.n_q
        self.frame_size = self.cfg.mimi.frame_size
        self.k_text = min(tts.top_k_text, self.cfg.text_out_card) if tts.top_k_text > 0 else self.cfg.text_out_card
        self.k_audio = min(tts.top_k_audio, self.cfg.card) if tts.top_k_audio > 0 else self.cfg.card

        cross_len = self.cfg.max_speakers * 125 if self.cfg.cross_attention else 0
        B, dev = max_batch, self.device
        self.fs = FrameState(self.lm, B, cross_len)
        self.fs.exec_mask.fill_(False)
        self.ms = self.mimi.new_state(B)
        self.ms.exec_mask.fill_(False)
        self.text_noise = torch.ones(B, self.k_text, device=dev)
        self.audio_noise = torch.ones(B, self.n_q, self.k_audio, device=dev)
        self.text_in = torch.full((B,), self.tts.ids.pad, dtype=torch.long, device=dev)
        pin = dev.type == "cuda"
        self._host_text_noise = torch.ones(B, self.k_text, pin_memory=pin)
        self._host_audio_noise = torch.ones(B, self.n_q, self.k_audio, pin_memory=pin)
        self._host_text_in = torch.full((B,), self.tts.ids.pad, dtype=torch.long, pin_memory=pin)
        self._host_exec = torch.zeros(B, dtype=torch.bool, pin_memory=pin)
        self._host_mimi = torch.zeros(B, dtype=torch.bool, pin_memory=pin)
        self._phases = {n: self._make_phases(n) for n in self.buckets}

        self._cond = threading.Condition()
        self._joins: deque[LoopSession] = deque()
        self._slots: dict[int, _Slot] = {}
        self._conditions: dict[object, tuple] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.steps = 0
        self.started = False

    # -- phases --------------------------------------------------------------------------
    def _make_phases(self, n: int) -> dict[str, _Phase]:
        lm, tts, cfg = self.lm, self.tts, self.cfg
        fs, ms = _frame_view(self.fs, n), _mimi_view(self.ms, n)
        text_noise, audio_noise, text_in = self.text_noise[:n], self.audio_noise[:n], self.text_in[:n]
        greedy = self.greedy
        holder: dict[str, torch.Tensor] = {}

        def text():
            h, logits = step_text(lm, fs)
            holder["h"] = h
            return sample_with_noise(logits, tts.temperature, self.k_text, None if greedy else text_noise)

        def depformer_chain(h):
            prev, out = text_in, []
            for k in range(self.n_q):
                logits = lm.depformer_logits(k, prev, h, fs.dep_cache)
                prev = sample_with_noise(logits, tts.temperature, self.k_audio, None if greedy else audio_noise[:, k])
                out.append(prev)
            audio = torch.stack(out, dim=1)
            if self.n_q < cfg.dep_q:
                rest = torch.full((n, cfg.dep_q - self.n_q), -1, dtype=torch.long, device=text_in.device)
                audio = torch.cat([audio, rest], dim=1)
            return audio

        def audio():
            # holder["h"] is the text phase's h: its static output once the text graph is captured
            audio_tokens = depformer_chain(holder["h"])
            frame = step_commit(lm, fs, text_in, audio_tokens, cfg.delay_steps)
            codes = frame[:, 1:1 + self.n_q, None].clamp(min=0)
            return self.mimi.decode(codes, ms)[:, 0].clamp(-1, 1)

        def commit():
            step_commit(lm, fs, text_in, None, cfg.delay_steps)
            return None

        phases = {"text": _Phase(text), "audio": _Phase(audio), "commit": _Phase(commit)}
        return phases

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Warm up (and capture CUDA graphs, one per bucket and phase), then start the thread."""
        if self.started:
            return
        with torch.no_grad():
            buckets = self.buckets if self.device.type == "cuda" else self.buckets[:1]
            for n in buckets:
                self._warm(n)
            everything = torch.ones(self.max_batch, dtype=torch.bool, device=self.device)
            self.fs.reset(everything)
            self.ms.reset(everything)
            self.fs.exec_mask.fill_(False)
            self.ms.exec_mask.fill_(False)
        self._thread = threading.Thread(target=self._run, name="dsm-frame-loop", daemon=True)
        self.started = True
        self._thread.start()

    def _warm(self, n: int) -> None:
        self.fs.exec_mask[:n] = True
        self.ms.exec_mask[:n] = True
        phases = self._phases[n]
        if self.cuda_graphs:
            # The text graph's h feeds the audio graph, so the text phase is captured first.
            for p in ("text", "audio", "commit"):
                phases[p].capture()
            torch.cuda.synchronize()
        else:
            for _ in range(2):
                phases["text"]()
                phases["audio"]()
                phases["commit"]()

    def close(self) -> None:
        """Stop the thread; live sessions end with an error."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._thread = None

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

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                if self._stopping:
                    break
            try:
                self._admit()
                self._intake()
                run, wait_s = self._runnable()
            except Exception as exc:  # a bug in the bookkeeping: fail everyone, keep serving
                log.exception("frame loop bookkeeping failed")
                self._fail_all(exc)
                continue
            if not run:
                with self._cond:
                    if not self._stopping and not self._pending_work():
                        self._cond.wait(timeout=wait_s if wait_s is not None else 1.0)
                continue
            try:
                self._step(run)
            except Exception as exc:
                log.exception("frame loop step failed")
                self._fail_all(exc)
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
            if not self.greedy:
                gen = torch.Generator()
                gen.manual_seed(session.seed if session.seed is not None else random.getrandbits(63))
            self._slots[index] = _Slot(session, index, self.tts.machine.new_state([]), gen)

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
        now = time.monotonic()
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

    # -- one step ------------------------------------------------------------------------
    def _step(self, run: list[_Slot]) -> None:
        cfg, tts = self.cfg, self.tts
        top = max(self._slots) + 1
        n = next(b for b in self.buckets if b >= top)
        phases = self._phases[n]
        exec_host = self._host_exec
        exec_host.zero_()
        mimi_host = self._host_mimi
        mimi_host.zero_()
        any_depformer = False
        audio_start = cfg.max_delay + cfg.delay_steps
        for slot in run:
            exec_host[slot.index] = True
            if slot.t >= cfg.delay_steps:
                any_depformer = True
            if slot.t >= audio_start:
                mimi_host[slot.index] = True
            if slot.gen is not None:
                self._host_text_noise[slot.index].exponential_(1, generator=slot.gen)
        self.fs.exec_mask.copy_(exec_host.to(self.device, non_blocking=True))
        self.ms.exec_mask.copy_(mimi_host.to(self.device, non_blocking=True))
        if not self.greedy:
            self.text_noise[:n].copy_(self._host_text_noise[:n], non_blocking=True)

        sampled = phases["text"]().tolist()

        fed_host = self._host_text_in
        fed_host.fill_(tts.ids.pad)
        failed: list[tuple[_Slot, BaseException]] = []
        for slot in run:
            try:
                tok = sampled[slot.index]
                fed = tts.machine.process(slot.t, slot.state, tok)
                fed_host[slot.index] = fed
                slot.session.tokens.append((tok, fed))
                if slot.gen is not None and slot.t >= cfg.delay_steps:
                    for k in range(self.n_q):
                        self._host_audio_noise[slot.index, k].exponential_(1, generator=slot.gen)
            except Exception as exc:
                failed.append((slot, exc))
        self.text_in.copy_(fed_host.to(self.device, non_blocking=True))
        if any_depformer and not self.greedy:
            self.audio_noise[:n].copy_(self._host_audio_noise[:n], non_blocking=True)

        pcm = None
        if any_depformer:
            out = phases["audio"]()
            if mimi_host[:n].any():
                pcm = out.float().cpu().numpy()
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
                self._publish(slot, pcm)
            except Exception as exc:
                self._free(slot, exc)

    def _publish(self, slot: _Slot, pcm: np.ndarray | None) -> None:
        """Word events, the slot's audio frame, and the end of its turn."""
        cfg, tts = self.cfg, self.tts
        s, session = slot.state, slot.session
        rate = cfg.mimi.frame_rate
        while slot.words_out < len(s.transcript):
            word, step = s.transcript[slot.words_out]
            slot.words_out += 1
            session.on_word(word, max(0.0, (step - SKIP_FRAMES) / rate))
        t = slot.t
        slot.t += 1
        session.steps = slot.t
        if pcm is not None and t >= cfg.max_delay + cfg.delay_steps:
            j = slot.frames
            if s.end_step is None or j < SKIP_FRAMES + s.end_step:
                slot.frames += 1
                if j >= SKIP_FRAMES:
                    if session.first_audio_time is None:
                        session.first_audio_time = time.monotonic()
                        session.first_audio_step = t
                    slot.audio_s += self.frame_size / cfg.mimi.sample_rate
                    session.on_audio(pcm[slot.index].copy())
        if s.end_step is not None:
            finished = slot.frames >= SKIP_FRAMES + s.end_step
            if slot.t >= s.end_step + cfg.delay_steps + tts.final_padding or finished:
                self._free(slot, None)
                return
        if slot.t >= tts.max_steps:
            self._free(slot, None)

    def _free(self, slot: _Slot, error: BaseException | None) -> None:
        if self._slots.get(slot.index) is slot:
            del self._slots[slot.index]
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
        for slot in list(self._slots.values()):
            self._free(slot, exc)
