"""Text intake: speech normalisation and incremental segmentation of token chunks.

``WordSegmenter`` turns chunks that split words anywhere into whole normalised words;
``ClauseChunker`` groups those words into units an engine synthesises; ``normalise`` does the
same normalisation on a whole text; ``has_speech`` tells whether any of it can be spoken.
"""

from myna.text.normalise import has_speech, normalise, normalise_word
from myna.text.segment import ClauseChunker, WordSegmenter

__all__ = ["ClauseChunker", "WordSegmenter", "has_speech", "normalise", "normalise_word"]
