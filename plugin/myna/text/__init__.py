"""Text intake: from LLM token chunks to what a voice should say.

``TextIntake`` is the front end of every turn (markup, line breaks, whole words, scripts);
``WordSegmenter`` turns chunks that split words anywhere into whole normalised words;
``ClauseChunker``, ``SentenceChunker`` and ``WholeChunker`` group words into the units an
engine synthesises; ``verbalise`` says numbers, prices, years and abbreviations in words;
``normalise`` does the word normalisation on a whole text; ``has_speech`` tells whether any
of it can be spoken.
"""

from myna.text import said
from myna.text.intake import IntakeItem, Pause, Skipped, TextIntake
from myna.text.symbols import has_speech, normalise, normalise_word
from myna.text.segment import ClauseChunker, SentenceChunker, WholeChunker, WordSegmenter

__all__ = [
    "ClauseChunker", "IntakeItem", "Pause", "SentenceChunker", "Skipped", "TextIntake", "WholeChunker",
    "WordSegmenter", "has_speech", "normalise", "normalise_word", "said",
]
