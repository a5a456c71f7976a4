"""One 80 ms DSM frame step for B slots (dsm-inference §2.4), the only copy of it: :meth:`DSMTTS.generate
<myna.dsm.tts.DSMTTS.generate>` (so ``synthesize()``) and the frame loop (eagerly, or replaying the
CUDA graphs captured from it) both run :class:`FrameStep`.

A step is split in phases where the host runs the text state machine:

1. :meth:`FrameStep.text`: inputs from the token cache (the delays) → temporal transformer → text
   logits with every logit rule (``padding_bonus`` on PAD) → sample: the sampled token per slot.
   The host's state machine then maps each sample to the token the model reads next, and writes
   it to :attr:`FrameStep.text_in`.
2. :meth:`FrameStep.audio`: the depformer chain from ``text_in`` → audio mask → commit (write the
   tokens, advance, read the undelayed frame); or :meth:`FrameStep.commit`, a text-only step (every
   slot in its first ``delay_steps`` steps) that commits without the depformer.

The phases read and write only tensors: the state (:class:`FrameState`, positions included) and
static inputs the caller fills between phases (sampling noise, ``text_in``). Nothing branches on
tensor values or allocates from Python data, so each phase is capturable as a CUDA graph; a test
runs every phase under a dispatch-mode checker to keep it so. ``exec_mask`` freezes slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layers import swap_rows
from .lm import DSMLM, TemporalState
from .sampling import noise_width, sample_token


@dataclass
class FrameState:
    """State of the frame step for B slots, created once per batch by :meth:`new` and updated in place:

    - ``tokens`` int64 [B, 1 + n_q, max_delay + 2]: ring of the last generated tokens (−2 = none);
    - ``offset`` int64 [B]: the step index t of each slot;
    - ``initial``, ``delays`` int64 [1 + n_q]: initial token and delay per stream (constants);
    - ``temporal``: the :class:`TemporalState` (KV caches, positions, conditions, ``exec_mask``);
    - ``dep_cache``: the depformer's per-frame KV cache [L, 2, B, H, dep_q, Dh], reused every frame.
    """

    tokens: torch.Tensor
    offset: torch.Tensor
    initial: torch.Tensor
    delays: torch.Tensor
    temporal: TemporalState
    dep_cache: torch.Tensor

    @classmethod
    def new(cls, lm: DSMLM, batch_size: int, cross_len: int = 0) -> "FrameState":
        """A fresh state for ``batch_size`` slots on the model's device (``cross_len``: the voice
        length of the cross-attention source, max_speakers·125 for 1.6b)."""
        cfg, dev = lm.cfg, lm.device
        return cls(tokens=torch.full((batch_size, cfg.n_q + 1, cfg.max_delay + 2), -2, dtype=torch.long, device=dev),
                   offset=torch.zeros(batch_size, dtype=torch.long, device=dev),
                   initial=torch.tensor([cfg.text_card] + [cfg.card] * cfg.n_q, device=dev),
                   delays=torch.tensor(cfg.delays, device=dev),
                   temporal=lm.new_state(batch_size, cross_len),
                   dep_cache=lm.depformer.new_cache(batch_size, cfg.dep_q, dev, lm.dtype))

    @property
    def batch_size(self) -> int:
        return self.offset.shape[0]

    @property
    def exec_mask(self) -> torch.Tensor:
        """bool [B]: false freezes a slot (its state stays exactly as it is)."""
        return self.temporal.exec_mask

    def reset(self, mask: torch.Tensor) -> None:
        """Restart the slots where ``mask`` (bool [B]) is true."""
        self.tokens.masked_fill_(mask[:, None, None], -2)
        self.offset.masked_fill_(mask, 0)
        self.temporal.reset(mask)

    def swap(self, i: int, j: int) -> None:
        """Exchange slots i and j (``dep_cache`` is scratch, rewritten within every frame)."""
        swap_rows(self.tokens, i, j)
        swap_rows(self.offset, i, j)
        self.temporal.swap(i, j)

    def narrow(self, n: int) -> "FrameState":
        """The first n slots, sharing storage (in-place updates of the view update this state)."""
        return FrameState(self.tokens[:n], self.offset[:n], self.initial, self.delays, self.temporal.narrow(n),
                          self.dep_cache[:, :, :n])


def frame_inputs(fs: FrameState) -> torch.Tensor:
    """Inputs of step t (§2.4 step 1): the initial token while t ≤ delay_k (and for frozen slots),
    else the token written at step t − 1. Returns int64 [B, 1 + n_q]."""
    ring = fs.tokens.shape[2]
    pos = (fs.offset % ring)[:, None, None].expand(-1, fs.tokens.shape[1], 1)
    prev = fs.tokens.gather(2, pos)[:, :, 0]
    is_init = (fs.offset[:, None] <= fs.delays[None, :]) | ~fs.exec_mask[:, None]
    return torch.where(is_init, fs.initial[None, :], prev)


@dataclass(frozen=True)
class Sampling:
    """How a step samples (§2.4 step 4, §2.6): ``temperature`` (text and audio), ``top_k_text``,
    ``top_k_audio``, ``padding_bonus`` (added to the PAD logit; positive means slower speech) and
    ``greedy`` (argmax everywhere, as is a temperature ≤ 0)."""

    temperature: float = 0.6
    top_k_text: int = 25
    top_k_audio: int = 250
    padding_bonus: float = 0.0
    greedy: bool = False

    @property
    def draws(self) -> bool:
        """Whether sampling consumes noise (False: greedy)."""
        return not self.greedy and self.temperature > 0.0


class FrameStep:
    """The frame step for the B slots of ``fs`` (see the module docstring).

    Static inputs, filled by the caller before the phase that reads them:

    - ``text_noise`` fp32 [B, k_text] and ``audio_noise`` fp32 [B, n_q, k_audio]: Exp(1) draws for
      :func:`~myna.dsm.sampling.sample_token` (k = :func:`~myna.dsm.sampling.noise_width`); unread
      when greedy. Row b, codebook q is slot b's q-th audio draw of the step;
    - ``text_in`` int64 [B]: the state machine's output (the muxed text token each slot reads).

    Args:
        lm: the model; fs: the state; sampling: the sampling rule.
        n_q: codebooks generated (fewer than the model's: the rest are −1, §2.6 "reduced n_q").
        delay_steps: audio is masked while t < delay_steps + delay_q (§2.4 step 6); default the
            model's (16 for 1.6b).
    """

    def __init__(self, lm: DSMLM, fs: FrameState, sampling: Sampling = Sampling(), n_q: int | None = None,
                 delay_steps: int | None = None, *, text_noise: torch.Tensor | None = None,
                 audio_noise: torch.Tensor | None = None, text_in: torch.Tensor | None = None):
        cfg, dev, B = lm.cfg, lm.device, fs.batch_size
        self.lm, self.fs, self.sampling = lm, fs, sampling
        self.n_q = cfg.dep_q if n_q is None else n_q
        self.delay_steps = cfg.delay_steps if delay_steps is None else delay_steps
        self.pad = cfg.existing_text_padding_id
        k_text = noise_width(sampling.top_k_text, cfg.text_out_card)
        k_audio = noise_width(sampling.top_k_audio, cfg.card)
        self.text_noise = text_noise if text_noise is not None else torch.ones(B, k_text, device=dev)
        self.audio_noise = audio_noise if audio_noise is not None else torch.ones(B, self.n_q, k_audio, device=dev)
        self.text_in = text_in if text_in is not None else torch.full((B,), self.pad, dtype=torch.long, device=dev)
        #: the temporal output of the last :meth:`text` (the graph's static output once captured)
        self.h: torch.Tensor | None = None

    def narrow(self, n: int) -> "FrameStep":
        """The step for the first n slots, sharing state and inputs (a batch bucket of the loop)."""
        return FrameStep(self.lm, self.fs.narrow(n), self.sampling, self.n_q, self.delay_steps,
                         text_noise=self.text_noise[:n], audio_noise=self.audio_noise[:n], text_in=self.text_in[:n])

    def text(self) -> torch.Tensor:
        """Phase 1: temporal step, text logits, logit rules, sampling. Returns int64 [B] (on the device)."""
        s = self.sampling
        h, logits = self.lm.forward_text(self.fs.temporal, frame_inputs(self.fs))
        if s.padding_bonus:
            logits[:, self.pad] += s.padding_bonus
        self.h = h
        return sample_token(logits, s.temperature, s.top_k_text, self.text_noise if s.draws else None)

    def audio(self) -> torch.Tensor:
        """Phase 2: the codebook chain (§2.4 step 5) — codebook k reads the sample of k − 1, the
        muxed text token ``text_in`` for k = 0 — then :meth:`commit`'s work. Returns the frame."""
        s = self.sampling
        prev, out = self.text_in, []
        for k in range(self.n_q):
            logits = self.lm.depformer_logits(k, prev, self.h, self.fs.dep_cache)
            prev = sample_token(logits, s.temperature, s.top_k_audio, self.audio_noise[:, k] if s.draws else None)
            out.append(prev)
        return self._commit(torch.stack(out, dim=1))

    def commit(self) -> torch.Tensor:
        """Phase 2 of a text-only step: no depformer, all audio −1. Returns the frame."""
        return self._commit(None)

    def _commit(self, audio: torch.Tensor | None) -> torch.Tensor:
        """Finish step t (§2.4 steps 6–8): mask codebook q to −1 while t < delay_steps + delay_q,
        write ``text_in`` and the audio at t + 1, advance (frozen slots stay), and return the
        undelayed frame τ = t + 1 − max_delay, int64 [B, 1 + n_q] (valid once t ≥ max_delay)."""
        cfg, fs, text = self.lm.cfg, self.fs, self.text_in
        B = text.shape[0]
        if audio is None:
            audio = torch.full((B, cfg.n_q), -1, dtype=torch.long, device=text.device)
        elif audio.shape[1] < cfg.n_q:
            rest = torch.full((B, cfg.n_q - audio.shape[1]), -1, dtype=torch.long, device=text.device)
            audio = torch.cat([audio, rest], dim=1)
        masked = fs.offset[:, None] < (self.delay_steps + fs.delays[None, 1:])
        audio = torch.where(masked, torch.full_like(audio, -1), audio)
        run = fs.exec_mask
        fs.offset.copy_(torch.where(run, fs.offset + 1, fs.offset))
        new = torch.cat([text[:, None], audio], dim=1)
        ring = fs.tokens.shape[2]
        idx = (fs.offset % ring)[:, None, None].expand(-1, new.shape[1], 1)
        old = fs.tokens.gather(2, idx)[:, :, 0]
        fs.tokens.scatter_(2, idx, torch.where(run[:, None], new, old)[:, :, None])
        read = ((fs.offset[:, None] - cfg.max_delay + fs.delays[None, :]) % ring)[:, :, None]
        return fs.tokens.gather(2, read)[:, :, 0]
