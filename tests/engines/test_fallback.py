"""Fallback (myna.engines.fallback) on in-process engines and a virtual clock: the
switch on error, late start and stall with the words heard once, the circuit breaker, the
session's ``fallback`` event, metrics, /healthz and interrupt."""

from __future__ import annotations

import asyncio
import json
from functools import partial

import numpy as np
import pytest

from inprocess import ManualTimer, ToneEngine, paced_session
from inprocess import collect as collect_items
from myna.engines import AudioChunk, ErrorEvent, FallbackEvent, WordEvent
from myna.engines.base import EngineError, spoken_word
from myna.engines.fallback import CircuitBreaker, FallbackEngine
from myna.bench.faulty import FaultyEngine
from myna.metrics import Metrics

TEXT = "one two three four five six."
WORDS = ["one", "two", "three", "four", "five", "six"]


async def settle() -> None:
    """Let the streams' tasks run (no time passes on the virtual clock)."""
    for _ in range(20):
        await asyncio.sleep(0)


collect = partial(collect_items, timeout=30.0)  # this module's bound (s)


def spoken(items) -> list[str]:
    return [spoken_word(i.word) for i in items if isinstance(i, WordEvent)]  # (ToneEngine keeps punctuation)


def switches(items) -> list[FallbackEvent]:
    return [i for i in items if isinstance(i, FallbackEvent)]


def check_turn(items, rate: int, word_ms: float) -> None:
    """All audio at the turn's rate, word times in order, and each word where its audio is."""
    audio = [i for i in items if isinstance(i, AudioChunk)]
    assert audio and all(a.sample_rate == rate for a in audio)
    starts = [i.start_ms for i in items if isinstance(i, WordEvent)]
    assert starts == sorted(starts)
    total_ms = sum(a.duration_ms for a in audio)
    # every word is one tone of word_ms: nothing spoken twice, nothing lost (resampling keeps length)
    assert total_ms == pytest.approx(word_ms * len(starts), abs=2.0)
    assert starts == pytest.approx([word_ms * i for i in range(len(starts))], abs=2.0)


def engines(fault: str | None, at_word: int, timer: ManualTimer | None = None, **kwargs):
    primary = FaultyEngine(ToneEngine("primary"), fault, at_word)
    backup = ToneEngine("backup", sample_rate=16_000)  # another rate: resampled to the primary's
    timer = timer or ManualTimer()
    return FallbackEngine(primary, backup, clock=timer.clock, call_later=timer.call_later, **kwargs), primary, backup


@pytest.mark.parametrize("at_word", [0, 1, 3, 5])
async def test_an_error_switches_at_the_first_word_not_heard(at_word):
    engine, _, _ = engines("raise", at_word)
    stream = engine.stream(group=object())
    for chunk in ("one t", "wo three fo", "ur five six."):
        stream.push_text(chunk)
    stream.end_input()
    items = await collect(stream)
    assert spoken(items) == WORDS  # each word once, none lost
    assert switches(items) == [FallbackEvent("primary", "backup", "error", at_word)]
    before = [i for i in items[:items.index(switches(items)[0])] if isinstance(i, WordEvent)]
    assert spoken(before) == WORDS[:at_word]  # the words heard from the primary
    check_turn(items, 24_000, 120.0)


async def test_text_that_arrives_after_the_switch_goes_to_the_fallback_and_a_split_word_stays_whole():
    engine, _, _ = engines("raise", 1)
    stream = engine.stream(group=object())
    stream.push_text("one two thr")  # "thr" is half a word when the primary fails
    await settle()
    stream.push_text("ee four five six.")
    stream.end_input()
    items = await collect(stream)
    assert spoken(items) == WORDS
    assert switches(items)[0].at_word == 1


async def test_a_late_first_audio_switches_after_the_deadline():
    timer = ManualTimer()
    engine, _, _ = engines("hang", 0, timer, after_ms=500)
    stream = engine.stream(group=object())
    stream.push_text(TEXT)
    stream.end_input()
    await settle()
    timer.advance(0.49)
    await settle()
    assert stream._queue.empty()  # before the deadline: still waiting for the primary
    timer.advance(0.02)
    items = await collect(stream)
    assert switches(items) == [FallbackEvent("primary", "backup", "late", 0)]
    assert spoken(items) == WORDS
    check_turn(items, 24_000, 120.0)


async def test_the_late_clock_starts_with_the_first_word_not_the_turn():
    timer = ManualTimer()
    engine, _, _ = engines("hang", 0, timer, after_ms=500)
    stream = engine.stream(group=object())
    timer.advance(2.0)  # the turn opened, no text yet: nothing can be late
    stream.push_text("one two ")
    await settle()
    timer.advance(0.4)
    await settle()
    assert stream._queue.empty()
    timer.advance(0.2)
    stream.end_input()
    assert switches(await collect(stream))[0].reason == "late"


async def test_a_stall_mid_turn_switches_once_the_audio_sent_has_played_out():
    timer = ManualTimer()
    engine, _, _ = engines("hang", 2, timer, stall_ms=1000)
    stream = engine.stream(group=object())
    stream.push_text(TEXT)
    stream.end_input()
    await settle()
    # two words (240 ms) went out at t=0: the listener runs dry at 0.24 s; a stall at 1.24 s
    timer.advance(1.2)
    await settle()
    assert not any(isinstance(i, FallbackEvent) for i in stream._queue._queue)
    timer.advance(0.05)
    items = await collect(stream)
    assert switches(items) == [FallbackEvent("primary", "backup", "stall", 2)]
    assert spoken(items) == WORDS
    check_turn(items, 24_000, 120.0)


async def test_waiting_for_text_is_no_stall():
    timer = ManualTimer()
    engine, _, _ = engines(None, 0, timer, stall_ms=1000)
    stream = engine.stream(group=object())
    stream.push_text("one two. ")
    await settle()
    timer.advance(5.0)  # the LLM is slow: every word so far was spoken
    stream.push_text("three.")
    stream.end_input()
    items = await collect(stream)
    assert not switches(items) and spoken(items) == ["one", "two", "three"]
    assert engine.breaker.state == "closed"


async def test_a_session_turn_queued_behind_another_is_not_late_while_it_waits():
    timer = ManualTimer()
    engine, primary, _ = engines(None, 0, timer, after_ms=500)
    group = object()
    first = engine.stream(group=group)
    primary.fault = "hang"  # the second turn's primary never starts
    second = engine.stream(group=group)
    second.push_text("four five six.")
    second.end_input()
    await settle()
    timer.advance(3.0)  # the first turn is still open: the second is not late yet
    await settle()
    assert second._queue.empty()
    first.push_text("one two three.")
    first.end_input()
    assert spoken(await collect(first)) == ["one", "two", "three"]
    await settle()
    timer.advance(0.51)
    items = await collect(second)
    assert switches(items)[0].reason == "late" and spoken(items) == ["four", "five", "six"]


def test_the_circuit_breaker_opens_probes_and_closes():
    timer = ManualTimer()
    breaker = CircuitBreaker(failures=3, window_s=10.0, cooldown_s=30.0, clock=timer.clock)
    for _ in range(2):
        breaker.failure()
        timer.advance(6.0)
    breaker.failure()  # three failures, but the first is out of the window
    assert breaker.state == "closed" and breaker.admit() == "closed"
    breaker.failure()  # three within 10 s
    assert breaker.state == "open" and breaker.admit() is None
    timer.advance(29.0)
    assert breaker.admit() is None
    timer.advance(1.0)
    assert breaker.state == "half_open"
    assert breaker.admit() == "half_open"  # one probe ...
    assert breaker.admit() is None  # ... at a time
    breaker.failure()  # the probe failed: open for a full cool-down
    assert breaker.state == "open"
    timer.advance(30.0)
    assert breaker.admit() == "half_open"
    breaker.release()  # interrupted: no verdict, the next turn probes
    assert breaker.admit() == "half_open"
    breaker.success()
    assert breaker.state == "closed" and breaker.admit() == "closed"


async def test_a_failing_primary_is_taken_out_of_rotation_then_probed_and_recovers():
    timer = ManualTimer()
    breaker = CircuitBreaker(failures=2, window_s=60.0, cooldown_s=30.0, clock=timer.clock)
    engine, primary, _ = engines("raise", 0, timer, breaker=breaker)
    opened = []
    inner_stream = primary.stream
    primary.stream = lambda voice=None, group=None: opened.append(1) or inner_stream(voice, group)

    async def turn():
        stream = engine.stream(group=object())
        stream.push_text(TEXT)
        stream.end_input()
        items = await collect(stream)
        assert spoken(items) == WORDS
        return switches(items)

    assert [s.reason for s in await turn()] == ["error"]
    assert [s.reason for s in await turn()] == ["error"]
    assert breaker.state == "open"
    assert await turn() == [FallbackEvent("primary", "backup", "open", 0)]  # straight to the fallback
    assert len(opened) == 2  # the primary was not asked
    timer.advance(30.0)
    assert breaker.state == "half_open"
    assert [s.reason for s in await turn()] == ["error"]  # the probe fails: open again
    assert breaker.state == "open" and len(opened) == 3
    primary.fault = None  # the primary recovers
    timer.advance(30.0)
    assert await turn() == []  # the probe speaks the turn in the primary's voice
    assert breaker.state == "closed" and len(opened) == 4
    assert await turn() == []


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def test_the_session_sends_a_fallback_event_and_counts_it():
    clock, metrics, sent = Clock(), Metrics(), []
    engine, _, _ = engines("raise", 2)
    session = paced_session(engine, sent, metrics, clock=clock)
    session.receive(json.dumps({"type": "text", "turn_id": "t1", "text": TEXT}))
    session.receive(json.dumps({"type": "end_turn", "turn_id": "t1"}))
    await settle()
    for _ in range(60):
        session.output.next_frame()
        clock.t += 0.02
        await asyncio.sleep(0)
    events = [e for e in sent if e["type"] == "fallback"]
    assert events == [{"type": "fallback", "turn_id": "t1", "from": "primary", "to": "backup", "reason": "error",
                       "at_word": 2}]
    assert [spoken_word(e["word"]) for e in sent if e["type"] == "word"] == WORDS
    assert not [e for e in sent if e["type"] == "error"]
    assert any(e["type"] == "turn_done" and not e.get("interrupted") for e in sent)
    text = metrics.render().decode()
    assert 'myna_fallbacks_total{from="primary",reason="error",to="backup"} 1.0' in text
    await session.close()


async def test_interrupt_during_a_fallback_turn_stops_the_fallback():
    clock, metrics, sent = Clock(), Metrics(), []
    timer = ManualTimer()
    primary = FaultyEngine(ToneEngine("primary"), "hang", 0)
    backup_streams = []
    backup = ToneEngine("backup")
    open_backup = backup.stream
    backup.stream = lambda voice=None, group=None: backup_streams.append(open_backup(voice, group)) or backup_streams[-1]
    engine = FallbackEngine(primary, backup, clock=timer.clock, call_later=timer.call_later)
    session = paced_session(engine, sent, metrics, clock=clock)
    session.receive(json.dumps({"type": "text", "turn_id": "t1", "text": "one two three "}))
    await settle()
    timer.advance(0.6)  # late: the fallback takes the turn, whose input is still open
    await settle()
    assert [e["reason"] for e in sent if e["type"] == "fallback"] == ["late"]
    session.interrupt()
    await settle()
    assert backup_streams and backup_streams[0].cancelled
    done = [e for e in sent if e["type"] == "turn_done"]
    assert len(done) == 1 and done[0]["interrupted"] is True
    session.receive(json.dumps({"type": "text", "turn_id": "t1", "text": "four"}))
    assert sent[-1]["code"] == "turn_ended"  # the interrupted turn takes no more text
    await session.close()


async def test_healthz_and_metrics_show_each_breaker():
    from aiohttp.test_utils import TestClient, TestServer

    from myna.server.app import Worker, create_app

    timer = ManualTimer()
    breaker = CircuitBreaker(failures=1, clock=timer.clock)
    engine, _, backup = engines("raise", 0, timer, breaker=breaker)
    worker = Worker(engines={"primary": engine, "backup": backup})
    async with TestClient(TestServer(create_app(worker), host="127.0.0.1")) as client:
        await check_health(client, worker, engine)


async def check_health(client, worker, engine):
    for _ in range(100):
        if worker.ready:
            break
        await asyncio.sleep(0.01)
    body = await (await client.get("/healthz")).json()
    assert body["status"] == "ready" and body["breakers"] == {"primary": "closed"}
    stream = engine.stream()
    stream.push_text(TEXT)
    stream.end_input()
    await collect(stream)
    body = await (await client.get("/healthz")).json()
    assert body["status"] == "ready" and body["breakers"] == {"primary": "open"}  # still serving, by the fallback
    metrics = await (await client.get("/metrics")).text()
    assert 'myna_breaker_state{engine="primary"} 2.0' in metrics


async def test_an_unknown_voice_is_refused_before_anything_starts():
    from myna.engines import EngineError

    engine, _, _ = engines(None, 0)
    with pytest.raises(EngineError) as err:
        engine.stream(voice="nobody")
    assert err.value.code == "unknown_voice"


async def test_the_fallback_failing_too_ends_the_turn_with_an_error():
    from myna.engines import EngineError

    timer = ManualTimer()
    engine = FallbackEngine(FaultyEngine(ToneEngine("primary"), "raise", 1),
                            FaultyEngine(ToneEngine("backup"), "raise", 1), clock=timer.clock,
                            call_later=timer.call_later)
    stream = engine.stream()
    stream.push_text(TEXT)
    stream.end_input()
    items = []
    with pytest.raises(EngineError):
        async for item in stream:
            items.append(item)
    assert spoken(items) == ["one", "two"]  # one from each, never twice
    assert not any(isinstance(i, ErrorEvent) for i in items)
    assert np.isfinite(sum(i.duration_ms for i in items if isinstance(i, AudioChunk)))


def test_serve_wraps_every_engine_but_the_fallback():
    from myna.engines.build import with_fallback

    loaded = {"a": ToneEngine("a"), "b": ToneEngine("b"), "backup": ToneEngine("backup")}
    engines = with_fallback(loaded, "backup", after_ms=300, stall_ms=700)
    assert list(engines) == ["a", "b", "backup"] and engines["backup"] is loaded["backup"]
    for name in ("a", "b"):
        assert isinstance(engines[name], FallbackEngine) and engines[name].name == name
        assert engines[name].primary is loaded[name] and engines[name].fallback is loaded["backup"]
        assert (engines[name].after_s, engines[name].stall_s) == (0.3, 0.7)


@pytest.mark.parametrize("argv, message", [
    (["--engine", "piper", "--fallback", "piper"], "no other engine"),
    (["--engine", "piper", "--fallback", "nonsense"], "invalid choice: 'nonsense'"),
    (["--fallback-after-ms", "-1"], "--fallback-after-ms"),
])
def test_bad_fallback_options_fail_in_one_line(capsys, argv, message):
    from myna.cli import main

    try:
        code = main(["serve", "--port", "1", *argv])
    except SystemExit as exit:  # argparse's usage errors
        code = exit.code
    assert code and message in capsys.readouterr().err


async def test_a_primary_that_hangs_after_its_last_word_is_ended_by_the_stall_deadline():
    timer = ManualTimer()
    engine, _, _ = engines(None, 0, timer, stall_ms=1000)
    hung = FaultyEngine(ToneEngine("primary"), "hang", 6)  # all six words out, then the stream never ends
    engine.primary = hung
    stream = engine.stream(group=object())
    stream.push_text(TEXT)
    stream.end_input()
    await settle()
    timer.advance(6 * 0.12 + 1.01)
    items = await collect(stream)
    assert spoken(items) == WORDS and switches(items) == [FallbackEvent("primary", "backup", "stall", 6)]


def test_a_closed_breaker_counts_failures_in_the_window_whatever_succeeded_between():
    timer = ManualTimer()
    breaker = CircuitBreaker(failures=3, window_s=60.0, clock=timer.clock)
    for _ in range(2):
        breaker.failure()
        breaker.success()
        timer.advance(1.0)
    breaker.failure()
    assert breaker.state == "open"


async def test_only_the_probe_closes_an_open_breaker():
    """A turn that began on the primary before the breaker opened (another session's failures)
    and ends well is no probe: the breaker stays open until its cool-down and a probe."""
    timer = ManualTimer()
    breaker = CircuitBreaker(failures=1, window_s=60.0, cooldown_s=30.0, clock=timer.clock)
    engine, primary, _ = engines(None, 0, timer, breaker=breaker)
    long_turn = engine.stream(group=object())  # admitted while closed
    long_turn.push_text(TEXT)
    await settle()
    breaker.failure()  # another session's turn fails: open
    assert breaker.state == "open"
    long_turn.end_input()
    items = await collect(long_turn)
    assert spoken(items) == WORDS and switches(items) == []
    assert breaker.state == "open"  # new turns still go to the fallback


async def test_a_probe_with_nothing_to_say_leaves_the_breaker_to_the_next_turn():
    """A half-open probe turn that has no words proves nothing: the breaker is not closed by it,
    and the next turn probes."""
    timer = ManualTimer()
    breaker = CircuitBreaker(failures=1, window_s=60.0, cooldown_s=30.0, clock=timer.clock)
    engine, primary, _ = engines(None, 0, timer, breaker=breaker)
    breaker.failure()
    timer.advance(30.0)
    empty = engine.stream(group=object())  # the probe
    empty.end_input()
    assert switches(await collect(empty)) == []
    assert breaker.state == "half_open"
    primary.fault = "raise"  # (the engine was never well: nothing had tested it)
    probe = engine.stream(group=object())  # the next turn probes, and fails: open again
    probe.push_text(TEXT)
    probe.end_input()
    items = await collect(probe)
    assert spoken(items) == WORDS and [s.reason for s in switches(items)] == ["error"]
    assert breaker.state == "open"


async def test_a_turn_refused_by_both_engines_does_not_hold_up_the_sessions_next_turn():
    """A turn that could not be opened at all (the breaker open and the fallback refusing a
    stream) is over: the session's next turn is not left waiting for it, so its late clock runs."""
    timer = ManualTimer()
    breaker = CircuitBreaker(failures=1, window_s=60.0, cooldown_s=30.0, clock=timer.clock)
    engine, primary, backup = engines("hang", 0, timer, breaker=breaker, after_ms=500)
    group = object()
    breaker.failure()  # open: the next turn goes straight to the fallback ...
    backup_stream = backup.stream

    def refuse(voice=None, group=None):
        raise EngineError("engine_not_ready", "backup is still loading")

    backup.stream = refuse  # ... which refuses it
    with pytest.raises(EngineError):
        engine.stream(group=group)
    backup.stream = backup_stream
    timer.advance(30.0)  # half-open: the next turn probes the (hanging) primary
    stream = engine.stream(group=group)
    stream.push_text(TEXT)
    stream.end_input()
    await settle()
    timer.advance(0.51)
    items = await collect(stream)
    assert [s.reason for s in switches(items)] == ["late"] and spoken(items) == WORDS
    assert group not in engine.order  # nothing of the group is left behind


@pytest.mark.parametrize("at_word", [0, 1, 2, 4])
async def test_a_script_left_out_is_reported_once_per_turn_across_the_switch(at_word):
    """``unsupported_language`` comes once per script and turn, also when the turn switches
    engines while its text streams in (each engine's stream reported the script again)."""
    timer = ManualTimer()
    engine, _, _ = engines("raise", at_word, timer)
    stream = engine.stream(group=object())
    for chunk in ["one Прив", "ет tw", "o thr", "ee Мир", " fo", "ur fi", "ve."]:
        stream.push_text(chunk)
        await settle()
        timer.advance(0.05)
    stream.end_input()
    items = await collect(stream)
    assert spoken(items) == ["one", "two", "three", "four", "five"]
    assert [i.code for i in items if isinstance(i, ErrorEvent)] == ["unsupported_language"]
    assert len(switches(items)) == 1


async def test_the_fallback_takes_a_sessions_turns_in_order_when_a_later_one_needs_it_first():
    """Turn 1 on the primary, the breaker opens (other sessions), turn 2 goes straight to the
    fallback, then turn 1 switches: the fallback opens turn 1's rest first. (It opened turn 2
    first, and an engine that synthesises a session's turns in the order they open (Piper) made
    the listener of turn 1 wait for all of turn 2.)"""
    timer = ManualTimer()
    breaker = CircuitBreaker(failures=1, window_s=60.0, cooldown_s=30.0, clock=timer.clock)
    engine, _, backup = engines("hang", 2, timer, breaker=breaker, after_ms=500, stall_ms=500)
    opened = []
    inner = backup.stream
    backup.stream = lambda voice=None, group=None: opened.append(inner(voice, group)) or opened[-1]
    group = object()
    first = engine.stream(group=group)
    first.push_text(TEXT)
    first.end_input()
    await settle()
    breaker.failure()  # another session's turn failed: open
    second = engine.stream(group=group)
    second.push_text("seven eight.")
    second.end_input()
    await settle()
    assert opened == []  # turn 2 waits for turn 1 to finish synthesis, as it would on one engine
    timer.advance(2.0)  # turn 1 stalls after two words: the fallback takes its rest
    items_first, items_second = await collect(first), await collect(second)
    assert opened == [first._active, second._active]
    assert spoken(items_first) == WORDS and spoken(items_second) == ["seven", "eight"]
    assert [s.reason for s in switches(items_first)] == ["stall"]
    assert switches(items_second) == [FallbackEvent("primary", "backup", "open", 0)]


# -- "late" counts from what the primary could start on ------------------------
class SentenceTone(ToneEngine):
    """A tone engine that names Piper's sentence lane (as ``piper-sentence`` does)."""

    strategy = "sentence"


async def test_late_counts_from_the_first_unit_the_primarys_lane_can_start_on():
    from myna.engines.fallback import unit_chunker
    from myna.text import SentenceChunker

    assert isinstance(unit_chunker(FaultyEngine(SentenceTone("p"), None)), SentenceChunker)  # through wrappers
    assert unit_chunker(ToneEngine("p")) is None  # no lane named: it starts on words
    timer = ManualTimer()
    primary = FaultyEngine(SentenceTone("primary"), "hang", 0)
    engine = FallbackEngine(primary, ToneEngine("backup", sample_rate=16_000), clock=timer.clock,
                            call_later=timer.call_later, after_ms=500)
    stream = engine.stream(group=object())
    for word in "one two three four five six seven".split():  # a slow LLM: 7 words in 2.8 s, no sentence end
        stream.push_text(word + " ")
        timer.advance(0.4)
        await settle()
    assert stream._queue.empty()  # far past 500 ms after the first word, and no switch: nothing to start on
    stream.push_text("eight.")
    await settle()
    timer.advance(0.49)
    await settle()
    assert stream._queue.empty()
    timer.advance(0.02)  # 500 ms after the sentence ended: now the primary is late
    stream.end_input()
    items = await collect(stream)
    assert [s.reason for s in switches(items)] == ["late"]


@pytest.mark.serial  # a starved CPU makes the sentence late: a real stall, and the fallback is right
async def test_a_slow_llm_does_not_trip_the_fallback_of_a_healthy_sentence_lane_primary():
    """The report: text trickling into ``piper-sentence`` with ``--fallback``; every turn used to
    switch ("late" from the first word) and the third opened the breaker."""
    from myna.engines.piper import PiperEngine

    base = PiperEngine(workers=1)
    await base.start()
    try:
        sentence = base.variant("piper-sentence", "sentence")
        warm = sentence.stream()
        warm.push_text("Warming up.")
        warm.end_input()
        await collect(warm)
        engine = FallbackEngine(sentence, ToneEngine("backup"), after_ms=1000)
        for turn in range(3):
            stream = engine.stream(group=object())
            items = []

            async def read():
                async for item in stream:
                    items.append(item)

            reader = asyncio.ensure_future(read())
            for word in "Your order ships on Friday.".split():
                stream.push_text(word + " ")
                await asyncio.sleep(0.3)  # 5 words over 1.5 s: the sentence ends after the 1 s deadline
            stream.end_input()
            await asyncio.wait_for(reader, 60)
            assert not switches(items), (turn, switches(items))
            assert spoken(items)[-1].rstrip(".") == "Friday"
        assert engine.breaker.state == "closed"
    finally:
        await base.close()
