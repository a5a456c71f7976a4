"""Playout with a virtual clock: frames, resampling, underruns, barge-in, events."""

from __future__ import annotations

import numpy as np
import pytest

from myna.audio.playout import FADE_SAMPLES, FRAME_SAMPLES, Playout
from myna.audio.preroll import FixedPreRoll


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


NO_GAPS = {"gap_ms": {"count": 0, "total": 0.0, "longest": 0.0}, "gaps": []}


def make(clock=None, pre_roll=None, **options):
    """A playout and the JSON of the events it sends once audio is handed out (``turn_started``,
    sent when a turn is queued, is left out: see the test of it)."""
    events: list[dict] = []

    def sink(event) -> None:
        if event.type != "turn_started":
            events.append(event.to_dict())

    return Playout(sink, clock=clock or Clock(), pre_roll=pre_roll, **options), events


def test_a_queued_turn_is_announced_at_once_and_its_audio_when_handed_out():
    sent = []
    playout = Playout(sent.append, clock=Clock())
    playout.begin_turn("a", 100.0)
    playout.begin_turn("b", 100.0)
    assert [(e.type, e.turn_id) for e in sent] == [("turn_started", "a"), ("turn_started", "b")]
    playout.push_audio("a", tone(440, 0.1, 48_000), 48_000)
    playout.end_turn("a")
    assert len(sent) == 2  # nothing is heard until a frame is handed out
    playout.next_frame()
    assert sent[2].type == "first_audio" and sent[2].turn_id == "a"


def done(turn_id: str, audio_ms: float, underruns: int = 0, **extra) -> dict:
    return {"type": "turn_done", "turn_id": turn_id, "audio_ms": audio_ms, "underruns": underruns, **NO_GAPS, **extra}


def tone(freq: float, seconds: float, rate: int, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def drain(playout: Playout, events: list[dict], max_frames: int = 10_000) -> np.ndarray:
    frames = []
    for _ in range(max_frames):
        frame = playout.next_frame()
        assert frame.dtype == np.int16 and frame.shape == (FRAME_SAMPLES,)
        frames.append(frame)
        if events and events[-1]["type"] == "turn_done":
            break
    return np.concatenate(frames)


def test_25_chunks_of_80_ms_make_exactly_100_frames():
    playout, events = make()
    playout.begin_turn("t", 0.0)
    for chunk in np.split(tone(440, 2.0, 48_000), 25):
        playout.push_audio("t", chunk, 48_000)
    playout.end_turn("t")
    out = drain(playout, events)
    assert len(out) == 100 * FRAME_SAMPLES
    assert events[-1] == {"type": "turn_done", "turn_id": "t", "audio_ms": 2000.0, "underruns": 0, **NO_GAPS}


@pytest.mark.parametrize("rate", [24_000, 16_000, 22_050])
def test_a_1_khz_tone_comes_out_at_1_khz_and_the_right_length(rate):
    playout, events = make()
    playout.begin_turn("t", 0.0)
    x = tone(1000, 1.0, rate)
    for chunk in np.array_split(x, 13):  # odd chunk sizes
        playout.push_audio("t", chunk, rate)
    playout.end_turn("t")
    out = drain(playout, events).astype(np.float64) / 32767
    assert abs(events[-1]["audio_ms"] - 1000.0) <= 1.0
    audio = out[: 48_000]
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    assert abs(np.argmax(spectrum) * 48_000 / len(audio) - 1000) <= 2
    assert np.max(np.abs(audio)) == pytest.approx(0.5, abs=0.02)


def test_underruns_fade_without_clicks_and_are_counted():
    # The v1 resume rule (resume as soon as a frame is there) starves twice here; the concealment
    # is what is tested. Re-buffering by the jitter-aware rule is tested below.
    playout, events = make(pre_roll=FixedPreRoll(0.0))
    x = tone(300, 0.6, 48_000, amp=0.8)
    max_step = np.max(np.abs(np.diff(x)))  # the largest jump the audio itself contains
    playout.begin_turn("t", 0.0)
    out = []
    # 100 ms arrives, then 10 frames with nothing, twice; then the rest and the end.
    for piece in np.split(x[: 4800 * 2], 2):
        playout.push_audio("t", piece, 48_000)
        out += [playout.next_frame() for _ in range(10)]
    playout.push_audio("t", x[9600:], 48_000)
    playout.end_turn("t")
    out = np.concatenate(out + [drain(playout, events)]).astype(np.float64) / 32767
    assert events[-1]["underruns"] == 2
    assert np.max(np.abs(np.diff(out))) <= max_step * 1.05 + 2 / 32767
    assert np.any(out[:9600] == 0)  # silence was played while starved


def test_interrupt_half_way_through_a_chunk_keeps_only_a_5_ms_fade():
    clock = Clock()
    playout, events = make(clock)
    playout.begin_turn("t", clock.t)
    playout.push_audio("t", tone(300, 0.08, 48_000, amp=0.8), 48_000)  # one 80 ms chunk
    playout.next_frame()
    playout.next_frame()  # 40 ms of the chunk played
    assert [e.to_dict() for e in playout.interrupt()] == [done("t", 40.0, interrupted=True)]
    frame = playout.next_frame().astype(np.float64) / 32767
    assert np.all(frame[FADE_SAMPLES:] == 0)
    assert np.max(np.abs(frame[:FADE_SAMPLES])) > 0.1
    assert np.max(np.abs(np.diff(frame))) <= 0.8 * 2 * np.pi * 300 / 48_000 + 0.8 / FADE_SAMPLES + 2 / 32767
    assert all(not np.any(playout.next_frame()) for _ in range(10))
    playout.push_audio("t", tone(300, 0.1, 48_000), 48_000)  # late audio of the dropped turn
    assert not np.any(playout.next_frame())
    assert [e["type"] for e in events] == ["first_audio"]


def test_turns_play_back_to_back_and_events_follow_the_frames():
    clock = Clock()
    playout, events = make(clock)
    playout.begin_turn("a", text_at=clock.t)
    playout.begin_turn("b", text_at=clock.t)
    silence = np.zeros(4800, np.float32)
    playout.push_audio("a", np.concatenate([silence, tone(200, 0.1, 48_000)]), 48_000)
    playout.push_word("a", "hello", 100.0)
    playout.end_turn("a")
    playout.push_audio("b", tone(200, 0.05, 48_000), 48_000)
    playout.end_turn("b")
    assert not any(playout.next_frame()[:1])  # leading silence of "a"
    assert events == []
    clock.t += 0.1
    frames = [playout.next_frame() for _ in range(12)]
    kinds = [(e["type"], e["turn_id"]) for e in events]
    assert kinds[:3] == [("first_audio", "a"), ("word", "a"), ("turn_done", "a")]
    assert events[0]["server_ttfa_ms"] == pytest.approx(100.0)
    assert events[1] == {"type": "word", "turn_id": "a", "word": "hello", "start_ms": 100.0}
    assert ("turn_done", "b") in kinds
    assert np.any(frames[-2]) and not np.any(frames[-1][FRAME_SAMPLES // 2 :])  # b follows a without a gap


def test_an_empty_turn_ends_once_and_idle_is_silence():
    playout, events = make()
    assert not np.any(playout.next_frame())
    playout.begin_turn("t", 0.0)
    playout.end_turn("t")
    assert not np.any(playout.next_frame())
    assert events == [done("t", 0.0)]
    assert playout.idle


def test_a_turn_waits_for_a_whole_frame_before_it_starts():
    playout, events = make()
    playout.begin_turn("t", 0.0)
    playout.push_audio("t", tone(300, 0.01, 48_000), 48_000)  # 10 ms: not enough yet
    assert not np.any(playout.next_frame())
    playout.push_audio("t", tone(300, 0.1, 48_000), 48_000)
    assert np.any(playout.next_frame())
    assert events[-1]["type"] == "first_audio"


def test_idle_frames_are_one_shared_read_only_block_of_zeros():
    playout, _ = make()
    a, b = playout.next_frame(), playout.next_frame()
    assert a is b and not a.flags.writeable and not np.any(a) and a.shape == (FRAME_SAMPLES,)


@pytest.mark.parametrize("rate", [48_000, 24_000])
def test_interrupt_while_a_resampled_chunk_is_half_played_continues_then_fades(rate):
    clock = Clock()
    playout, events = make(clock)
    playout.begin_turn("t", clock.t)
    amp, freq = 0.8, 300.0
    playout.push_audio("t", tone(freq, 0.2, rate, amp=amp), rate)  # one 200 ms chunk
    played = []
    for _ in range(5):  # 100 ms: half of the chunk
        played.append(playout.next_frame())
        clock.t += 0.02
    assert [e.to_dict() for e in playout.interrupt()] == [done("t", 100.0, interrupted=True)]
    cut = playout.next_frame()
    out = np.concatenate(played + [cut]).astype(np.float64) / 32767
    # The tail continues the waveform (no jump at the seam) and is silent after 5 ms.
    max_step = amp * 2 * np.pi * freq / 48_000
    assert np.max(np.abs(np.diff(out))) <= max_step * 1.1 + amp / FADE_SAMPLES + 3 / 32767
    assert np.all(cut[FADE_SAMPLES:] == 0)
    assert np.max(np.abs(cut[:FADE_SAMPLES])) > 0.1 * 32767
    assert not np.any(playout.next_frame()) and playout.idle
    assert [e["type"] for e in events] == ["first_audio"]


def test_interrupt_while_starving_adds_no_click():
    clock = Clock()
    playout, events = make(clock, pre_roll=FixedPreRoll(0.0))
    playout.begin_turn("t", clock.t)
    playout.push_audio("t", tone(300, 0.05, 48_000, amp=0.8), 48_000)
    for _ in range(4):  # 50 ms played, then starved (faded to zero)
        playout.next_frame()
    playout.push_audio("t", tone(300, 0.01, 48_000, amp=0.8), 48_000)  # less than a frame: still starving
    playout.interrupt()
    assert not np.any(playout.next_frame())


def test_a_slow_producer_re_buffers_instead_of_stuttering():
    """Chunks of 80 ms every 96 ms (real-time factor 1.2): the start is held at most the budget
    (100 ms), then the jitter-aware rule waits for a buffer after each underrun; the v1 rule
    stalls on every chunk."""

    def run(pre_roll):
        clock = Clock()
        playout, events = make(clock, pre_roll)
        playout.begin_turn("t", clock.t)
        chunk = tone(300, 0.08, 48_000)
        arrivals = [clock.t + 0.096 * (i + 1) for i in range(60)]  # 4.8 s of audio
        frames = 0
        while not events or events[-1]["type"] != "turn_done":
            while arrivals and arrivals[0] <= clock.t:
                arrivals.pop(0)
                playout.push_audio("t", chunk, 48_000)
                if not arrivals:
                    playout.end_turn("t")
            playout.next_frame()
            clock.t += 0.02
            frames += 1
        return events[-1]["underruns"], next(e for e in events if e["type"] == "first_audio")

    ours, first = run(None)
    v1, _ = run(FixedPreRoll(0.0))
    assert v1 >= 30 and ours <= 4
    assert 40 <= first["pre_roll_ms"] <= 100  # held, but within the budget


def test_first_audio_carries_the_pre_roll_chosen():
    clock = Clock()
    playout, events = make(clock)
    playout.begin_turn("t", clock.t)
    clock.t += 0.1  # the first 80 ms come 100 ms after the text: maybe slower than real time
    playout.push_audio("t", tone(300, 0.08, 48_000), 48_000)
    assert not np.any(playout.next_frame())  # one chunk of an unknown producer: wait
    waited = 0
    while not events:
        clock.t += 0.02
        waited += 1
        if waited == 3:  # the second chunk arrives 60 ms later
            playout.push_audio("t", tone(300, 0.08, 48_000), 48_000)
        playout.next_frame()
    assert events[0]["type"] == "first_audio"
    assert events[0]["pre_roll_ms"] == pytest.approx(1000 * (clock.t - 100.1), abs=0.1)
    assert events[0]["pre_roll_ms"] >= 60.0


def test_words_follow_first_audio_and_a_slower_than_real_time_producer_is_held_at_most_the_budget():
    from myna.audio.playout import MAX_HOLD_S

    clock = Clock()
    playout, events = make(clock)
    playout.begin_turn("t", clock.t)
    playout.push_word("t", "first", 0.0)
    lead_in = np.zeros(2400, np.float32)  # 50 ms of quiet before the voice
    playout.push_audio("t", np.concatenate([lead_in, tone(200, 0.15, 48_000)]), 48_000)
    waited = 0.0
    while not np.any(playout.next_frame()):
        clock.t += 0.02
        waited += 0.02
        if abs(waited - 0.3) < 1e-9:  # a second chunk, 300 ms for 200 ms of audio: rate 1.5
            playout.push_audio("t", tone(200, 0.2, 48_000), 48_000)
        assert waited <= MAX_HOLD_S + 0.05, "the first audio was held past the latency budget"
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["first_audio", "word"], kinds


def test_a_frame_level_turn_starts_within_the_budget_given():
    """One 80 ms chunk of an unknown producer: the jitter-aware rule would wait for more; the
    budget (here 40 ms) starts it anyway, at the last deadline within it; 0 starts at once."""
    for budget_s, most_ms in ((0.04, 40.0), (0.0, 0.0)):
        clock = Clock()
        playout, events = make(clock, max_hold_s=budget_s)
        playout.begin_turn("t", clock.t)
        clock.t += 0.1  # slow to come: the rule alone would hold it
        playout.push_audio("t", tone(300, 0.08, 48_000), 48_000)
        while not events:
            playout.next_frame()
            clock.t += 0.02
        assert events[0]["type"] == "first_audio" and events[0]["pre_roll_ms"] <= most_ms


def run_chunks(playout, events, clock, arrivals, end_at=None):
    """Deliver ``(time, pcm)`` chunks of turn "t" at their times, one frame per 20 ms, until
    ``turn_done``; ``end_at``: when ``end_turn`` comes (default: with the last chunk)."""
    arrivals = list(arrivals)
    end_at = arrivals[-1][0] if end_at is None else end_at
    frames = []
    while not events or events[-1]["type"] != "turn_done":
        while arrivals and arrivals[0][0] <= clock.t + 1e-9:
            playout.push_audio("t", arrivals.pop(0)[1], 48_000)
        if not arrivals and clock.t + 1e-9 >= end_at:
            playout.end_turn("t")
        frames.append(playout.next_frame())
        clock.t += 0.02
        assert len(frames) < 1000
    return np.concatenate(frames)


def test_a_late_clause_is_a_gap_between_words_not_an_underrun():
    """Chunks that end at word boundaries (Piper): the turn starts with its first clause at once;
    the second clause, 200 ms late, is a pause at the boundary, measured in turn_done."""
    clock = Clock()
    playout, events = make(clock, chunks_end_at_words=True)
    playout.begin_turn("t", clock.t)
    t0 = clock.t
    out = run_chunks(playout, events, clock, [(t0, tone(300, 0.1, 48_000)), (t0 + 0.3, tone(300, 0.1, 48_000))])
    first = next(e for e in events if e["type"] == "first_audio")
    assert first["pre_roll_ms"] == 0.0  # no hold at all
    last = events[-1]
    assert last["underruns"] == 0 and last["audio_ms"] == 200.0
    assert last["gap_ms"]["count"] == 1 and last["gaps"] == [[100.0, last["gap_ms"]["total"]]]
    assert 180.0 <= last["gap_ms"]["total"] == last["gap_ms"]["longest"] <= 220.0
    silent = np.flatnonzero(np.abs(out) > 0)
    pause = np.max(np.diff(silent)) / 48.0  # the silence between the clauses (ms)
    assert pause == pytest.approx(last["gap_ms"]["total"], abs=6.0)  # what is reported is what is heard


def test_silence_at_the_end_of_a_turn_is_not_a_gap():
    clock = Clock()
    playout, events = make(clock, chunks_end_at_words=True)
    playout.begin_turn("t", clock.t)
    run_chunks(playout, events, clock, [(clock.t, tone(300, 0.1, 48_000))], end_at=clock.t + 0.5)
    assert events[-1] == done("t", 100.0)


def test_gaps_are_listed_up_to_32_and_all_counted():
    clock = Clock()
    playout, events = make(clock, chunks_end_at_words=True)
    playout.begin_turn("t", clock.t)
    t0 = clock.t
    run_chunks(playout, events, clock, [(t0 + 0.1 * i, tone(300, 0.04, 48_000)) for i in range(40)])
    last = events[-1]
    assert last["gap_ms"]["count"] == 39 and len(last["gaps"]) == 32
    assert last["gaps"][0][0] == 40.0 and all(b[0] > a[0] for a, b in zip(last["gaps"], last["gaps"][1:]))


def test_interrupted_turns_report_their_gaps():
    clock = Clock()
    playout, events = make(clock, chunks_end_at_words=True)
    playout.begin_turn("t", clock.t)
    playout.push_audio("t", tone(300, 0.1, 48_000), 48_000)
    for _ in range(10):  # 100 ms played, then 100 ms of gap
        playout.next_frame()
        clock.t += 0.02
    playout.push_audio("t", tone(300, 0.1, 48_000), 48_000)
    for _ in range(2):
        playout.next_frame()
    dropped = [e.to_dict() for e in playout.interrupt()]
    assert dropped[0]["interrupted"] is True and dropped[0]["gap_ms"]["count"] == 1
    assert dropped[0]["gaps"] == [[100.0, 100.0]]


def test_audio_runs_out_when_the_queued_audio_has_played():
    clock = Clock()
    playout, _ = make(clock)
    assert playout.audio_runs_out_at() == clock.t
    playout.begin_turn("a", clock.t)
    playout.begin_turn("b", clock.t)
    playout.push_audio("a", tone(300, 0.5, 48_000), 48_000)
    playout.push_audio("b", tone(300, 0.25, 48_000), 48_000)
    assert playout.audio_runs_out_at() == pytest.approx(clock.t + 0.75)
    playout.next_frame()
    clock.t += 0.02
    assert playout.audio_runs_out_at() == pytest.approx(clock.t + 0.73)  # one frame played
