"""An engine wrapper (fallback, strategy, bridge to another loop, injected fault) cannot drop a
property of what it wraps: every part of the :class:`~myna.engines.base.Engine` interface is
checked on every wrapper, so a part added to the interface later is checked too.

The regression this guards: ``myna worker``'s bridge answered ``chunks_end_at_words`` False for
Piper, so room turns were played by the frame-level rule (held first audio, late clauses counted
as cut words)."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from inprocess import ToneEngine
from myna.bench.faulty import FaultyEngine
from myna.engines.base import Engine, EngineWrapper
from myna.engines.fallback import FallbackEngine
from myna.engines.piper import PiperEngine
from myna.room.bridge import BridgedEngine
from myna.text.scripts import LATIN

#: What a wrapper says otherwise, on purpose (documented in its class).
OWN = {
    FallbackEngine: {"start", "warms_through", "breaker_state"},
    "PiperVariant": {"name"},
    BridgedEngine: set(),
    FaultyEngine: set(),
}


class Distinct(ToneEngine):
    """An inner engine whose every property differs from the interface's defaults."""

    chunks_end_at_words = True
    scripts = frozenset({"Cyrillic", *LATIN})

    def __init__(self):
        super().__init__("distinct", sample_rate=16_000)
        self.calls: list = []

    @property
    def voices(self) -> list[str]:
        return ["ada", "default"]

    async def start(self) -> None:
        self.calls.append("start")

    async def close(self) -> None:
        self.calls.append("close")

    def use_phrase_cache(self, cache) -> bool:
        self.calls.append(("cache", cache))
        return True

    def breaker_state(self) -> str | None:
        return "half_open"

    def voice_catalogue(self) -> list[dict]:
        return [{"name": "ada", "language": "en_GB", "sample_rate": 16_000, "speakers": 3}]

    def compute_stats(self) -> dict | None:
        return {"busy_s": 1.5}


def interface() -> list[str]:
    """Every public part of the Engine interface but ``stream`` (what the wrapper replaces)."""
    return sorted(name for name in dir(Engine) if not name.startswith("_") and name != "stream")


def wrappers(inner: Engine):
    loop = asyncio.get_running_loop()
    yield FallbackEngine(inner, ToneEngine("backup"))
    yield BridgedEngine(inner, loop)
    yield FaultyEngine(inner, "raise", at_word=2)


async def check(wrapper: Engine, inner: Engine, own: set[str]) -> None:
    for name in interface():
        if name in own:
            continue
        attribute = inspect.getattr_static(Engine, name)
        if name == "warms_through":  # warm-up speaks through the wrapper's own streams, as its turns do
            assert wrapper.warms_through is wrapper, type(wrapper).__name__
        elif isinstance(attribute, property) or not callable(attribute):
            assert getattr(wrapper, name) == getattr(inner, name), (type(wrapper).__name__, name)
        elif name in ("start", "close"):
            inner.calls.clear()
            await getattr(wrapper, name)()
            assert inner.calls == [name], (type(wrapper).__name__, name)
        elif name == "use_phrase_cache":
            inner.calls.clear()
            assert wrapper.use_phrase_cache("the cache") is True and inner.calls == [("cache", "the cache")]
        elif name in ("breaker_state", "compute_stats", "voice_catalogue"):
            assert getattr(wrapper, name)() == getattr(inner, name)(), (type(wrapper).__name__, name)
        else:
            pytest.fail(f"Engine.{name} is new: say here how a wrapper passes it on")


async def test_every_wrapper_passes_on_every_part_of_the_engine_interface():
    inner = Distinct()
    for wrapper in wrappers(inner):
        assert isinstance(wrapper, EngineWrapper)
        await check(wrapper, inner, OWN[type(wrapper)])


async def test_a_strategy_of_piper_is_piper_in_all_but_its_name_and_chunking():
    piper = PiperEngine(workers=1)
    variant = piper.variant("piper-sentence", "sentence")
    assert variant.chunks_end_at_words is True and variant.voices == piper.voices and variant.sample_rate == piper.sample_rate
    assert variant.use_phrase_cache("c") is True and piper.phrase_cache == "c"
    assert variant.compute_stats() == piper.compute_stats() and variant.name == "piper-sentence"
    await piper.close()


async def test_the_bridge_keeps_piper_word_boundary_chunks():
    piper = PiperEngine(workers=1)
    assert BridgedEngine(piper, asyncio.get_running_loop()).chunks_end_at_words is True
    await piper.close()


async def test_a_fallback_reports_its_own_breaker_and_warms_what_it_wraps():
    inner = Distinct()
    engine = FallbackEngine(inner, ToneEngine("backup"))
    assert engine.breaker_state() == "closed" and engine.warms_through is inner
    inner.calls.clear()
    await engine.start()
    assert inner.calls == ["start"]  # (and the backup's start: it is a loaded engine of its own)
