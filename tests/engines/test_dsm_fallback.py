"""The DSM engine (tiny random checkpoint) as a primary that fails, starts late or stalls, with
the embedded Piper voice behind it: each word heard once, from one engine or the
other, at the DSM engine's rate."""

from __future__ import annotations

import asyncio
import os
from functools import partial

import pytest
import pytest_asyncio
import torch

from inprocess import ManualTimer
from inprocess import until as inprocess_until
from inprocess import collect as collect_items
from myna.engines import AudioChunk, FallbackEvent, WordEvent
from myna.engines.base import spoken_word
from myna.engines.fallback import FallbackEngine
from myna.bench.faulty import FaultyEngine
from myna.engines.piper import PiperEngine

os.environ.setdefault("NO_TORCH_COMPILE", "1")
pytestmark = pytest.mark.asyncio(loop_scope="module")

TEXT = "Hello world, how are you today? The weather is fine."
WORDS = [spoken_word(w) for w in TEXT.split()]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(tmp_path_factory):
    from myna.bench.tiny_dsm import build_tiny_checkpoint
    from myna.bench.tiny_dsm import TINY_VOICE
    from myna.engines.dsm import DSMEngine

    threads = torch.get_num_threads()
    folder = build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_fallback"), seed=0)
    dsm = DSMEngine(folder, voice=folder / TINY_VOICE, n_q=32, guidance=2, max_ahead_s=float("inf"), seed=9, threads=1)
    piper = PiperEngine(workers=1)
    await dsm.start()
    await piper.start()
    yield dsm, piper
    await dsm.close()
    await piper.close()
    torch.set_num_threads(threads)


collect = partial(collect_items, timeout=120.0)  # this module's bound (s)


until = partial(inprocess_until, timeout=60.0)  # (the DSM loop thread getting somewhere)


def check(items, reason: str, most: int, rate: int) -> int:
    """One switch, after at most ``most`` words, each word once; returns its ``at_word``."""
    switches = [i for i in items if isinstance(i, FallbackEvent)]
    assert len(switches) == 1 and (switches[0].from_engine, switches[0].to_engine, switches[0].reason) == \
        ("dsm", "piper", reason)
    at_word = switches[0].at_word
    assert 0 <= at_word <= most
    assert [i.word for i in items if isinstance(i, WordEvent)] == WORDS  # each word once, none lost
    heard = [i for i in items[:items.index(switches[0])] if isinstance(i, WordEvent)]
    assert [i.word for i in heard] == WORDS[:at_word]
    audio = [i for i in items if isinstance(i, AudioChunk)]
    assert audio and all(a.sample_rate == rate for a in audio)
    before_ms = sum(a.duration_ms for a in items[:items.index(switches[0])] if isinstance(a, AudioChunk))
    assert all(w.start_ms < before_ms for w in heard)  # a word is heard once its audio has begun
    starts = [i.start_ms for i in items if isinstance(i, WordEvent)]
    assert starts == sorted(starts) and starts[-1] < sum(a.duration_ms for a in audio)
    return at_word


@pytest.mark.slow
async def test_dsm_raising_mid_turn_switches_to_piper(engines):
    dsm, piper = engines
    engine = FallbackEngine(FaultyEngine(dsm, "raise", 3), piper)
    stream = engine.stream(group=object())
    stream.push_text(TEXT)
    stream.end_input()
    check(await collect(stream), "error", 3, dsm.sample_rate)  # DSM announces words before their audio


async def test_dsm_failing_inside_its_frame_loop_switches_to_piper(engines):
    dsm, piper = engines
    engine = FallbackEngine(dsm, piper)
    stream = engine.stream(group=object())
    stream.push_text(TEXT)
    stream.end_input()
    await until(lambda: stream._heard >= 2)

    def explode(pcm):
        raise RuntimeError("decoder exploded")

    stream._active._session.on_audio = explode  # the DSM session's next frame fails on the loop thread
    assert check(await collect(stream), "error", len(WORDS), dsm.sample_rate) >= 2


async def test_dsm_starting_late_switches_after_the_deadline(engines):
    dsm, piper = engines
    timer = ManualTimer()
    engine = FallbackEngine(FaultyEngine(dsm, "hang", 0), piper, after_ms=500, clock=timer.clock,
                            call_later=timer.call_later)
    stream = engine.stream(group=object())
    stream.push_text(TEXT)
    stream.end_input()
    await asyncio.sleep(0.05)
    timer.advance(0.49)
    assert stream._queue.empty()
    timer.advance(0.02)
    assert check(await collect(stream), "late", 0, dsm.sample_rate) == 0


async def test_dsm_stalling_mid_turn_switches_once_its_audio_has_played_out(engines):
    dsm, piper = engines
    timer = ManualTimer()
    engine = FallbackEngine(FaultyEngine(dsm, "hang", 4), piper, stall_ms=1000, clock=timer.clock,
                            call_later=timer.call_later)
    stream = engine.stream(group=object())
    stream.push_text(TEXT)
    stream.end_input()
    await until(lambda: stream._heard + len(stream._words_out) >= 4)  # four words announced: it hangs now
    await asyncio.sleep(0.2)
    played_out_s = stream._out_ms / 1000.0  # sent at virtual time 0
    timer.advance(played_out_s + 0.99)
    assert not any(isinstance(i, FallbackEvent) for i in stream._queue._queue)
    timer.advance(0.02)
    assert check(await collect(stream), "stall", 4, dsm.sample_rate) >= 1
