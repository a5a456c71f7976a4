"""HTML character references in streamed text, decoded before the voice reads them.

LLM replies that pass through HTML tooling arrive escaped: ``&quot;That&#x27;s cool,&quot; Tom
&amp; Jerry``. A voice would read ``quot``, ``x27`` and ``amp`` aloud. :class:`EntityDecoder`
decodes them (the standard library's :func:`html.unescape`: every HTML5 named reference,
decimal and hexadecimal ones, the legacy names without ``;``) as chunks arrive, split anywhere:
a chunk that ends inside a reference (``"Tom &am"``) keeps that tail until the next chunk or the
end of the turn, so ``"&am" + "p;"`` is one ``&``.

Text that holds no reference goes through unchanged (``AT&T``, ``Tom & Jerry``, ``R&D``) and is
held back only while it could still be one: a trailing ``&`` followed by at most
:data:`LONGEST_REFERENCE` letters, digits or ``#``. References are decoded once
(``&amp;quot;`` becomes ``&quot;``, as a browser shows it).
"""

from __future__ import annotations

import html
import re

#: Characters after ``&`` in the longest reference (``&CounterClockwiseContourIntegral;``: 32).
LONGEST_REFERENCE = 32

# A chunk's tail that may still grow into a reference: "&", then name or number characters and no ";".
_OPEN_TAIL = re.compile(rf"&[#A-Za-z0-9]{{0,{LONGEST_REFERENCE}}}\Z")


class EntityDecoder:
    """Decodes one turn's text chunk by chunk (see the module docstring); one per turn."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, chunk: str) -> str:
        """The decoded text of ``chunk`` that can be spoken now (may be ``""`` while a reference
        is cut off at the chunk's end)."""
        text = self._held + chunk
        amp = text.rfind("&")
        if amp >= 0 and _OPEN_TAIL.match(text, amp):
            text, self._held = text[:amp], text[amp:]
        else:
            self._held = ""
        return html.unescape(text) if "&" in text else text

    def flush(self) -> str:
        """What is still held at the end of the turn, decoded (``"&amp"`` → ``"&"``; ``"&x"`` stays)."""
        text, self._held = self._held, ""
        return html.unescape(text)
