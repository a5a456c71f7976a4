"""``myna bench capacity``: the load's shape, the packet-level onset and silence, the bound and
the capacity read from a ramp, and a real run against a worker over WebRTC on loopback.

The run needs a loopback-only network namespace::

    unshare -n sh -c 'ip link set lo up; . .venv/bin/activate; python -m pytest tests/bench/test_capacity.py -q'
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inprocess import loopback_only
from myna.audio.opus import OpusSettings, VoiceOpusEncoder
from myna.audio.playout import FRAME_SAMPLES, SAMPLE_RATE
from myna.bench import capacity as cap

REPO = Path(__file__).resolve().parents[2]


def test_replies_have_the_shape_of_an_agents_conversation():
    rng = random.Random(7)
    plans = [cap.plan_reply(rng) for _ in range(600)]
    words = [len(p.text.split()) for p in plans]
    assert min(words) == cap.REPLY_WORDS[0] and max(words) == cap.REPLY_WORDS[1]
    assert all(cap.USER_TALK_S[0] <= p.user_talk_s <= cap.USER_TALK_S[1] for p in plans)
    assert all(cap.FIRST_TOKEN_S[0] <= p.first_token_s <= cap.FIRST_TOKEN_S[1] for p in plans)
    barged = [p.barge_in_s for p in plans if p.barge_in_s is not None]
    assert 0.06 <= len(barged) / len(plans) <= 0.14  # one reply in ten
    assert all(cap.BARGE_IN_AFTER_S[0] <= b <= cap.BARGE_IN_AFTER_S[1] for b in barged)
    # Each reply starts where a sentence does, as an LLM's reply does, and ends a sentence.
    starts = {s.split()[0] for s in cap.AGENT_SENTENCES}
    assert all(p.text.split()[0] in starts and p.text.endswith(".") and not p.text.endswith("..") for p in plans)
    # The same seed draws the same conversation.
    assert cap.plan_reply(random.Random(3)) == cap.plan_reply(random.Random(3))


def _packets(frames: list[np.ndarray], t0: float = 100.0) -> list[cap.Packet]:
    """Frames encoded as Myna sends them (mono Opus, 32 kbit/s), arriving every 20 ms from ``t0``;
    all-zero frames take the encoder's silent path."""
    encoder = VoiceOpusEncoder(OpusSettings())
    out = []
    for i, pcm in enumerate(frames):
        silent = not pcm.any()
        packet = encoder.encode(pcm, i * FRAME_SAMPLES, silent)
        out.append(cap.Packet(t0 + 0.02 * i, i * FRAME_SAMPLES, bytes(packet)))
    return out


def _tone(n: int) -> np.ndarray:
    return (8000 * np.sin(2 * np.pi * 220 * np.arange(n) / SAMPLE_RATE)).astype(np.int16)


def test_the_onset_is_read_from_the_first_packet_with_sound_by_decoding_only_there():
    silence = [np.zeros(FRAME_SAMPLES, np.int16)] * 30
    sound = np.concatenate([np.zeros(300, np.int16), _tone(20 * FRAME_SAMPLES - 300)])
    frames = silence + [sound[i : i + FRAME_SAMPLES] for i in range(0, len(sound), FRAME_SAMPLES)] + silence
    packets = _packets(frames)
    assert all(len(p.payload) <= cap.IDLE_BYTES for p in packets[10:30])  # settled silence: tiny packets
    heard = cap.onset(packets, since=packets[0].arrival)
    expected = packets[30].arrival + 300 / SAMPLE_RATE
    assert heard is not None and 0.0 <= heard - expected <= 0.012  # (Opus's look-ahead delays the decoded onset)
    # Nothing audible after the sound: no onset.
    assert cap.onset(packets, since=packets[55].arrival) is None
    # Barge-in: the last audible packet after an interrupt at the 35th packet is the sound's last (or the
    # one after: the decoder's delay spills its tail over).
    last = cap.last_sound(packets, since=packets[35].arrival)
    assert last in (packets[49].arrival, packets[50].arrival)
    assert cap.last_sound(packets, since=packets[52].arrival) is None


def test_stalls_count_holes_in_the_packet_stream():
    packets = [cap.Packet(t, 0, b"x" * 50) for t in [0.0, 0.02, 0.04, 0.14, 0.16, 0.18, 0.30, 0.32]]
    assert cap.stalls(packets, 0.0, 1.0) == 2
    assert cap.stalls(packets, 0.15, 0.2) == 0
    assert cap.stalls(packets[:1], 0.0, 1.0) == 0


def _reply(ttfa: float | None, speech_ms: float = 6000.0, gaps: int = 0, stalls: int = 0, underruns: int = 0,
           barge: float | None = None, lost: bool = False) -> cap.ReplyResult:
    return cap.ReplyResult(0.0, 20, ttfa, ttfa, speech_ms, gaps, stalls, underruns, barge, lost=lost)


def _step(replies: list[cap.ReplyResult], level: int = 4) -> cap.Step:
    step = cap.Step(level, None)
    step.replies = replies
    step.finish()
    return step


def test_a_step_holds_the_bound_only_with_p95_under_it_no_underrun_no_loss_and_few_gaps():
    fast = [_reply(150.0 + i) for i in range(40)]  # p95 ~188 ms
    row = cap.summarise(_step(fast))
    assert row["holds"] and row["ttfa_ms"]["p50"] == pytest.approx(169.5) and row["replies"] == 40
    assert row["speech_min"] == 4.0 and row["gaps_per_min"] == 0.0
    slow_tail = fast[:36] + [_reply(400.0)] * 4  # 10 % of replies past the bound: p95 past it
    assert not cap.summarise(_step(slow_tail))["holds"]
    assert not cap.summarise(_step(fast[:39] + [_reply(150.0, underruns=1)]))["holds"]
    assert not cap.summarise(_step(fast[:39] + [_reply(None, lost=True)]))["holds"]
    assert not cap.summarise(_step(fast[:39] + [_reply(None)]))["holds"]  # a reply nobody heard counts as lost
    # 4 minutes of speech: 4 gaps (worker or client side) hold, 5 do not.
    assert cap.summarise(_step(fast[:38] + [_reply(150.0, gaps=2), _reply(150.0, stalls=2)]))["holds"]
    five = cap.summarise(_step(fast[:38] + [_reply(150.0, gaps=3), _reply(150.0, stalls=2)]))
    assert five["gaps_per_min"] == 1.25 and (five["server_gaps"], five["stalls"]) == (3, 2) and not five["holds"]
    barge = cap.summarise(_step(fast[:38] + [_reply(150.0, barge=20.0), _reply(150.0, barge=40.0)]))
    assert barge["barge_in_ms"]["n"] == 2 and barge["barge_in_ms"]["p95"] == pytest.approx(39.0)
    assert not cap.summarise(_step([]))["holds"]


def test_capacity_is_the_largest_step_that_holds():
    rows = [{"sessions": n, "holds": h} for n, h in [(2, True), (4, True), (6, False), (8, True), (10, False)]]
    assert cap.capacity(rows) == 8
    assert cap.capacity([{"sessions": 2, "holds": False}]) == 0
    assert cap.capacity([]) == 0


def test_held_through_is_the_last_step_before_the_first_that_broke():
    rows = [{"sessions": n, "holds": h} for n, h in [(2, True), (4, True), (6, False), (8, True), (10, False)]]
    assert cap.held_through(rows) == 4 and cap.held_through(rows[::-1]) == 4
    assert cap.held_through(rows[:2]) == 4
    assert cap.held_through([{"sessions": 2, "holds": False}, {"sessions": 4, "holds": True}]) == 0
    assert cap.held_through([]) == 0


def test_the_table_names_each_systems_capacity_and_the_ratios():
    row = {**cap.summarise(_step([_reply(150.0)] * 40)), "worker_pct": 40.0}
    row.pop("_replies")
    result = {"bound_ms": 250.0, "max_gaps_per_min": 1.0, "replies_per_step": 40, "cores": 2,
              "systems": [{"label": "myna", "capacity": 8, "held_through": 6, "rows": [row]},
                          {"label": "pipecat-token", "capacity": 2, "rows": [row]},
                          {"label": "pipecat-sentence", "capacity": 0, "rows": []}]}
    table = cap.format_table(result)
    assert "capacity myna: 8 conversations (every step held up to 6)" in table
    assert "myna / pipecat-token: 4.00×" in table and "capacity pipecat-token: 2 conversations\n" in table
    assert "myna / pipecat-sentence: ∞" in table
    assert "| myna | 4 | 40 | 150 | 150 |" in table
    assert "default --max-sessions" not in table  # (none measured)


@pytest.mark.slow
@pytest.mark.network
def test_a_real_ramp_measures_every_reply_and_reads_a_capacity(tmp_path):
    """About 70 s: a real ramp (1 then 2 conversations) plays its replies out at 1× over WebRTC."""
    if not loopback_only():
        pytest.fail("the ramp must run in a loopback-only namespace (unshare -n, see the module docstring)")
    out = tmp_path / "capacity.json"
    proc = subprocess.run([sys.executable, "-m", "myna.cli", "bench", "capacity", "--levels", "1,2", "--replies", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (myna,) = result["systems"]
    assert [r["sessions"] for r in myna["rows"]][:1] == [1]
    for row in myna["rows"]:
        assert row["replies"] >= 2 and row["lost"] == 0 and row["refused"] == 0
        assert 20.0 < row["ttfa_ms"]["p50"] < 2000.0 and row["speech_min"] > 0
        assert row["worker_pct"] > 0.0 and row["clients_pct"] > 0.0
    assert myna["capacity"] == cap.capacity(myna["rows"]) and myna["held_through"] == cap.held_through(myna["rows"])
    assert f"capacity myna: {myna['capacity']} conversations" in proc.stdout
