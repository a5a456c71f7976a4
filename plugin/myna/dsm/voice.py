"""Voice conditioning inputs (dsm-inference §3): Kyutai voice files and the speaker slots.

A voice file (``kyutai/tts-voices/<name>.wav.<sig>@<epoch>.safetensors``) holds one tensor,
``speaker_wavs`` fp32 [1, 512, 125]: the unquantized Mimi latent of 10 s of speech. The model's
cross-attention source is built from ``max_speakers`` (5) slots of 125 frames each; slot i holds
voice i (transposed to [125, 512]) and the empty slots are masked (they become learnt padding).
"""

from __future__ import annotations

from pathlib import Path

import torch

VOICE_KEY = "speaker_wavs"


class VoiceError(ValueError):
    """A voice is missing, unreadable or of the wrong shape."""


def load_voice(path: str | Path) -> torch.Tensor:
    """Read a Kyutai voice file → fp32 [1, C, T] (C = 512, T = 125 for released voices)."""
    from safetensors.torch import load_file

    path = Path(path)
    if path.suffix != ".safetensors":
        raise VoiceError(f"voice file must be a .safetensors file holding {VOICE_KEY!r}, got {path}")
    if not path.is_file():
        raise VoiceError(f"voice file not found: {path}")
    tensors = load_file(str(path), device="cpu")
    if VOICE_KEY not in tensors:
        raise VoiceError(f"{path} holds no {VOICE_KEY!r} tensor (keys: {sorted(tensors)})")
    emb = tensors[VOICE_KEY]
    if emb.dim() != 3 or emb.shape[0] != 1:
        raise VoiceError(f"{path}: {VOICE_KEY!r} has shape {tuple(emb.shape)}, expected [1, C, T]")
    return emb.float()


def speaker_slots(voices: list[torch.Tensor], max_speakers: int, dim: int,
                  frames: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill the speaker slots (§3 steps 1): voices [1, C, T] each → (x fp32 [1, max_speakers·T, C],
    mask bool [1, max_speakers·T]); the mask is true only on filled slots."""
    if not voices:
        raise VoiceError("no voice given: this checkpoint conditions on a voice (speaker_wavs); pass "
                         "voice=<path to a Kyutai voice .safetensors file> or a tensor [1, C, T]")
    if len(voices) > max_speakers:
        raise VoiceError(f"{len(voices)} voices given, the model has {max_speakers} speaker slots")
    T = frames if frames is not None else voices[0].shape[2]
    x = torch.zeros(1, max_speakers, T, dim)
    mask = torch.zeros(1, max_speakers, T, dtype=torch.bool)
    for i, v in enumerate(voices):
        if v.dim() != 3 or v.shape[0] != 1 or v.shape[1] != dim or v.shape[2] != T:
            raise VoiceError(f"voice {i} has shape {tuple(v.shape)}, expected [1, {dim}, {T}]")
        x[:, i] = v.transpose(1, 2)
        mask[:, i] = True
    return x.view(1, max_speakers * T, dim), mask.view(1, max_speakers * T)


def as_voice(voice: str | Path | torch.Tensor) -> torch.Tensor:
    """A voice given as a file path, ``hf://OWNER/REPO/PATH`` (fetched with huggingface_hub, e.g.
    ``hf://kyutai/tts-voices/expresso/ex03-ex01_happy_001_channel1_334s.wav.1e68beda@240.safetensors``)
    or a tensor [1, C, T] / [C, T] → fp32 [1, C, T]."""
    if isinstance(voice, torch.Tensor):
        v = voice.detach().float().cpu()
        return v[None] if v.dim() == 2 else v
    text = str(voice)
    if text.startswith("hf://"):
        parts = text[len("hf://"):].split("/")
        if len(parts) < 3:
            raise VoiceError(f"expected hf://OWNER/REPO/PATH, got {text}")
        try:
            from huggingface_hub import hf_hub_download
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise VoiceError("hf:// voices need huggingface_hub (pip install 'myna[hub]')") from exc
        voice = hf_hub_download("/".join(parts[:2]), "/".join(parts[2:]))
    return load_voice(voice)
