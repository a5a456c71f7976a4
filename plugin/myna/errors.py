"""The error types behind every contract ``error``: a ``code`` and a ``message``.

Each layer raises its own subclass (an engine's :class:`~myna.engines.EngineError`, a client
message's :class:`~myna.messages.BadMessage`, the worker's HTTP refusals), and whoever
reports it reads the same two fields: the ``error`` event, the HTTP body
``{"error": {"code", "message"}}``, a plug-in's framework error.
"""

from __future__ import annotations


class MynaError(Exception):
    """A failure or refusal the client is told about.

    Args:
        code: the contract error code (``"bad_json"``, ``"engine_failed"``, ``"full"`` …).
        message: one human sentence for the client (no traceback).

    ``str()`` is ``"code: message"``.
    """

    def __init__(self, code: str, message: str):
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class HTTPError(MynaError):
    """A refused HTTP request, answered as ``{"error": {"code", "message"}}`` with ``status``
    (and ``Retry-After: retry_after`` seconds when set).

    Args:
        status: HTTP status (4xx or 503).
        code, message: as :class:`MynaError`.
        retry_after: seconds after which retrying may succeed (None: no header).
    """

    def __init__(self, status: int, code: str, message: str, retry_after: int | None = None):
        super().__init__(code, message)
        self.status = status
        self.retry_after = retry_after
