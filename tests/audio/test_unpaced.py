"""The unpaced output (the WebSocket's and the in-process plug-ins') with a session, without sockets."""

from __future__ import annotations

import asyncio
import json

import numpy as np

from myna.audio.unpaced import UnpacedOutput
from myna.metrics import Metrics
from myna.session import Session


class FakeOutbox:
    """Records what would be sent: the events' JSON objects, ints (sample counts) for PCM."""

    def __init__(self):
        self.items: list = []

    def put_event(self, event) -> None:
        self.items.append(json.loads(json.dumps(event.to_dict())))

    def put_audio(self, turn_id: str, pcm: bytes) -> None:
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
    return outbox, UnpacedOutput(outbox.put_event, outbox, rate, **options)


def kinds(items) -> list:
    return [(i["type"], i.get("turn_id")) if isinstance(i, dict) else "pcm" for i in items]


def test_a_turn_streams_resampled_audio_with_events_in_order():
    outbox, out = make(16000)
    out.begin_turn("a", text_at=0.0)
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
    out.push_audio("a", tone(100), 22050)
    out.begin_turn("b", 0.0)
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
        out.push_audio(turn_id, tone(100), 22050)
    no_gaps = {"underruns": 0, "gap_ms": {"count": 0, "total": 0.0, "longest": 0.0}, "gaps": [], "interrupted": True}
    dropped = out.interrupt()  # the held turn_started of "b" comes with it, before its turn_done
    assert [e.to_dict() for e in dropped] == [{"type": "turn_done", "turn_id": "a", "audio_ms": 100.0, **no_gaps},
                                              {"type": "turn_started", "turn_id": "b"},
                                              {"type": "turn_done", "turn_id": "b", "audio_ms": 0.0, **no_gaps}]
    for event in dropped:  # what Session.interrupt sends for the dropped turns
        outbox.put_event(event)
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
    assert frame_level.interrupt()[0].underruns == 1


async def test_a_session_with_an_unpaced_output_runs_turns_of_an_engine():
    """The session's turn logic drives the unpaced output as it drives the paced Playout."""
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
    session = Session(Tone(), lambda s: UnpacedOutput.for_session(s, outbox, 22050), outbox.put_event, Metrics())
    session.receive(json.dumps({"type": "text", "turn_id": "t", "text": "one two "}))
    session.receive(json.dumps({"type": "end_turn", "turn_id": "t"}))
    for _ in range(100):
        if ("turn_done", "t") in kinds(outbox.items):
            break
        await asyncio.sleep(0.01)
    assert kinds(outbox.items)[0] == ("turn_started", "t") and kinds(outbox.items)[-1] == ("turn_done", "t")
    assert [i["word"] for i in outbox.items if isinstance(i, dict) and i["type"] == "word"] == ["one", "two"]
    assert isinstance(session.output, UnpacedOutput)
    await session.close()
