"""Text to 24 kHz speech with a DSM TTS checkpoint (dsm-inference §2–§4): :func:`load` and
:class:`DSMTTS`, whose :meth:`DSMTTS.synthesize` runs the frame step of :mod:`myna.dsm.frame` for
one text (batch 1) and decodes with Mimi. The turn's trimming rules (:attr:`DSMTTS.skip_frames`,
:meth:`DSMTTS.turn_frames`, :meth:`DSMTTS.word_start_s`) serve the streaming frame loop too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .checkpoint import load_lm, load_mimi, read_config, resolve_checkpoint
from .config import DSMConfig
from .frame import FrameState, FrameStep, Sampling
from .lm import DSMLM
from .mimi import MimiDecoder
from .sampling import exponential_noise
from .state_machine import INITIAL_PADDING, Entry, StateMachine, TextState, TokenIds, script_to_entries
from .voice import VoiceError, as_voice, speaker_slots


@dataclass
class SynthesisResult:
    """Output of :meth:`DSMTTS.synthesize`.

    ``pcm`` float32 [n] at ``sample_rate`` Hz (n = frames·1920), ``words``: (word, start seconds
    into ``pcm``), ``codes`` int64 [n_q, frames]: the Mimi codes ``pcm`` was decoded from,
    ``end_step``: the step at which the text ran out (None if ``max_steps`` was hit first).
    """

    pcm: np.ndarray
    sample_rate: int
    words: list[tuple[str, float]]
    codes: torch.Tensor
    end_step: int | None = None
    text_tokens: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class GenerationResult:
    """Raw frame-loop output for B slots: ``frames`` int64 [B, 1 + n_q, n_frames] (undelayed,
    frame τ = index), per-slot ``states`` of the text state machine, and the (sampled, fed) text
    token pairs per slot."""

    frames: torch.Tensor
    states: list[TextState]
    logged: list[list[tuple[int, int]]]


class DSMTTS:
    """A loaded DSM TTS model: LM (:class:`DSMLM`), Mimi decoder, SentencePiece tokenizer, config.

    Generation settings (dsm-inference §2.6) are plain attributes: ``temperature`` 0.6 (text and audio),
    ``top_k_text`` 25, ``top_k_audio`` 250, ``cfg_value`` "2.0" (the CFG-distilled LUT condition),
    ``final_padding`` 4, ``padding_bonus`` 0, ``max_steps`` 30000, ``n_q`` (codebooks generated
    and decoded; fewer is faster, e.g. 24 as Kyutai's server; default all).
    """

    def __init__(self, lm: DSMLM, mimi: MimiDecoder, tokenizer, cfg: DSMConfig):
        self.lm, self.mimi, self.tokenizer, self.cfg = lm, mimi, tokenizer, cfg
        self.ids = TokenIds(card=cfg.text_in_card, pad=cfg.existing_text_padding_id)
        self.machine = StateMachine(self.ids, cfg.second_stream_ahead, max_padding=8, initial_padding=INITIAL_PADDING)
        self.temperature = 0.6
        self.top_k_text = 25
        self.top_k_audio = 250
        self.cfg_value: str | None = "2.0"
        self.final_padding = 4
        self.padding_bonus = 0.0
        self.max_steps = 30000
        self.n_q = cfg.n_q

    @property
    def sample_rate(self) -> int:
        """Output sample rate in Hz (24000)."""
        return self.cfg.mimi.sample_rate

    @property
    def needs_voice(self) -> bool:
        """True when the checkpoint conditions on a voice (``speaker_wavs``, the 1.6b layout)."""
        cp = self.lm.condition_provider
        return cp is not None and "speaker_wavs" in cp.conditioners

    # ------------------------------------------------------------------ conditions

    def script(self, text: str | Sequence[str]) -> list[Entry]:
        """Words of a text (one string, or one string per speaker turn) as state-machine entries."""
        turns = [text] if isinstance(text, str) else list(text)
        return script_to_entries(lambda w: self.tokenizer.encode(w), turns, self.ids, self.cfg.mimi.frame_rate,
                                 multi_speaker=self.needs_voice, padding_between=1)

    @torch.no_grad()
    def conditions(self, voice=None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(cond_sum fp32 [1, 1, dim] or None, cross source fp32 [1, S, dim] or None) for one slot.
        ``voice``: a voice file path, a tensor [1, C, T], or a list of them (one per speaker)."""
        cp = self.lm.condition_provider
        if cp is None:
            return None, None
        values: dict[str, list[str | None]] = {}
        for name in cp.lut_names:
            if name == "control":
                values[name] = ["ok"]
            elif name == "cfg":
                values[name] = [self.cfg_value]
            else:
                values[name] = [None]
        cond_sum = cp.condition_sum(values)
        cross = None
        if cp.cross_names:
            if voice is None:
                raise VoiceError("this checkpoint needs a voice (speaker_wavs [1, C, 125]); pass "
                                 "voice=<path to a Kyutai voice .safetensors file> or a tensor")
            voices = [as_voice(v) for v in (voice if isinstance(voice, (list, tuple)) else [voice])]
            x, mask = speaker_slots(voices, self.cfg.max_speakers, self.cfg.cross_dim)
            cross = cp.cross_source({"speaker_wavs": (x, mask)})
        return cond_sum, cross

    # ------------------------------------------------------------------ generation

    def sampling(self, greedy: bool = False) -> Sampling:
        """The sampling rule of these settings (what every step, and every frame-loop session, uses)."""
        return Sampling(self.temperature, self.top_k_text, self.top_k_audio, self.padding_bonus, greedy)

    @property
    def skip_frames(self) -> int:
        """Decoded frames dropped at the start of every turn: those of the forced initial padding
        (:data:`~myna.dsm.state_machine.INITIAL_PADDING`, §2.3, §2.5)."""
        return self.machine.initial_padding

    def turn_frames(self, end_step: int | None) -> int | None:
        """How many decoded frames a turn's audio spans, the dropped ones included (frame j ≥ 0 is
        the first with audio): ``skip_frames + end_step``; None while the text has not ended."""
        return None if end_step is None else self.skip_frames + end_step

    def word_start_s(self, step: int) -> float:
        """Seconds into a turn's audio at which the word consumed at text step ``step`` starts."""
        return max(0.0, (step - self.skip_frames) / self.cfg.mimi.frame_rate)

    @torch.no_grad()
    def generate(self, entries: list[list[Entry]], cond_sum: torch.Tensor | None, cross: torch.Tensor | None, *,
                 greedy: bool = False, generator: torch.Generator | None = None) -> GenerationResult:
        """Run the frame step for B = len(entries) slots in lockstep until every slot has ended
        (end_step + delay_steps + final_padding) or ``max_steps``. cond_sum [B, 1, dim] and
        cross [B, S, dim] as from :meth:`conditions`, concatenated.

        Sampling noise comes from ``generator`` (the device's default one if None) in the
        reference's order: text [B, k_text] each step, then [B, k_audio] per codebook on steps
        that run the depformer (none while t < delay_steps), so a seeded CPU run matches it."""
        lm, cfg = self.lm, self.cfg
        B = len(entries)
        fs = FrameState.new(lm, B, cross.shape[1] if cross is not None else 0)
        lm.set_conditions(fs.temporal, slice(None), cond_sum, cross)
        step = FrameStep(lm, fs, self.sampling(greedy), self.n_q)
        draws = step.sampling.draws
        audio_noise = step.audio_noise.transpose(0, 1)  # [n_q, B, k]: one draw per codebook, as the reference
        states = [self.machine.new_state(e) for e in entries]
        logged: list[list[tuple[int, int]]] = [[] for _ in range(B)]
        frames = []
        for t in range(self.max_steps):
            if all(s.end_step is not None for s in states):
                if t >= max(s.end_step for s in states) + cfg.delay_steps + self.final_padding:
                    break
            if draws:
                step.text_noise.exponential_(1, generator=generator)
            sampled = step.text().tolist()
            fed = []
            for b, (tok, st) in enumerate(zip(sampled, states)):
                out = self.machine.process(t, st, tok)
                fed.append(out)
                logged[b].append((tok, out))
            step.text_in.copy_(torch.tensor(fed))
            if t >= cfg.delay_steps:
                if draws:
                    for noise in audio_noise:
                        noise.copy_(exponential_noise(*noise.shape, generator=generator, device=lm.device))
                frame = step.audio()
            else:
                frame = step.commit()
            if t >= cfg.max_delay:
                frames.append(frame.clone())
        stacked = torch.stack(frames, dim=2) if frames else torch.zeros(B, cfg.n_q + 1, 0, dtype=torch.long)
        return GenerationResult(stacked, states, logged)

    @torch.no_grad()
    def synthesize(self, text: str | Sequence[str], voice=None, *, seed: int | None = None,
                   greedy: bool = False) -> SynthesisResult:
        """Speak ``text`` (dsm-inference §2.2–2.5, trimming as the reference's ``simple_generate``).

        ``voice``: a Kyutai voice file or tensor [1, C, 125] (required by the 1.6b layout);
        ``seed`` seeds a private generator; ``greedy`` takes argmax everywhere. Returns a
        :class:`SynthesisResult`; word starts are :meth:`word_start_s`, since the first
        :attr:`skip_frames` decoded frames (the forced initial padding) are dropped. Mimi decodes
        frame by frame, as the streaming loop and the reference do (beyond the Mimi transformer's
        context, 10 s, that differs slightly from a whole-sequence decode: the ring cache holds
        exactly ``context`` entries, in the reference as here).
        """
        cond_sum, cross = self.conditions(voice)
        entries = self.script(text)
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.lm.device)
            gen.manual_seed(seed)
        out = self.generate([entries], cond_sum, cross, greedy=greedy, generator=gen)
        state = out.states[0]
        audio_codes = out.frames[0, 1:1 + self.n_q, self.cfg.delay_steps:]
        skip = self.skip_frames
        keep = audio_codes[:, skip:self.turn_frames(state.end_step)]
        if keep.shape[1] == 0:
            pcm = np.zeros(0, dtype=np.float32)
        else:
            codes = audio_codes[None, :, :skip + keep.shape[1]].to(self.mimi.codebooks.device)
            mimi_state = self.mimi.new_state(1)
            chunks = [self.mimi.decode(codes[:, :, i:i + 1], mimi_state) for i in range(codes.shape[2])]
            pcm_t = torch.cat(chunks[skip:], dim=-1)[0, 0].clamp(-1, 1)
            pcm = pcm_t.float().cpu().numpy().astype(np.float32)
        words = [(w, self.word_start_s(step)) for w, step in state.transcript]
        return SynthesisResult(pcm, self.sample_rate, words, keep.cpu().to(torch.int64), state.end_step,
                               out.logged[0])


def load(path_or_repo: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None, *,
         progress: bool = True) -> DSMTTS:
    """Load a DSM TTS checkpoint (dsm-inference §1) from a folder or a Hugging Face repo id.

    The LM runs in ``dtype`` (default bf16 on CUDA, fp32 elsewhere); Mimi and the conditioners in
    fp32. The folder holds ``config.json`` and the LM, Mimi and SentencePiece files it names.
    """
    import sentencepiece

    folder = resolve_checkpoint(path_or_repo)
    cfg = read_config(folder)
    device = torch.device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lm = load_lm(folder / cfg.files["moshi_name"], cfg, device, dtype, progress)
    mimi = load_mimi(folder / cfg.files["mimi_name"], cfg.mimi, device, progress)
    tok_path = folder / cfg.files["tokenizer_name"]
    if not tok_path.is_file():
        raise FileNotFoundError(f"tokenizer not found: {tok_path}")
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(tok_path))
    return DSMTTS(lm, mimi, tokenizer, cfg)
