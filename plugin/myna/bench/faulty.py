"""An engine that fails on purpose: the hook of the fallback tests and ``myna bench fallback``
(never a ``myna serve`` flag).

:class:`FaultyEngine` wraps a real engine and passes its stream through until ``at_word``
words have gone out, then fails the turn in one of two ways:

- ``raise``: the stream raises :class:`~myna.engines.base.EngineError` (``engine_failed``), as
  a crashed model would;
- ``hang``: the stream sends nothing more and never ends (until cancelled), as a stalled model
  would.

At ``at_word=0`` the inner engine is not even asked: the turn fails at once, or its first
audio never comes (a late start), and no synthesis runs for it.

``fault = None`` turns it into a pass-through (an engine that has recovered).
"""

from __future__ import annotations

import asyncio

from myna.engines.base import EngineError, EngineWrapper, SynthesisStream, WordEvent

FAULTS = ("raise", "hang")


class FaultyEngine(EngineWrapper):
    """``inner`` with an injected fault (see the module docstring); all but its streams is
    ``inner``'s.

    Args:
        inner: the engine that synthesises.
        fault: ``raise``, ``hang`` or None (no fault).
        at_word: words passed through before the fault (0: before the first item of any kind).
    """

    def __init__(self, inner, fault: str | None, at_word: int = 0):
        if fault not in (*FAULTS, None):
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        super().__init__(inner)
        self.fault, self.at_word = fault, at_word

    def stream(self, voice: str | None = None, group: object = None) -> "FaultyStream":
        at_once = self.fault is not None and self.at_word == 0
        return FaultyStream(None if at_once else self.inner.stream(voice, group), self.fault, self.at_word)


class FaultyStream(SynthesisStream):
    """``inner``'s items, until the fault: at the first item after ``at_word`` words, or at the
    inner stream's end when it has no more words. Text goes to ``inner`` as it comes (None: the
    fault comes at once)."""

    def __init__(self, inner: SynthesisStream | None, fault: str | None, at_word: int):
        super().__init__()
        self._inner, self._fault, self._at_word = inner, fault, at_word
        self._task = self._loop.create_task(self._run())

    def push_text(self, chunk: str) -> None:
        super().push_text(chunk)
        if self._inner is not None:
            self._inner.push_text(chunk)

    def resume(self, items: list, intake, quiet_for: float | None) -> None:
        if self._inner is not None:
            self._inner.resume(items, intake, quiet_for)

    def _on_words(self, words: list[str]) -> None:
        pass  # the inner stream reads the text

    def _take(self, items) -> None:
        pass  # ... and reports left-out scripts

    def _on_end_input(self) -> None:
        if self._inner is not None:
            self._inner.end_input()

    def _on_cancel(self) -> None:
        if self._inner is not None:
            self._inner.cancel()
        self._task.cancel()

    async def _run(self) -> None:
        words = 0
        try:
            if self._inner is not None:
                async for item in self._inner:
                    at_fault = words >= self._at_word and (self._at_word == 0 or isinstance(item, WordEvent))
                    if self._fault is not None and at_fault:
                        break
                    words += isinstance(item, WordEvent)
                    self._emit(item)
                else:
                    if self._fault is None or words < self._at_word:
                        self._finish()
                        return
                self._inner.cancel()  # (the fault may come at the inner stream's end: after its last word)
            if self._fault == "raise":
                self._fail(EngineError("engine_failed", f"injected fault after {words} words"))
                return
            await asyncio.Event().wait()  # hang: nothing more, until cancelled
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            self._fail(exc)
