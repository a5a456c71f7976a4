"""Playout: engine audio of any size and rate in, 20 ms frames at 48 kHz out.

One :class:`Playout` per session. Turns are queued in order; each turn's PCM is resampled to
48 kHz (:class:`~myna.audio.resample.TurnResampler`) and buffered. The transport calls :meth:`Playout.next_frame`
once per 20 ms deadline (see :class:`myna.rtc.track.PacedAudioTrack`) and always gets exactly
960 samples: the head turn's audio, the next turn's audio without a gap once it ends, or silence
while idle. Events (``first_audio``, ``word``, ``turn_done``) fire when the frame that carries
them is handed out, so they describe what the listener is about to hear, not what the engine
has produced.

Rules:

- **Start: TTFA first.** What the listener waits for is the first syllable, so a turn's first
  audio leaves at the first frame deadline after it is ready (a frame plus the fade buffered,
  or the turn's input ended), and no rule may hold ready first audio longer than the budget
  ``max_hold_s`` (``myna serve --max-hold-ms``, default :data:`MAX_HOLD_S` = 100 ms): a turn is
  started at the last deadline that keeps the wait within it. ``first_audio.pre_roll_ms`` is
  the wait: first chunk's arrival → the deadline of the frame that starts the turn (ms), never
  more than the budget (a transport that wakes late for that deadline, on a busy host, adds to
  what the listener waits, not to what playout held).
  Why not wait for a safe buffer: the old rule held first audio to avoid a predicted underrun,
  and on a loaded worker a two-clause reply was held until it was nearly all made (0.8–4.8 s
  before the first syllable, while the first clause had been ready for most of it). A listener
  prefers hearing the first words now and a pause later to silence now.
- **Producers whose chunks end at word boundaries** (``chunks_end_at_words``: Piper, a clause
  or a piece of one per chunk). Such a turn starts at once, and when its next chunk is late
  the turn pauses at the boundary: a **gap**, silence between two words, not a cut word. It
  resumes at the first frame deadline after the chunk arrives. Gaps are measured per turn in
  ``turn_done``: ``gap_ms`` (``count``, ``total``, ``longest``: milliseconds of silence
  inserted) and ``gaps`` (``[start_ms, duration_ms]``: where in the turn's audio each gap
  began and how long it lasted; the first :data:`MAX_GAPS_LISTED`).
- **Frame-level producers** (DSM: chunks of 80 ms that may end inside a word). The start may be
  held, within the budget, by a pre-roll rule (by default
  :class:`myna.audio.preroll.JitterAwarePreRoll`, which predicts underruns from the producer's
  measured rate and jitter; :mod:`myna.audio.preroll`). That rule earns its place mid-turn:
  when a playing turn that has not ended holds less than a frame plus the fade length, the
  frame plays what is there with a fade-out over its last 5 ms, then silence (an
  **underrun**: a word is cut), and the turn resumes when the rule says the buffer is enough
  again (re-buffering), with a 5 ms fade-in, so a producer slower than real time stalls rarely
  instead of on every chunk. One starvation episode counts one underrun (``turn_done.underruns``).
- **Events.** ``word`` events of a turn follow its ``first_audio``: words that start in the
  quiet lead-in are sent with the first audible frame.
- **Barge-in.** :meth:`Playout.interrupt` keeps only the next 5 ms of the playing turn, faded to
  zero, for the next frame; everything else queued is dropped.
- **Idle.** With nothing queued :meth:`Playout.next_frame` returns one shared, read-only block
  of zeros: no allocation, no arithmetic.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from myna.audio.onset import first_audible_sample
from myna.audio.preroll import JitterAwarePreRoll, PreRollRule, ProducerStats
from myna.audio.resample import TurnResampler
from myna.events import FirstAudio, TurnDone, Word

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960  # 20 ms at 48 kHz
FADE_SAMPLES = 240  # 5 ms at 48 kHz
#: Default budget: the longest any rule may hold a turn's ready first audio (s); see "Start".
MAX_HOLD_S = 0.1
#: Wake-up lateness of a frame deadline the budget allows for (s): a turn is not held into a
#: deadline closer than this to the end of the budget.
HOLD_SLACK_S = 0.01
#: ``turn_done.gaps`` lists at most this many gaps (``gap_ms`` counts them all).
MAX_GAPS_LISTED = 32

Event = dict
EventSink = Callable[[Event], None]

#: What :meth:`Playout.next_frame` returns while idle: one shared read-only frame of zeros
#: (a transport may test ``frame is IDLE_FRAME`` to take a cheap path).
IDLE_FRAME = np.zeros(FRAME_SAMPLES, dtype=np.int16)
IDLE_FRAME.flags.writeable = False


class Gaps:
    """A turn's gaps: where in the turn's audio each began and how long it lasted (ms)."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []

    def add(self, start_ms: float, length_ms: float) -> None:
        self.spans.append((start_ms, length_ms))

    def fields(self) -> dict:
        """``gap_ms`` (``count``, ``total``, ``longest``) and ``gaps`` (``[start_ms,
        duration_ms]``, the first :data:`MAX_GAPS_LISTED`), as ``turn_done`` carries them."""
        lengths = [n for _, n in self.spans]
        return {
            "gap_ms": {"count": len(lengths), "total": round(sum(lengths), 1), "longest": round(max(lengths, default=0.0), 1)},
            "gaps": [[round(at, 1), round(n, 1)] for at, n in self.spans[:MAX_GAPS_LISTED]],
        }


class _Turn:
    """One turn's queued audio and bookkeeping (48 kHz float32)."""

    def __init__(self, turn_id: str, text_at: float):
        self.turn_id = turn_id
        self.text_at = text_at  # monotonic time the first text chunk arrived (s)
        self.chunks: deque[np.ndarray] = deque()  # queued 48 kHz audio, oldest first
        self.buffered = 0  # samples queued
        self.resampler = TurnResampler(SAMPLE_RATE)
        self.words: deque[tuple[int, str]] = deque()  # (sample offset at 48 kHz, word)
        self.played = 0  # samples handed out so far
        self.ended = False
        self.playing = False
        self.first_audio_sent = False
        self.starving = False
        self.starved_at: float | None = None  # when the current gap or underrun began (clock s)
        self.resume_fade = False
        self.underruns = 0
        self.stats = ProducerStats(text_at)
        self.pre_roll_ms = 0.0  # first chunk's arrival → start of playout (ms)
        self.gaps = Gaps()
        self.gap_open: list[int] | None = None  # [start, silence so far] in samples, of the gap playing now

    def close_gap(self, keep: bool) -> None:
        """End the gap in progress; ``keep`` it when audio follows it (silence at the very end
        of a turn is the turn's end, not a pause)."""
        if self.gap_open is not None and keep:
            self.gaps.add(self.gap_open[0] / 48.0, self.gap_open[1] / 48.0)
        self.gap_open = None

    def done_event(self, interrupted: bool = False) -> dict:
        """The ``turn_done`` event as of now (see the module docstring)."""
        return TurnDone(turn_id=self.turn_id, audio_ms=round(self.played / 48.0, 1), underruns=self.underruns,
                        **self.gaps.fields(), interrupted=interrupted).to_dict()

    def append(self, x: np.ndarray) -> None:
        """Queue 48 kHz float32 audio ``[n]`` (kept as it is: not the caller's array)."""
        if len(x):
            self.chunks.append(x)
            self.buffered += len(x)

    def take(self, n: int) -> np.ndarray:
        """Remove and return up to ``n`` samples (a new array; queued chunks are never copied whole)."""
        n = min(n, self.buffered)
        out = np.empty(n, dtype=np.float32)
        filled = 0
        while filled < n:
            head = self.chunks[0]
            k = min(n - filled, len(head))
            out[filled : filled + k] = head[:k]
            filled += k
            if k == len(head):
                self.chunks.popleft()
            else:
                self.chunks[0] = head[k:]
        self.buffered -= n
        return out

    def peek(self, n: int) -> np.ndarray:
        """A copy of the next ``n`` samples (fewer if fewer are queued), left in the queue."""
        out = self.take(n)
        if len(out):
            self.chunks.appendleft(out.copy())
            self.buffered += len(out)
        return out


class Playout:
    """Turn queue → 20 ms, 48 kHz frames with events.

    Args:
        on_event: called with contract event dicts (``first_audio``, ``word``, ``turn_done``)
            from inside :meth:`next_frame`.
        clock: monotonic clock in seconds (injectable for tests).
        pre_roll: for frame-level producers, when a turn starts (within the budget) or resumes
            after an underrun; default a fresh :class:`~myna.audio.preroll.JitterAwarePreRoll`
            (it learns across the session's turns).
        chunks_end_at_words: the producer's chunks end at word boundaries (see "Producers
            whose chunks end at word boundaries"): start at once, pause at a late chunk.
        max_hold_s: the budget: the longest ready first audio may be held (s).
    """

    def __init__(
        self,
        on_event: EventSink,
        clock: Callable[[], float] = time.monotonic,
        pre_roll: PreRollRule | None = None,
        *,
        chunks_end_at_words: bool = False,
        max_hold_s: float = MAX_HOLD_S,
    ):
        self._on_event = on_event
        self._clock = clock
        self.pre_roll: PreRollRule = pre_roll if pre_roll is not None else JitterAwarePreRoll()
        self.chunks_end_at_words = chunks_end_at_words
        self.max_hold_s = max_hold_s
        self._turns: deque[_Turn] = deque()
        self._by_id: dict[str, _Turn] = {}
        self._tail: np.ndarray | None = None  # faded remainder after a barge-in
        self._due = 0.0  # when the frame being made is due (clock s)

    # -- producer side -------------------------------------------------------------------
    def begin_turn(self, turn_id: str, text_at: float) -> None:
        """Queue a new turn; ``text_at`` is when its first text chunk arrived (``clock`` s)."""
        turn = _Turn(turn_id, text_at)
        self._turns.append(turn)
        self._by_id[turn_id] = turn

    def push_audio(self, turn_id: str, pcm: np.ndarray, sample_rate: int) -> None:
        """Queue PCM for a turn: float32 mono ``[n]`` in [-1, 1] at ``sample_rate`` Hz.

        Audio for a turn that was dropped (interrupted) is ignored.

        Raises:
            ValueError: if the sample rate changes within a turn.
        """
        turn = self._by_id.get(turn_id)
        if turn is not None and not turn.ended:
            x = turn.resampler.resample(pcm, sample_rate)
            turn.append(x if x is not pcm else x.copy())  # (at 48 kHz already: the caller's array)
            turn.stats.add(self._clock(), len(pcm) / sample_rate)

    def push_word(self, turn_id: str, word: str, start_ms: float) -> None:
        """Schedule a ``word`` event at ``start_ms`` into the turn's audio."""
        turn = self._by_id.get(turn_id)
        if turn is not None:
            turn.words.append((int(round(start_ms * SAMPLE_RATE / 1000)), word))

    def end_turn(self, turn_id: str) -> None:
        """No more audio for this turn: flush the resampler; ``turn_done`` follows its last frame."""
        turn = self._by_id.get(turn_id)
        if turn is None or turn.ended:
            return
        turn.append(turn.resampler.flush())
        turn.ended = True

    def interrupt(self) -> list[dict]:
        """Drop every queued turn (barge-in); returns each one's ``turn_done`` event (audio
        handed out, underruns, gaps) with ``"interrupted": True``, playing turn first.

        The playing turn's next 5 ms are kept, faded to zero, so the cut makes no click;
        nothing else of any dropped turn is handed out.
        """
        if self._turns and self._turns[0].playing and not self._turns[0].starving:
            head = self._turns[0]  # (a starving turn already faded to zero)
            tail = head.peek(FADE_SAMPLES)
            tail *= np.linspace(1.0, 0.0, len(tail), endpoint=False, dtype=np.float32)
            self._tail = tail
        dropped = []
        for turn in self._turns:
            turn.close_gap(keep=False)
            dropped.append(turn.done_event(interrupted=True))
        self._turns.clear()
        self._by_id.clear()
        return dropped

    @property
    def idle(self) -> bool:
        """True when no turn is queued."""
        return not self._turns

    def audio_runs_out_at(self) -> float:
        """When the audio queued now (every turn's) will have played out (``clock`` s): a
        synthesis job for this session is due then. When the playing turn is in a gap or an
        underrun with nothing queued, the instant its audio ran out; now when idle."""
        head = self._turns[0] if self._turns else None
        if head is not None and head.starving and head.starved_at is not None and not head.buffered:
            return head.starved_at
        return self._clock() + sum(t.buffered for t in self._turns) / SAMPLE_RATE

    # -- transport side ------------------------------------------------------------------
    def next_frame(self, due: float | None = None) -> np.ndarray:
        """The next 20 ms: int16 mono, shape ``[960]``; silence when nothing is ready.

        Args:
            due: when the transport is due to send this frame (``clock`` s; default: now). The
                start rule and ``pre_roll_ms`` are timed against it, so a transport that wakes
                late (a busy host) is not counted as audio held.

        Idle frames are one shared read-only array; copy before writing to a frame.
        """
        self._due = self._clock() if due is None else due
        if self._tail is None and not self._turns:
            return IDLE_FRAME
        out = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        filled = 0
        if self._tail is not None:
            out[: len(self._tail)] = self._tail
            filled = len(self._tail)
            self._tail = None
        while filled < FRAME_SAMPLES and self._turns:
            turn = self._turns[0]
            need = FRAME_SAMPLES - filled
            ready = turn.buffered >= need + FADE_SAMPLES or turn.ended
            if not turn.playing or turn.starving:
                if not (turn.ended or (ready and self._may_start(turn))):
                    break  # pre-roll, a gap, or re-buffering after an underrun
                if not turn.playing:
                    turn.playing = True
                    if turn.stats.n:
                        turn.pre_roll_ms = round(max(0.0, 1000.0 * (self._due - turn.stats.times[0])), 1)
                turn.close_gap(keep=turn.buffered > 0)
            seg = turn.take(need)
            if turn.resume_fade and len(seg):
                k = min(FADE_SAMPLES, len(seg))
                seg[:k] *= np.linspace(0.0, 1.0, k, endpoint=False, dtype=np.float32)
                turn.resume_fade = False
            if not ready:  # underrun: fade out what is left and play silence after it
                k = min(FADE_SAMPLES, len(seg))
                if k:
                    seg[-k:] *= np.linspace(1.0, 0.0, k, dtype=np.float32)
                if not turn.starving:
                    turn.starved_at = self._clock() + len(seg) / SAMPLE_RATE
                    if self.chunks_end_at_words:
                        turn.gap_open = [turn.played + len(seg), 0]
                    else:
                        turn.underruns += 1
                    turn.starving = True
                turn.resume_fade = True
            else:
                turn.starving = False
            out[filled : filled + len(seg)] = seg
            self._emit_turn_events(turn, seg, filled)
            filled += len(seg)
            if not ready:
                break
            if turn.ended and not turn.buffered:
                self._finish(turn)
        if self._turns and self._turns[0].gap_open is not None:
            self._turns[0].gap_open[1] += FRAME_SAMPLES - filled  # silence played in the gap
        np.multiply(out, 32767.0, out=out)
        np.minimum(out, 32767.0, out=out)  # (np.clip costs more than the rest of the frame)
        np.maximum(out, -32767.0, out=out)
        return out.astype(np.int16)

    def _may_start(self, turn: _Turn) -> bool:
        """With a frame and the fade buffered: may the turn start (or resume) at this deadline?"""
        if self.chunks_end_at_words:
            return True  # a start or the end of a gap: never held
        now = self._due
        if not turn.playing and now + FRAME_SAMPLES / SAMPLE_RATE + HOLD_SLACK_S - turn.stats.times[0] > self.max_hold_s:
            return True  # the next deadline (if it wakes a little late) would be past the budget
        return self.pre_roll.ready(turn.stats, turn.buffered / SAMPLE_RATE, now)

    def _emit_turn_events(self, turn: _Turn, seg: np.ndarray, at: int) -> None:
        if not turn.first_audio_sent and len(seg):
            onset = first_audible_sample(seg, SAMPLE_RATE)
            if onset is not None:
                turn.first_audio_sent = True
                self._on_event(FirstAudio(turn_id=turn.turn_id, server_ttfa_ms=round(1000.0 * (self._clock() - turn.text_at), 1),
                                          pre_roll_ms=turn.pre_roll_ms).to_dict())
        turn.played += len(seg)
        if turn.first_audio_sent:
            self._emit_words(turn, upto=turn.played)

    def _emit_words(self, turn: _Turn, upto: float) -> None:
        while turn.words and turn.words[0][0] < upto:
            offset, word = turn.words.popleft()
            self._on_event(Word(turn_id=turn.turn_id, word=word, start_ms=round(offset / 48.0, 1)).to_dict())

    def _finish(self, turn: _Turn) -> None:
        self._turns.popleft()
        self._by_id.pop(turn.turn_id, None)
        self.pre_roll.turn_finished(turn.stats)
        self._emit_words(turn, upto=float("inf"))  # words placed past the end of the audio
        turn.close_gap(keep=False)
        self._on_event(turn.done_event())
