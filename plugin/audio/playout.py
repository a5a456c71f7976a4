"""Playout: engine audio of any size and rate in, 20 ms frames at 48 kHz out.

One :class:`Playout` per session. Turns are queued in order; each turn's PCM is resampled to
48 kHz by a per-turn soxr stream and buffered. The transport calls :meth:`Playout.next_frame`
once per 20 ms deadline (see :class:`myna.rtc.track.PacedAudioTrack`) and always gets exactly
960 samples: the head turn's audio, the next turn's audio without a gap once it ends, or silence
while idle. Events (``first_audio``, ``word``, ``turn_done``) fire when the frame that carries
them is handed out, so they describe what the listener is about to hear, not what the engine
has produced.

Rules:

- **Pre-roll.** A turn starts playing once it holds one frame plus the fade length, or once its
  input has ended (so short turns are never held back).
- **Underrun.** When a playing turn that has not ended holds less than a frame plus the fade
  length, the frame plays what is there with a fade-out over its last 5 ms, then silence; the
  next audio fades back in. One starvation episode counts one underrun.
- **Barge-in.** :meth:`Playout.interrupt` keeps only the next 5 ms of the playing turn, faded to
  zero, for the next frame; everything else queued is dropped.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np
import soxr

from myna.audio.onset import first_audible_sample

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960  # 20 ms at 48 kHz
FADE_SAMPLES = 240  # 5 ms at 48 kHz

Event = dict
EventSink = Callable[[Event], None]


class _Turn:
    """One turn's queued audio and bookkeeping (48 kHz float32)."""

    def __init__(self, turn_id: str, text_at: float):
        self.turn_id = turn_id
        self.text_at = text_at  # monotonic time the first text chunk arrived (s)
        self.buf = np.zeros(0, dtype=np.float32)
        self.resampler: soxr.ResampleStream | None = None
        self.in_rate: int | None = None
        self.words: deque[tuple[int, str]] = deque()  # (sample offset at 48 kHz, word)
        self.played = 0  # samples handed out so far
        self.ended = False
        self.playing = False
        self.first_audio_sent = False
        self.starving = False
        self.resume_fade = False
        self.underruns = 0

    def append(self, pcm: np.ndarray, sample_rate: int, last: bool = False) -> None:
        if self.resampler is None and sample_rate != SAMPLE_RATE:
            self.resampler = soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
            self.in_rate = sample_rate
        if self.in_rate is not None and sample_rate != self.in_rate:
            raise ValueError(f"sample rate changed within a turn: {self.in_rate} -> {sample_rate} Hz")
        x = np.asarray(pcm, dtype=np.float32)
        if self.resampler is not None:
            x = self.resampler.resample_chunk(x, last=last)
        if len(x):
            self.buf = np.concatenate((self.buf, x)) if len(self.buf) else x.copy()

    def take(self, n: int) -> np.ndarray:
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


class Playout:
    """Turn queue → 20 ms, 48 kHz frames with events.

    Args:
        on_event: called with contract event dicts (``first_audio``, ``word``, ``turn_done``)
            from inside :meth:`next_frame`.
        clock: monotonic clock in seconds (injectable for tests).
    """

    def __init__(self, on_event: EventSink, clock: Callable[[], float] = time.monotonic):
        self._on_event = on_event
        self._clock = clock
        self._turns: deque[_Turn] = deque()
        self._by_id: dict[str, _Turn] = {}
        self._tail: np.ndarray | None = None  # faded remainder after a barge-in

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
            turn.append(pcm, sample_rate)

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
        if turn.resampler is not None:
            turn.append(np.zeros(0, dtype=np.float32), turn.in_rate, last=True)
        turn.ended = True

    def interrupt(self) -> list[str]:
        """Drop every queued turn (barge-in); returns their ids, playing turn first.

        The playing turn's next 5 ms are kept, faded to zero, so the cut makes no click;
        nothing else of any dropped turn is handed out.
        """
        if self._turns and self._turns[0].playing:
            head = self._turns[0]
            tail = head.buf[:FADE_SAMPLES].copy()
            tail *= np.linspace(1.0, 0.0, len(tail), endpoint=False, dtype=np.float32)
            self._tail = tail
        dropped = [t.turn_id for t in self._turns]
        self._turns.clear()
        self._by_id.clear()
        return dropped

    @property
    def idle(self) -> bool:
        """True when no turn is queued."""
        return not self._turns

    # -- transport side ------------------------------------------------------------------
    def next_frame(self) -> np.ndarray:
        """The next 20 ms: int16 mono, shape ``[960]``; silence when nothing is ready."""
        out = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        filled = 0
        if self._tail is not None:
            out[: len(self._tail)] = self._tail
            filled = len(self._tail)
            self._tail = None
        while filled < FRAME_SAMPLES and self._turns:
            turn = self._turns[0]
            need = FRAME_SAMPLES - filled
            ready = len(turn.buf) >= need + FADE_SAMPLES or turn.ended
            if not turn.playing:
                if not ready:
                    break  # pre-roll: wait for a whole frame
                turn.playing = True
            seg = turn.take(need).copy()
            if turn.resume_fade and len(seg):
                k = min(FADE_SAMPLES, len(seg))
                seg[:k] *= np.linspace(0.0, 1.0, k, endpoint=False, dtype=np.float32)
                turn.resume_fade = False
            if not ready:  # underrun: fade out what is left and play silence after it
                k = min(FADE_SAMPLES, len(seg))
                if k:
                    seg[-k:] *= np.linspace(1.0, 0.0, k, dtype=np.float32)
                if not turn.starving:
                    turn.underruns += 1
                    turn.starving = True
                turn.resume_fade = True
            elif len(seg):
                turn.starving = False
            out[filled : filled + len(seg)] = seg
            self._emit_turn_events(turn, seg, filled)
            filled += len(seg)
            if not ready:
                break
            if turn.ended and not len(turn.buf):
                self._finish(turn)
        return (np.clip(out, -1.0, 1.0) * 32767.0).astype(np.int16)

    def _emit_turn_events(self, turn: _Turn, seg: np.ndarray, at: int) -> None:
        if not turn.first_audio_sent and len(seg):
            onset = first_audible_sample(seg, SAMPLE_RATE)
            if onset is not None:
                turn.first_audio_sent = True
                self._on_event(
                    {
                        "type": "first_audio",
                        "turn_id": turn.turn_id,
                        "server_ttfa_ms": round(1000.0 * (self._clock() - turn.text_at), 1),
                        "pre_roll_ms": 0.0,
                    }
                )
        turn.played += len(seg)
        self._emit_words(turn, upto=turn.played)

    def _emit_words(self, turn: _Turn, upto: float) -> None:
        while turn.words and turn.words[0][0] < upto:
            offset, word = turn.words.popleft()
            self._on_event(
                {"type": "word", "turn_id": turn.turn_id, "word": word, "start_ms": round(offset / 48.0, 1)}
            )

    def _finish(self, turn: _Turn) -> None:
        self._turns.popleft()
        self._by_id.pop(turn.turn_id, None)
        self._emit_words(turn, upto=float("inf"))  # words placed past the end of the audio
        self._on_event(
            {
                "type": "turn_done",
                "turn_id": turn.turn_id,
                "audio_ms": round(turn.played / 48.0, 1),
                "underruns": turn.underruns,
            }
        )
