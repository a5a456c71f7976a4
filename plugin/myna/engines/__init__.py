"""Speech engines: one streaming interface (:mod:`myna.engines.base`), one engine per module."""

from myna.engines.base import (AudioChunk, Engine, EngineError, ErrorEvent, FallbackEvent, StreamItem, SynthesisStream,
                               WordEvent)

__all__ = ["AudioChunk", "Engine", "EngineError", "ErrorEvent", "FallbackEvent", "StreamItem", "SynthesisStream", "WordEvent", "ENGINE_NAMES"]

#: Engines a worker can load, by the name clients select. ``piper-sentence`` and ``piper-whole``
#: are other streaming strategies on the same loaded Piper voice (see myna.engines.piper); ``dsm``
#: is the DSM frame loop (myna.engines.dsm; needs ``--dsm-checkpoint``).
ENGINE_NAMES = ("piper", "piper-sentence", "piper-whole", "dsm")
