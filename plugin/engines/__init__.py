"""Speech engines: one streaming interface (:mod:`myna.engines.base`), one engine per module."""

from myna.engines.base import AudioChunk, Engine, EngineError, StreamItem, SynthesisStream, WordEvent

__all__ = ["AudioChunk", "Engine", "EngineError", "StreamItem", "SynthesisStream", "WordEvent", "ENGINE_NAMES"]

#: Engines a worker can load, by the name clients select.
ENGINE_NAMES = ("piper",)
