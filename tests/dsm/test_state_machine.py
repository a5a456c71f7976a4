"""The text side (myna.dsm.state_machine, myna.dsm.sampling): the spec's worked example, the
reference state machine and script splitting on random inputs, and the sampler."""

from __future__ import annotations

import random

import pytest
import torch

from myna.dsm.sampling import exponential_noise, noise_width, sample_token
from myna.dsm.state_machine import Entry, StateMachine, TokenIds, script_to_entries

CARD = 8001


def _pairs(out: int) -> tuple[int, int]:
    return out % CARD, out // CARD - 1


def test_spec_example_always_asking_for_words():
    """dsm-inference §2.3 example: (main, second) for steps 0..7 when the model always samples WORD."""
    words = [[1, 100, 101], [200], [300, 301], [400], [500]]
    entries = [Entry(w, str(i), padding=len(w)) for i, w in enumerate(words)]
    machine = StateMachine(TokenIds(CARD), second_stream_ahead=2, max_padding=8, initial_padding=2)
    state = machine.new_state(entries)
    got = [_pairs(machine.process(t, state, 0)) for t in range(8)]
    assert got == [(3, -1), (3, -1), (1, 0), (100, 300), (101, 301), (3, -1), (200, 0), (3, 400)]
    assert state.consumption_steps == [2, 6]


@pytest.mark.parametrize("ahead", [0, 2])
def test_matches_reference_on_random_tokens(ahead):
    tts = pytest.importorskip("moshi.models.tts")
    rng = random.Random(ahead)
    for trial in range(20):
        words = [[rng.randrange(4, 50) for _ in range(rng.randrange(0, 4))] for _ in range(rng.randrange(1, 8))]
        pads = [rng.randrange(0, 4) for _ in words]
        ours_m = StateMachine(TokenIds(CARD), ahead, max_padding=8, initial_padding=2)
        ref_m = tts.StateMachine(tts.TokenIds(CARD), second_stream_ahead=ahead, max_padding=8, initial_padding=2)
        ours_s = ours_m.new_state([Entry(w, f"w{i}", p) for i, (w, p) in enumerate(zip(words, pads))])
        ref_s = ref_m.new_state([tts.Entry(w, f"w{i}", p) for i, (w, p) in enumerate(zip(words, pads))])
        for step in range(60):
            token = rng.choice([0, 3, 3, 3, 7])
            assert ours_m.process(step, ours_s, token) == ref_m.process(step, ref_s, token)[0], (trial, step)
        assert ours_s.end_step == ref_s.end_step
        assert ours_s.consumption_steps == ref_s.consumption_times
        assert ours_s.transcript == ref_s.transcript


def test_script_to_entries_matches_reference(ours):
    tts = pytest.importorskip("moshi.models.tts")
    turns = ['Hello: (big) world’s <break time="0.5s"/> end.', "", "Other speaker here?  <break time=\"2s\"/>"]
    enc = ours.tokenizer.encode
    for between in (0, 1):
        for multi in (True, False):
            got = script_to_entries(enc, turns, TokenIds(129), 12.5, multi, between)
            ref = tts.script_to_entries(ours.tokenizer, tts.TokenIds(129), 12.5, turns, multi, between)
            assert [(e.tokens, e.text, e.padding) for e in got] == [(e.tokens, e.text, e.padding) for e in ref]


def test_sampler_greedy_topk_and_seed():
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.9], [3.0, 0.0, 0.0, 0.0]])
    assert sample_token(logits, 0.6, 25, None).tolist() == [1, 0]
    assert noise_width(2, 4) == 2 and noise_width(25, 4) == 4 and noise_width(0, 4) == 4
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_token(logits, 1.0, 2, exponential_noise(2, 2, generator=gen)) for _ in range(200)])
    assert set(draws[:, 0].tolist()) <= {1, 3} and len(set(draws[:, 0].tolist())) == 2
    a = sample_token(logits, 0.6, 25, exponential_noise(2, 4, generator=torch.Generator().manual_seed(5)))
    b = sample_token(logits, 0.6, 25, exponential_noise(2, 4, generator=torch.Generator().manual_seed(5)))
    assert torch.equal(a, b)


def test_sampler_matches_reference_rng_order():
    sampling = pytest.importorskip("moshi.utils.sampling")
    logits = torch.randn(3, 1, 1, 40, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(11)
    ref = sampling.sample_token(logits, True, 0.6, 25)[:, 0, 0]
    torch.manual_seed(11)
    assert torch.equal(sample_token(logits[:, 0, 0], 0.6, 25, exponential_noise(3, 25)), ref)
