"""Our PyTorch port of Kyutai's delayed-streams-modeling (DSM) TTS.

- :func:`load` reads a released checkpoint (``kyutai/tts-1.6b-en_fr`` layout) into a :class:`DSMTTS`;
- :meth:`DSMTTS.synthesize` turns text and a voice into 24 kHz PCM;
- :mod:`myna.dsm.frame` holds the batched frame step that ``synthesize`` and the streaming frame
  loop (:mod:`myna.dsm.loop`) both run.

Tests build tiny random checkpoints in the released layout with :mod:`myna.bench.tiny_dsm` (tooling).

Modules: ``config`` (sizes and presets), ``checkpoint`` (loading), ``layers`` (norms, RoPE, FFN,
attention, ring KV cache), ``lm`` (embeddings, temporal transformer), ``depformer``,
``conditioners``, ``voice``, ``sampling``, ``state_machine`` (text side), ``frame`` (one step),
``mimi`` (decoder), ``tts`` (synthesis), ``loop`` (the batched frame loop).
"""

from .config import DSMConfig, MimiConfig
from .tts import DSMTTS, SynthesisResult, load

__all__ = ["DSMConfig", "DSMTTS", "MimiConfig", "SynthesisResult", "load"]
