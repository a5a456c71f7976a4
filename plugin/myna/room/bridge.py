"""One loaded engine, used from sessions on other event loops (``myna worker``'s job threads).

livekit-agents runs each job (room) on its own thread with its own event loop. An engine is
loaded once per process and belongs to the loop it was started on: its executor hands results
back on that loop. :class:`BridgedEngine` lets a session on a job loop use it: each call is
posted to the engine's loop (``call_soon_threadsafe``) and each stream item posted back, so
engine code only ever runs on its own loop and the session's only on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from myna.engines import Engine, StreamItem, SynthesisStream
from myna.engines.base import EngineWrapper, check_speed

_END = object()


class BridgedStream:
    """A :class:`~myna.engines.SynthesisStream` on the engine's loop, driven from this one.

    Same surface as a stream (``push_text``, ``end_input``, ``cancel``, ``cancelled``, async
    iteration). An error opening or running the engine's stream (e.g. ``unknown_voice``) is
    raised from the iteration, as a stream's own errors are.
    """

    def __init__(self, engine: Engine, home: asyncio.AbstractEventLoop, voice: str | None, group: object):
        self._home = home
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue = asyncio.Queue()
        self._inner: SynthesisStream | None = None
        self._cancelled = False
        home.call_soon_threadsafe(self._open, engine, voice, group)

    # -- on the engine's loop ---------------------------------------------------------------
    def _open(self, engine: Engine, voice: str | None, group: object) -> None:
        try:
            self._inner = engine.stream(voice, group=group)
        except Exception as exc:
            self._post(exc)
            self._post(_END)
            return
        self._home.create_task(self._forward())

    async def _forward(self) -> None:
        try:
            async for item in self._inner:
                self._post(item)
        except Exception as exc:
            self._post(exc)
        finally:
            self._post(_END)

    def _post(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the session's loop is closed: nobody is listening any more
            pass

    def _call(self, method: str, *args) -> None:
        """Call the engine stream's ``method`` on its loop (after ``_open``: calls run in order)."""
        def run() -> None:
            if self._inner is not None:
                try:
                    getattr(self._inner, method)(*args)
                except Exception as exc:  # (e.g. unsupported_speed: the turn ends with it)
                    self._post(exc)

        self._home.call_soon_threadsafe(run)

    # -- on the session's loop -------------------------------------------------------------
    def set_normalise(self, on: bool) -> None:
        """Normalise the turn's words or not (:meth:`myna.engines.SynthesisStream.set_normalise`)."""
        self._call("set_normalise", on)

    def set_phrase_cache(self, on: bool) -> None:
        """Answer the turn from the phrase cache or not (:meth:`myna.engines.SynthesisStream.set_phrase_cache`)."""
        self._call("set_phrase_cache", on)

    def set_lexicon(self, lexicon) -> None:
        """The turn's own lexicon (:meth:`myna.engines.SynthesisStream.set_lexicon`)."""
        self._call("set_lexicon", lexicon)

    def set_speed(self, speed: float) -> None:
        """The turn's pace (:meth:`myna.engines.SynthesisStream.set_speed`).

        Raises:
            EngineError: ``bad_speed`` here; an engine that speaks at its own pace ends the
                turn with ``unsupported_speed`` from its loop.
        """
        self._call("set_speed", check_speed(speed))

    def push_text(self, chunk: str) -> None:
        """Add a chunk of the turn's text (any split)."""
        self._call("push_text", chunk)

    def end_input(self) -> None:
        """No more text for this turn."""
        self._call("end_input")

    def cancel(self) -> None:
        """Drop the turn now (the engine's stream is cancelled on its loop)."""
        if not self._cancelled:
            self._cancelled = True
            self._call("cancel")
            self._items.put_nowait(_END)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def __aiter__(self) -> AsyncIterator[StreamItem]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[StreamItem]:
        while (item := await self._items.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            if not self._cancelled:
                yield item


class BridgedEngine(EngineWrapper):
    """``engine`` (started on loop ``home``) for sessions on any other loop; all but its streams
    is ``engine``'s.

    Args:
        engine: a started engine.
        home: the loop it was started on (it must keep running).
    """

    def __init__(self, engine: Engine, home: asyncio.AbstractEventLoop):
        super().__init__(engine)
        self.engine = engine
        self.home = home

    def stream(self, voice: str | None = None, group: object = None) -> SynthesisStream:
        if asyncio.get_running_loop() is self.home:
            return self.engine.stream(voice, group=group)
        return BridgedStream(self.engine, self.home, voice, group)  # type: ignore[return-value]
