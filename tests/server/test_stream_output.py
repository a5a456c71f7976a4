"""StreamOutput (the WebSocket's unpaced turn output) with a session, without sockets."""

from __future__ import annotations

import asyncio
import json

import numpy as np

from myna.metrics import Metrics
from myna.rtc.session import Session
from myna.server.tts_stream import StreamOutput


class FakeOutbox:
    """Records what would be sent: dicts for events, ints (sample counts) for PCM."""

    def __init__(self):
        self.items: list = []

    def put_event(self, event: dict) -> None:
        self.items.append(json.loads(json.dumps(event)))

    def put_audio(self, pcm: bytes) -> None:
        self.items.append(len(pcm) // 2)

    def drop_audio(self) -> None:
        self.items = [i for i in self.items if isinstance(i, dict)]


def tone(ms: float, rate: int = 22050) -> np.ndarray:
    t = np.arange(int(rate * ms / 1000)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(rate: int = 16000, **options):
    outbox = FakeOutbox()
    out = StreamOutput(outbox, rate, **options)
    events = []
    out.bind(lambda e: (events.append(e), out.announce(e)))
    return outbox, out


def kinds(items) -> list:
    return [(i["type"], i.get("turn_id")) if isinstance(i, dict) else "pcm" for i in items]


def test_a_turn_streams_resampled_audio_with_events_in_order():
    outbox, out = make(16000)
    out.begin_turn("a", text_at=0.0)
    out.announce({"type": "turn_started", "turn_id": "a"})
    out.push_word("a", "hello", 0.0)
    out.push_word("a", "there", 250.0)
    out.push_audio("a", tone(200), 22050)
    out.push_audio("a", tone(200), 22050)
    out.end_turn("a")
    assert kinds(outbox.items) == [("turn_started", "a"), ("first_audio", "a"), "pcm", ("word", "a"), "pcm",
                                    ("word", "a"), "pcm", ("turn_done", "a")]
    samples = sum(i for i in outbox.items if isinstance(i, int))
    assert abs(samples - 16000 * 0.4) <= 2  # 400 ms resampled to 16 kHz
    assert outbox.items[-1]["audio_ms"] == round(1000 * samples / 16000, 1)


def test_a_queued_turn_is_announced_after_the_previous_one_is_done():
    outbox, out = make(22050)
    out.begin_turn("a", 0.0)
    out.announce({"type": "turn_started", "turn_id": "a"})
    out.push_audio("a", tone(100), 22050)
    out.begin_turn("b", 0.0)
    out.announce({"type": "turn_started", "turn_id": "b"})
    out.push_audio("b", tone(100), 22050)  # held: "a" is still open
    assert ("turn_started", "b") not in kinds(outbox.items)
    out.end_turn("a")
    out.end_turn("b")
    assert kinds(outbox.items) == [("turn_started", "a"), ("first_audio", "a"), "pcm", ("turn_done", "a"),
                                    ("turn_started", "b"), ("first_audio", "b"), "pcm", ("turn_done", "b")]


def test_interrupt_drops_unsent_audio_and_keeps_every_turn_bracketed():
    outbox, out = make(22050)
    for turn_id in ("a", "b"):
        out.begin_turn(turn_id, 0.0)
        out.announce({"type": "turn_started", "turn_id": turn_id})
        out.push_audio(turn_id, tone(100), 22050)
    no_gaps = {"underruns": 0, "gap_ms": {"count": 0, "total": 0.0, "longest": 0.0}, "gaps": [], "interrupted": True}
    assert out.interrupt() == [{"type": "turn_done", "turn_id": "a", "audio_ms": 100.0, **no_gaps},
                               {"type": "turn_done", "turn_id": "b", "audio_ms": 0.0, **no_gaps}]
    for turn_id in ("a", "b"):  # what Session.interrupt sends for each dropped turn
        out.announce({"type": "turn_done", "turn_id": turn_id, "audio_ms": 0.0, "underruns": 0, "interrupted": True})
    out.push_audio("a", tone(100), 22050)  # late audio of a dropped turn
    assert kinds(outbox.items) == [("turn_started", "a"), ("first_audio", "a"), ("turn_done", "a"),
                                    ("turn_started", "b"), ("turn_done", "b")]


def test_late_audio_is_a_gap_for_a_real_time_consumer():
    """Unpaced, but timed for a consumer that plays from the first message on: a clause sent
    after the previous audio would have played out is a gap of that wait, at that position."""
    clock = Clock()
    outbox, out = make(22050, clock=clock, chunks_end_at_words=True)
    out.begin_turn("a", clock.t)
    out.push_audio("a", tone(200), 22050)
    assert out.audio_runs_out_at() == clock.t + 0.2
    clock.t += 0.15
    out.push_audio("a", tone(200), 22050)  # on time: 50 ms of the first clause still to play
    assert out.audio_runs_out_at() == clock.t + 0.25
    clock.t += 0.5
    out.push_audio("a", tone(100), 22050)  # 250 ms late
    out.end_turn("a")
    done = outbox.items[-1]
    assert done["type"] == "turn_done" and done["underruns"] == 0
    assert done["gap_ms"] == {"count": 1, "total": 250.0, "longest": 250.0}
    assert done["gaps"] == [[400.0, 250.0]]
    frame_level = make(22050, clock=clock)[1]  # chunks may end inside a word: an underrun
    frame_level.begin_turn("b", clock.t)
    frame_level.push_audio("b", tone(100), 22050)
    clock.t += 1.0
    frame_level.push_audio("b", tone(100), 22050)
    assert frame_level.interrupt()[0]["underruns"] == 1


async def test_a_session_with_a_stream_output_runs_turns_of_an_engine():
    """The session's turn logic drives StreamOutput as it drives the paced Playout."""
    from myna.engines.base import AudioChunk, Engine, SynthesisStream, WordEvent

    class Stream(SynthesisStream):
        def _on_words(self, words):
            for i, w in enumerate(words):
                self._emit(WordEvent(w, 100.0 * i))
            self._emit(AudioChunk(tone(100 * len(words)), 22050))

        def _on_end_input(self):
            self._finish()

    class Tone(Engine):
        name, sample_rate = "tone", 22050

        def stream(self, voice=None, group=None):
            return Stream()

    outbox = FakeOutbox()
    out = StreamOutput(outbox, 22050)
    session = Session(engine=Tone(), send=out.announce, metrics=Metrics(), output=out.bind)
    session.handle_message(json.dumps({"type": "text", "turn_id": "t", "text": "one two "}))
    session.handle_message(json.dumps({"type": "end_turn", "turn_id": "t"}))
    for _ in range(100):
        if ("turn_done", "t") in kinds(outbox.items):
            break
        await asyncio.sleep(0.01)
    assert kinds(outbox.items)[0] == ("turn_started", "t") and kinds(outbox.items)[-1] == ("turn_done", "t")
    assert [i["word"] for i in outbox.items if isinstance(i, dict) and i["type"] == "word"] == ["one", "two"]
    assert session.playout is None and session.track is None
    await session.close()
