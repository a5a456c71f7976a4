"""Playout: engine audio of any size and rate in, 20 ms frames at 48 kHz out (the paced output).

One :class:`Playout` per session whose transport plays frames in real time (WebRTC, LiveKit
rooms). Turns are queued in order (:class:`~myna.audio.turns.TurnQueue`: each turn's PCM is
resampled to 48 kHz and buffered, its words placed). The transport calls :meth:`Playout.next_frame`
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
  began and how long it lasted; the first :data:`~myna.audio.turns.MAX_GAPS_LISTED`).
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
- **Prepared turns** (held, :meth:`~myna.audio.turns.TurnQueue.commit`): a held turn at the
  head plays nothing (silence), its audio buffering; once committed it starts by the start rule,
  so a turn whose synthesis has ended starts at the first frame deadline after the commit.
  ``pre_roll_ms`` is then counted from the commit (or the first chunk, if later).
- **Pause** (:meth:`Playout.pause`): the playing turn's next 5 ms go out faded to zero, then
  silence; the turn is rewound to the start of the word being heard (the latest ``word`` sent:
  the audio since it is kept, at most :data:`MAX_REWIND_S`), and that word's event is queued
  again. :meth:`Playout.resume` plays on from there with a 5 ms fade-in, so the cut word is
  heard again whole, once. Turns behind the paused one wait.
- **Idle.** With nothing queued :meth:`Playout.next_frame` returns one shared, read-only block
  of zeros: no allocation, no arithmetic.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from myna.audio.preroll import JitterAwarePreRoll, PreRollRule, ProducerStats
from myna.audio.turns import EventSink, OutputTurn, TurnQueue, to_s16
from myna.events import Event, Paused, Resumed

#: The frame every paced transport sends: 20 ms of mono audio at 48 kHz.
SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960
FRAME_SECONDS = FRAME_SAMPLES / SAMPLE_RATE
FADE_SAMPLES = 240  # 5 ms at 48 kHz
#: Default budget: the longest any rule may hold a turn's ready first audio (s); see "Start".
MAX_HOLD_S = 0.1
#: Wake-up lateness of a frame deadline the budget allows for (s): a turn is not held into a
#: deadline closer than this to the end of the budget.
HOLD_SLACK_S = 0.01
#: The most audio a turn keeps to rewind to the start of a cut word on :meth:`Playout.pause` (s).
MAX_REWIND_S = 10.0

#: What :meth:`Playout.next_frame` returns while idle: one shared read-only frame of zeros
#: (a transport may test ``frame is IDLE_FRAME`` to take a cheap path).
IDLE_FRAME = np.zeros(FRAME_SAMPLES, dtype=np.int16)
IDLE_FRAME.flags.writeable = False


class _Turn(OutputTurn):
    """One turn's queued 48 kHz audio and the paced path's own bookkeeping."""

    def __init__(self, turn_id: str, text_at: float, rate: int):
        super().__init__(turn_id, text_at, rate)
        self.playing = False
        self.starving = False
        self.starved_at: float | None = None  # when the current gap or underrun began (clock s)
        self.resume_fade = False
        self.stats = ProducerStats(text_at)
        self.pre_roll_ms = 0.0  # first chunk's arrival → start of playout (ms)
        self.gap_open: list[int] | None = None  # [start, silence so far] in samples, of the gap playing now
        self.history: deque[np.ndarray] = deque()  # audio handed out since the latest word's start
        self.history_start = 0  # sample offset of history[0]
        self.history_len = 0

    def remember(self, seg: np.ndarray) -> None:
        """``seg`` (as queued, before any fade) was just handed out at offset ``played``: keep
        it while it is part of the word being heard (for :meth:`Playout.pause`)."""
        if not len(seg):
            return
        if not self.history:
            self.history_start = self.played
        self.history.append(seg.copy())
        self.history_len += len(seg)
        keep_from = self.last_word[0] if self.last_word is not None else 0
        keep_from = max(keep_from, self.played + len(seg) - int(MAX_REWIND_S * self.rate))
        while self.history and self.history_start + len(self.history[0]) <= keep_from:
            n = len(self.history.popleft())
            self.history_start += n
            self.history_len -= n

    def rewind(self) -> int:
        """Put back the audio since the start of the word being heard (what :meth:`remember`
        kept) and queue that word's event again; returns the new ``played`` offset."""
        start = self.last_word[0] if self.last_word is not None else 0
        start = max(start, self.history_start)
        back = [x for x in self.history]
        audio = np.concatenate(back) if back else np.zeros(0, dtype=np.float32)
        audio = audio[start - self.history_start : self.played - self.history_start]
        if len(audio):
            self.chunks.appendleft(audio)
            self.buffered += len(audio)
            self.played -= len(audio)
        if self.last_word is not None and self.last_word[0] >= self.played:
            self.words.appendleft(self.last_word)
        self.history.clear()
        self.history_len = 0
        return self.played

    def close_gap(self, keep: bool) -> None:
        """End the gap in progress; ``keep`` it when audio follows it (silence at the very end
        of a turn is the turn's end, not a pause)."""
        if self.gap_open is not None and keep:
            self.gaps.add(1000.0 * self.gap_open[0] / self.rate, 1000.0 * self.gap_open[1] / self.rate)
        self.gap_open = None

    def peek(self, n: int) -> np.ndarray:
        """A copy of the next ``n`` samples (fewer if fewer are queued), left in the queue."""
        out = self.take(n)
        if len(out):
            self.chunks.appendleft(out.copy())
            self.buffered += len(out)
        return out


class Playout(TurnQueue):
    """Turn queue → 20 ms, 48 kHz frames with events.

    Args:
        on_event: the session's event sink: ``turn_started`` when a turn is queued;
            ``first_audio``, ``word`` and ``turn_done`` from inside :meth:`next_frame`.
        clock: monotonic clock in seconds (injectable for tests).
        pre_roll: for frame-level producers, when a turn starts (within the budget) or resumes
            after an underrun; default a fresh :class:`~myna.audio.preroll.JitterAwarePreRoll`
            (it learns across the session's turns).
        chunks_end_at_words: the producer's chunks end at word boundaries (see "Producers
            whose chunks end at word boundaries"): start at once, pause at a late chunk.
        max_hold_s: the budget: the longest ready first audio may be held (s).
    """

    turn_class = _Turn

    def __init__(
        self,
        on_event: EventSink,
        clock: Callable[[], float] = time.monotonic,
        pre_roll: PreRollRule | None = None,
        *,
        chunks_end_at_words: bool = False,
        max_hold_s: float = MAX_HOLD_S,
    ):
        super().__init__(on_event, SAMPLE_RATE, clock, chunks_end_at_words=chunks_end_at_words)
        self.pre_roll: PreRollRule = pre_roll if pre_roll is not None else JitterAwarePreRoll()
        self.max_hold_s = max_hold_s
        self._tail: np.ndarray | None = None  # faded remainder after a barge-in
        self._due = 0.0  # when the frame being made is due (clock s)
        self._paused: _Turn | None = None  # the turn :meth:`pause` stopped

    @classmethod
    def for_session(cls, session) -> "Playout":
        """The playout of a :class:`~myna.session.Session`: its events, clock, start budget and
        its engine's kind of chunks."""
        return cls(session.on_output_event, clock=session.clock, max_hold_s=session.max_hold_s,
                   chunks_end_at_words=session.engine.chunks_end_at_words)

    # -- producer side (TurnQueue) ------------------------------------------------------------
    def _audio_added(self, turn: _Turn, seconds: float) -> None:
        turn.stats.add(self._clock(), seconds)

    def interrupt(self) -> list[Event]:
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
        for turn in self._turns:
            turn.close_gap(keep=False)
        self._paused = None
        return super().interrupt()

    def _cancelled(self, turn: _Turn, head: bool) -> list[Event]:
        """As :meth:`interrupt` for one turn: a playing turn's next 5 ms are kept, faded to
        zero; the next turn starts after them by the start rule."""
        if head and turn.playing and not turn.starving:
            tail = turn.peek(FADE_SAMPLES)
            tail *= np.linspace(1.0, 0.0, len(tail), endpoint=False, dtype=np.float32)
            self._tail = tail
        turn.close_gap(keep=False)
        if turn is self._paused:
            self._paused = None  # the pause ends with its turn
        return super()._cancelled(turn, head)

    def _fade_tail(self, head: _Turn) -> None:
        """Keep the playing turn's next 5 ms, faded to zero, for the next frame."""
        tail = head.peek(FADE_SAMPLES)
        tail *= np.linspace(1.0, 0.0, len(tail), endpoint=False, dtype=np.float32)
        self._tail = tail

    def pause(self) -> str | None:
        """Stop playout now (see "Pause"): the head turn's next 5 ms fade out, it is rewound to
        the start of the word being heard and holds there until :meth:`resume`; its ``paused``
        event goes out; returns its ``turn_id``, or None when no turn is queued. Pausing again
        is a no-op (None)."""
        if self._paused is not None or not self._turns:
            return None
        head = self._turns[0]
        at = head.played
        if head.playing and not head.starving:
            self._fade_tail(head)
            at += len(self._tail)
        head.close_gap(keep=False)
        start = head.rewind() if head.playing else head.played
        head.starving = False
        head.resume_fade = True
        self._paused = head
        self._on_event(Paused(turn_id=head.turn_id, at_ms=round(1000.0 * at / self.rate, 1),
                              resume_ms=round(1000.0 * start / self.rate, 1)))
        return head.turn_id

    def resume(self) -> bool:
        """Play the paused turn on from where :meth:`pause` left it (its ``resumed`` event goes
        out); False when nothing is paused (a resume that crossed the turn's end)."""
        turn, self._paused = self._paused, None
        if turn is None or self._by_id.get(turn.turn_id) is not turn:
            return False
        self._on_event(Resumed(turn_id=turn.turn_id, from_ms=round(1000.0 * turn.played / self.rate, 1)))
        return True

    @property
    def paused_turn(self) -> str | None:
        """The ``turn_id`` of the paused turn; None when not paused."""
        return self._paused.turn_id if self._paused is not None else None

    def _committed(self, turn: _Turn) -> None:
        pass

    def reset(self) -> None:
        super().reset()
        self._tail = None
        self._paused = None

    def audio_runs_out_at(self) -> float:
        """When the audio queued now (every turn's) will have played out (``clock`` s): a
        synthesis job for this session is due then. When the playing turn is in a gap or an
        underrun with nothing queued, the instant its audio ran out; now when idle."""
        head = self._turns[0] if self._turns else None
        if head is not None and head.starving and head.starved_at is not None and not head.buffered:
            return head.starved_at
        return super().audio_runs_out_at()

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
        while filled < FRAME_SAMPLES and self._turns and self._paused is None:
            turn = self._turns[0]
            if turn.held:
                break  # prepared, not committed: silence until commit
            need = FRAME_SAMPLES - filled
            ready = turn.buffered >= need + FADE_SAMPLES or turn.ended
            if not turn.playing or turn.starving:
                if not (turn.ended or (ready and self._may_start(turn))):
                    break  # pre-roll, a gap, or re-buffering after an underrun
                if not turn.playing:
                    turn.playing = True
                    if turn.stats.n:
                        turn.pre_roll_ms = round(max(0.0, 1000.0 * (self._due - self._ready_since(turn))), 1)
                turn.close_gap(keep=turn.buffered > 0)
            seg = turn.take(need)
            turn.remember(seg)
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
            turn.check_first_audio(seg, self._clock(), turn.pre_roll_ms, self._on_event)
            turn.advance(len(seg), self._on_event)
            filled += len(seg)
            if not ready:
                break
            if turn.ended and not turn.buffered:
                self._finish(turn)
        if self._turns and self._turns[0].gap_open is not None:
            self._turns[0].gap_open[1] += FRAME_SAMPLES - filled  # silence played in the gap
        return to_s16(out, scratch=True)

    def _may_start(self, turn: _Turn) -> bool:
        """With a frame and the fade buffered: may the turn start (or resume) at this deadline?"""
        if self.chunks_end_at_words:
            return True  # a start or the end of a gap: never held
        now = self._due
        if not turn.playing and now + FRAME_SECONDS + HOLD_SLACK_S - self._ready_since(turn) > self.max_hold_s:
            return True  # the next deadline (if it wakes a little late) would be past the budget
        return self.pre_roll.ready(turn.stats, turn.buffered / SAMPLE_RATE, now)

    @staticmethod
    def _ready_since(turn: _Turn) -> float:
        """When the turn could first have started: its first chunk, or its commit if later."""
        first = turn.stats.times[0]
        return first if turn.committed_at is None else max(first, turn.committed_at)

    def _finish(self, turn: _Turn) -> None:
        self.pre_roll.turn_finished(turn.stats)
        turn.close_gap(keep=False)
        super()._finish(turn)
