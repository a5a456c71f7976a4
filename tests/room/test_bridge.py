"""BridgedEngine: a session on one event loop using an engine that lives on another."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from myna.engines import AudioChunk, Engine, EngineError, SynthesisStream, WordEvent
from myna.room.bridge import BridgedEngine


class LoopBoundStream(SynthesisStream):
    """Records the thread each call runs on; emits one word and chunk per word."""

    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def _on_words(self, words):
        self.calls.append(("words", threading.current_thread().name, words))
        for w in words:
            self._emit(WordEvent(w, 0.0))
            self._emit(AudioChunk(np.zeros(10, np.float32), 22050))

    def _on_end_input(self):
        self.calls.append(("end", threading.current_thread().name))
        self._finish()

    def _on_cancel(self):
        self.calls.append(("cancel", threading.current_thread().name))


class LoopBound(Engine):
    name, sample_rate = "bound", 22050

    def __init__(self):
        self.calls, self.streams = [], []

    @property
    def voices(self):
        return ["only"]

    def stream(self, voice=None, group=None):
        if voice not in (None, "only"):
            raise EngineError("unknown_voice", f"no voice {voice!r}")
        self.streams.append(LoopBoundStream(self.calls))
        return self.streams[-1]


@pytest.fixture
def home():
    """An event loop running on its own thread ("engine-home"), like myna worker's main loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="engine-home")
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


async def test_items_come_back_in_order_and_engine_code_runs_on_its_own_loop(home):
    engine = LoopBound()
    bridged = BridgedEngine(engine, home)
    assert (bridged.name, bridged.sample_rate, bridged.voices) == ("bound", 22050, ["only"])
    stream = bridged.stream()
    stream.push_text("hello wor")
    stream.push_text("ld again")
    stream.end_input()
    items = [item async for item in stream]
    assert [i.word for i in items if isinstance(i, WordEvent)] == ["hello", "world", "again"]
    assert [type(i).__name__ for i in items] == ["WordEvent", "AudioChunk"] * 3
    assert {call[1] for call in engine.calls} == {"engine-home"}


async def test_cancel_reaches_the_engine_stream_and_ends_iteration(home):
    engine = LoopBound()
    stream = BridgedEngine(engine, home).stream()
    stream.push_text("one two ")
    stream.cancel()
    assert stream.cancelled and [item async for item in stream] == []
    await asyncio.sleep(0.05)
    assert engine.streams[0].cancelled and ("cancel", "engine-home") in engine.calls


async def test_an_engine_error_is_raised_from_the_iteration(home):
    stream = BridgedEngine(LoopBound(), home).stream(voice="missing")
    with pytest.raises(EngineError) as err:
        async for _ in stream:
            pass
    assert err.value.code == "unknown_voice"


async def test_on_the_engines_own_loop_the_engine_stream_is_used_directly():
    engine = LoopBound()
    stream = BridgedEngine(engine, asyncio.get_running_loop()).stream()
    assert stream is engine.streams[0]


def test_the_bridged_stream_takes_every_turn_setting_a_stream_takes():
    from myna.room.bridge import BridgedStream

    settings = {name for name in dir(SynthesisStream) if name.startswith("set_")}
    assert settings >= {"set_speed", "set_lexicon", "set_normalise"}
    assert all(callable(getattr(BridgedStream, name, None)) for name in settings), settings


async def test_turn_settings_reach_the_engine_stream_on_its_loop(home):
    from myna.text.lexicon import Lexicon

    engine = LoopBound()
    stream = BridgedEngine(engine, home).stream()
    with pytest.raises(EngineError) as bad:
        stream.set_speed(5.0)  # (refused here, at once)
    assert bad.value.code == "bad_speed"
    lexicon = Lexicon({"hello": "hi there"})
    stream.set_lexicon(lexicon)
    stream.set_normalise(False)
    stream.push_text("hello 42")
    stream.end_input()
    items = [item async for item in stream]
    # (LoopBound speaks the words it is given: the respelling, and 42 as written)
    assert [i.word for i in items if isinstance(i, WordEvent)] == ["hi", "there", "42"]


async def test_a_speed_the_engine_cannot_give_ends_the_turn_with_its_error(home):
    stream = BridgedEngine(LoopBound(), home).stream()
    stream.set_speed(1.5)  # (LoopBound speaks at its own pace: SynthesisStream's refusal)
    stream.push_text("hello")
    stream.end_input()
    with pytest.raises(EngineError) as err:
        async for _ in stream:
            pass
    assert err.value.code == "unsupported_speed"
