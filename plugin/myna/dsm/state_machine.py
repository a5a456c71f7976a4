"""The text side of DSM TTS (dsm-inference §2.2–2.3): turning a script into word entries, and the
per-slot text state machine that decides, from each sampled text token, what the model reads at
the next step (WORD/PAD, forced padding, max padding, the lookahead second stream, end of text).

This runs on the host, once per step per slot; the only device traffic is one int per slot.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence


#: Steps of forced padding that start every turn (§2.3 ``initial_padding``). The first word is
#: taken at this step, and the frames decoded for these steps are dropped (the "click", §2.5), so a
#: turn's audio starts at this frame and a word consumed at step s starts (s − 2)/12.5 s into it.
INITIAL_PADDING = 2


@dataclass(frozen=True)
class TokenIds:
    """Special text ids (§2.1, §7.7). ``card`` is the mux base: text vocabulary + 1 (8001 for 1.6b)."""

    card: int
    word: int = 0
    main: int = 1
    other: int = 2
    pad: int = 3
    zero: int = -1


@dataclass
class Entry:
    """One word to say: its text tokens, its text, and the steps of forced padding after it.
    An entry without tokens is a pause (``<break time="Xs"/>``)."""

    tokens: list[int]
    text: str
    padding: int = 0


_EVENT_RE = re.compile(r"(?:<break\s+time=\"([0-9]+(?:.[0-9]*)?)s\"\s*/?>)|(?:\s+)")


def script_to_entries(encode: Callable[[str], list[int]], turns: Sequence[str], ids: TokenIds,
                      frame_rate: float = 12.5, multi_speaker: bool = True,
                      padding_between: int = 1) -> list[Entry]:
    """Split a script (one string per speaker turn, main speaker first) into entries (§2.2).

    Each word is tokenized on its own with ``encode``; the first word of a turn gets the speaker
    token (1 for even turns, 2 for odd) in front when the speaker changes; a word gets
    padding = max(0, padding_between + len(tokens) − 1) (every official entry point uses 1);
    a break of X seconds becomes an empty entry with padding round(X·frame_rate).
    """
    speakers = [ids.main, ids.other]
    last_speaker: int | None = None
    entries: list[Entry] = []

    for turn, line in enumerate(turns):
        first = True
        line = line.replace("\u2019", "'").replace(":", " ").replace("(", "").replace(")", "")

        def add(word: str) -> None:
            nonlocal first, last_speaker
            tokens = list(encode(word))
            if first:
                speaker = turn % 2
                if multi_speaker and last_speaker != speaker:
                    last_speaker = speaker
                    tokens.insert(0, speakers[speaker])
                first = False
            padding = max(0, padding_between + len(tokens) - 1) if padding_between > 0 else 0
            entries.append(Entry(tokens, word, padding))

        while line:
            match = _EVENT_RE.search(line)
            if match is None:
                break
            word, line = line[:match.start()], line[match.end():]
            if word:
                add(word)
            if match.group(1):
                entries.append(Entry([], "", int(round(float(match.group(1)) * frame_rate))))
        if line:
            add(line)
    return entries


@dataclass
class TextState:
    """Per-slot state of the text state machine (§2.3)."""

    entries: deque[Entry]
    remaining: int
    forced: int
    queued: deque[int] = field(default_factory=deque)
    lookahead: deque[int] = field(default_factory=deque)
    end_step: int | None = None
    consumption_steps: list[int] = field(default_factory=list)
    transcript: list[tuple[str, int]] = field(default_factory=list)

    def tokens_ahead(self, n: int) -> list[int]:
        """Tokens of the n-th next entry that has tokens (n ≥ 1), or []."""
        for entry in self.entries:
            if entry.tokens:
                n -= 1
                if n == 0:
                    return entry.tokens
        return []


@dataclass(frozen=True)
class StateMachine:
    """The DSM TTS text state machine (§2.3). ``from_checkpoint`` values: initial_padding
    :data:`INITIAL_PADDING`, max_padding 8, second_stream_ahead from the config (2 for 1.6b)."""

    ids: TokenIds
    second_stream_ahead: int = 0
    max_padding: int = 8
    initial_padding: int = INITIAL_PADDING

    def new_state(self, entries: Sequence[Entry]) -> TextState:
        return TextState(deque(entries), self.initial_padding, self.initial_padding)

    def process(self, step: int, state: TextState, token: int) -> int:
        """Map the sampled text token of ``step`` to the muxed text input of the next step."""
        ids = self.ids
        if token not in (ids.word, ids.pad):
            token = ids.pad
        if state.queued or state.forced > 0:
            token = ids.pad
        elif state.remaining <= 0:
            token = ids.word

        if token == ids.word:
            if state.entries:
                entry = state.entries.popleft()
                state.consumption_steps.append(step)
                if entry.tokens:
                    state.transcript.append((entry.text, step))
                    state.queued.extend(entry.tokens)
                    if self.second_stream_ahead:
                        state.lookahead.extend(state.tokens_ahead(self.second_stream_ahead))
                    state.remaining = self.max_padding
                else:
                    token = ids.pad
                state.forced = entry.padding
            else:
                token = ids.pad
                if self.second_stream_ahead and state.end_step is None:
                    token = ids.word
                if state.end_step is None:
                    state.end_step = step

        if token == ids.pad:
            if state.remaining > 0:
                state.remaining -= 1
            if state.forced > 0:
                state.forced -= 1
            out = state.queued.popleft() if state.queued else ids.pad
        else:
            out = ids.word

        if not self.second_stream_ahead:
            return out
        second = -1
        if out == ids.word:
            second = ids.word
            out = state.queued.popleft() if state.queued else ids.pad
        elif state.lookahead:
            second = state.lookahead.popleft()
        return (second + 1) * ids.card + out
