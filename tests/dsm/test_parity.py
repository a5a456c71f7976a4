"""Parity of myna.dsm with the reference implementation (moshi 0.2.13) on a tiny checkpoint, fp32 CPU
(dsm-inference §8): embeddings, conditions, temporal steps, depformer logits, the teacher-forced forward,
greedy and seeded generation, and end-to-end synthesis."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("moshi")

ATOL = 1e-5
TEXT = "Hello world, this is a tiny test."
TEXT2 = "Quiet zebras jog by."


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.fixture(scope="module")
def conds(ours, ref_tts, voice_path):
    """Conditions for one slot from both sides: (ours_sum, ours_cross, ref_sum, ref_cross, ref_attrs)."""
    attrs = ref_tts.make_condition_attributes([voice_path], cfg_coef=2.0)
    ct = ref_tts.lm.condition_provider.prepare_and_provide([attrs])
    ref_sum, ref_cross = ref_tts.lm.fuser.get_sum(ct), ref_tts.lm.fuser.get_cross(ct)
    our_sum, our_cross = ours.conditions(voice_path)
    return our_sum, our_cross, ref_sum, ref_cross, attrs


def test_conditions(conds):
    our_sum, our_cross, ref_sum, ref_cross, _ = conds
    assert our_sum.shape == ref_sum.shape and our_cross.shape == ref_cross.shape
    assert maxdiff(our_sum, ref_sum) <= ATOL
    assert maxdiff(our_cross, ref_cross) <= ATOL


def test_embeddings(ours, ref_tts):
    lm, rl = ours.lm, ref_tts.lm
    cfg = lm.cfg
    n = cfg.text_in_card
    text = torch.tensor([[-1, 0, 3, 57, cfg.text_card, 3 + n, 57 + 58 * n, cfg.text_card + (n - 1) * n, 1 + 4 * n]])
    assert maxdiff(lm.text_emb(text), rl.text_emb(text)) == 0.0
    assert maxdiff(lm.depformer_text_emb(text), rl.depformer_text_emb(text)) <= ATOL
    audio = torch.tensor([[-1, 0, 7, cfg.card - 1, cfg.card]])
    for q in range(cfg.n_q):
        seq = torch.full((1, cfg.n_q + 1, audio.shape[1]), -1)
        seq[:, q + 1] = audio
        ours_x = lm.embed_inputs(seq) - lm.text_emb(seq[:, 0])
        ref_x = sum(rl.emb[i](seq[:, i + 1]) for i in range(cfg.n_q))
        assert maxdiff(ours_x, ref_x) <= ATOL
        assert (ours_x[:, 0] == 0).all()  # -1 embeds to exactly zero
        if q < cfg.n_q - 1:
            assert maxdiff(lm.depformer_emb[q](audio), rl.depformer_emb[q](audio)) <= ATOL


def test_temporal_steps_with_conditions(ours, ref_tts, conds):
    """Six streaming steps, batch 2, with the cond sum and the voice: h and text logits."""
    lm, rl = ours.lm, ref_tts.lm
    our_sum, our_cross, ref_sum, ref_cross, _ = conds
    B, K = 2, lm.cfg.n_q + 1
    gen = torch.Generator().manual_seed(0)
    state = lm.new_state(B, our_cross.shape[1])
    lm.set_conditions(state, slice(None), our_sum.expand(B, -1, -1), our_cross.expand(B, -1, -1))
    worst = 0.0
    with rl.streaming(B):
        for _ in range(6):
            tokens = torch.randint(0, lm.cfg.card, (B, K), generator=gen)
            tokens[:, 0] = torch.randint(0, lm.cfg.text_in_card * 3, (B,), generator=gen)
            tokens[0, 3] = -1
            h, logits = lm.forward_text(state, tokens)
            rh, rlogits = rl.forward_text(tokens[:, :, None], ref_sum.expand(B, -1, -1), ref_cross.expand(B, -1, -1))
            worst = max(worst, maxdiff(h, rh), maxdiff(logits, rlogits[:, 0, 0]))
    assert worst <= ATOL, worst


def test_depformer_logits_per_codebook(ours, ref_tts):
    """Two frames through the depformer chain, per-codebook logits, with the cache reused."""
    lm, rl = ours.lm, ref_tts.lm
    cfg = lm.cfg
    B = 2
    gen = torch.Generator().manual_seed(1)
    cache = lm.depformer.new_cache(B, cfg.dep_q, "cpu", torch.float32)
    for _ in range(2):
        h = torch.randn(B, 1, cfg.dim, generator=gen)
        prev = torch.tensor([5 + 7 * cfg.text_in_card, 3])
        with rl.depformer.streaming(B):
            for k in range(cfg.dep_q):
                ours_l = lm.depformer_logits(k, prev, h, cache)
                ref_l = rl.forward_depformer(k, prev[:, None, None], h)[:, 0, 0]
                assert maxdiff(ours_l, ref_l) <= ATOL, k
                prev = torch.randint(0, cfg.card, (B,), generator=gen)


def test_teacher_forced_forward(ours, ref_tts, conds):
    lm, rl = ours.lm, ref_tts.lm
    cfg = lm.cfg
    our_sum, our_cross, _, _, attrs = conds
    B, T = 2, 24
    gen = torch.Generator().manual_seed(2)
    codes = torch.randint(0, cfg.card, (B, cfg.n_q + 1, T), generator=gen)
    codes[:, 0] = torch.randint(0, cfg.text_in_card * 4, (B, T), generator=gen)
    codes[1, 2, 5] = -1
    ct = rl.condition_provider.prepare_and_provide([attrs, attrs])
    ref = rl(codes, ct)
    logits, text = lm(codes, our_sum.expand(B, -1, -1), our_cross.expand(B, -1, -1))
    valid = ~torch.isnan(logits)
    assert torch.equal(valid, ~torch.isnan(ref.logits))
    assert maxdiff(logits[valid], ref.logits[valid]) <= ATOL
    tvalid = ~torch.isnan(text)
    assert maxdiff(text[tvalid], ref.text_logits[tvalid]) <= ATOL


def _ref_generate(ref_tts, texts, attrs, **kw):
    entries = [ref_tts.prepare_script([t], padding_between=1) for t in texts]
    res = ref_tts.generate(entries, [attrs] * len(texts), **kw)
    return entries, res


def _compare_generation(ours, ref_tts, texts, conds, greedy: bool, seed: int | None = None):
    our_sum, our_cross, _, _, attrs = conds
    B = len(texts)
    if seed is not None:
        torch.manual_seed(seed)
    ref_entries, ref = _ref_generate(ref_tts, texts, attrs, use_sampling=not greedy)
    our_entries = [ours.script(t) for t in texts]
    assert [[(e.tokens, e.text, e.padding) for e in es] for es in our_entries] == \
        [[(e.tokens, e.text, e.padding) for e in es] for es in ref_entries]
    if seed is not None:
        torch.manual_seed(seed)
    out = ours.generate(our_entries, our_sum.expand(B, -1, -1), our_cross.expand(B, -1, -1), greedy=greedy)
    ref_frames = torch.cat(ref.frames, dim=2)
    assert out.frames.shape == ref_frames.shape
    assert torch.equal(out.frames, ref_frames)
    assert [s.end_step for s in out.states] == ref.end_steps
    assert [s.consumption_steps for s in out.states] == ref.all_consumption_times
    assert [s.transcript for s in out.states] == ref.all_transcripts
    assert out.logged == ref.logged_text_tokens
    return out


def test_greedy_generation_identical(ours, ref_tts, conds):
    out = _compare_generation(ours, ref_tts, [TEXT], conds, greedy=True)
    assert out.states[0].end_step is not None
    assert (out.frames[0, 1:, ours.cfg.delay_steps + 2:] >= 0).all()


def test_greedy_generation_batch_of_two(ours, ref_tts, conds):
    _compare_generation(ours, ref_tts, [TEXT, TEXT2], conds, greedy=True)


def test_seeded_sampling_identical(ours, ref_tts, conds):
    out = _compare_generation(ours, ref_tts, [TEXT], conds, greedy=False, seed=1234)
    greedy = ours.generate([ours.script(TEXT)], *conds[:2], greedy=True)
    assert out.frames.shape != greedy.frames.shape or not torch.equal(out.frames, greedy.frames)


def test_synthesize_matches_simple_generate(ours, ref_tts, voice_path):
    """End to end: text → PCM, our synthesize(seed) against the reference simple_generate."""
    torch.manual_seed(7)
    ref_pcm = ref_tts.simple_generate(TEXT, str(voice_path), show_progress=False)[0]
    res = ours.synthesize(TEXT, voice_path, seed=7)
    assert res.pcm.dtype == np.float32 and res.sample_rate == 24000
    assert res.pcm.shape == tuple(ref_pcm.shape)
    assert np.abs(res.pcm - ref_pcm.numpy()).max() <= ATOL
    assert res.codes.dtype == torch.int64 and res.codes.shape == (ours.cfg.n_q, res.pcm.shape[0] // 1920)


def test_reduced_n_q_greedy_identical(ours, ref_tts, conds):
    """Generating 4 of the 6 codebooks (dsm-inference §2.6 "reduced n_q") matches the reference."""
    our_sum, our_cross, _, _, attrs = conds
    full = ref_tts.n_q
    ref_tts.n_q, ours.n_q = 4, 4
    try:
        _, ref = _ref_generate(ref_tts, [TEXT2], attrs, use_sampling=False)
        out = ours.generate([ours.script(TEXT2)], our_sum, our_cross, greedy=True)
    finally:
        ref_tts.n_q, ours.n_q = full, full
        ref_tts.lm.dep_q = full
    ref_frames = torch.cat(ref.frames, dim=2)
    assert ref_frames.shape[1] == 5
    assert torch.equal(out.frames[:, :5], ref_frames)
    assert (out.frames[:, 5:] == -1).all()
    assert [s.end_step for s in out.states] == ref.end_steps
