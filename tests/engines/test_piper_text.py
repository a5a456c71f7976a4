"""Text as an LLM writes it, through the real Piper engine: what is heard, measured on the audio
(sentence ends without waiting, pauses in the right places, said right, markup,
scripts; the first phrase early)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from myna.engines import AudioChunk, ErrorEvent, WordEvent
from myna.engines.piper import STRATEGIES, PiperStream

from inprocess import ManualTimer, collect

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: A pause is this long or longer (ms); shorter silences are the voice's own (stop closures).
PAUSE_MS = 120
#: Silence: 5 ms windows below -50 dBFS RMS.
_QUIET_RMS, _HOP_MS = 10 ** (-50 / 20), 5


async def run(stream, chunks, end: bool = True, timeout: float = 60.0):
    for chunk in chunks:
        stream.push_text(chunk)
    if end:
        stream.end_input()
    return await collect(stream, timeout)


async def until_word(stream, word: str, timeout: float = 60.0) -> list:
    """Items up to the word event for ``word`` (the turn still open)."""
    items = []
    async with asyncio.timeout(timeout):
        async for item in stream:
            items.append(item)
            if isinstance(item, WordEvent) and item.word == word:
                return items
    raise AssertionError(f"{word!r} never came: {items}")


def audio(items) -> np.ndarray:
    return np.concatenate([i.pcm for i in items if isinstance(i, AudioChunk)])


def words(items) -> list[tuple[str, float]]:
    return [(i.word, i.start_ms) for i in items if isinstance(i, WordEvent)]


def longest_silence(pcm: np.ndarray, rate: int, start_ms: float, end_ms: float) -> float:
    """The longest silent run (ms) between two instants of the audio."""
    hop = rate * _HOP_MS // 1000
    a, b = int(start_ms / _HOP_MS), int(end_ms / _HOP_MS)
    frames = pcm[: len(pcm) // hop * hop].reshape(-1, hop)[a:b]
    quiet = np.sqrt((frames ** 2).mean(axis=1)) < _QUIET_RMS
    best = run = 0
    for q in quiet:
        run = run + 1 if q else 0
        best = max(best, run)
    return best * _HOP_MS


def starts_of(items, *names) -> list[float]:
    found = words(items)
    out, i = [], 0
    for name in names:
        while found[i][0] != name:
            i += 1
        out.append(found[i][1])
    return out


# -- sentence ends without waiting ----------------------------------------------------------


async def test_a_sentence_is_spoken_without_waiting_for_the_next_token(engine):
    stream = engine.stream()
    for chunk in ["Let", " me", " check", " that", " for", " you."]:
        stream.push_text(chunk)
    items = await until_word(stream, "you")  # no more text, no end_turn, no timer needed
    assert [w for w, _ in words(items)] == ["Let", "me", "check", "that", "for", "you"]
    stream.cancel()


async def test_a_last_word_without_punctuation_is_spoken_after_the_quiet_time(engine):
    timer = ManualTimer()
    stream = PiperStream(engine, chunker=STRATEGIES["clause"][0](), clock=timer.clock, call_later=timer.call_later)
    stream.push_text("It is")
    stream.push_text(" done")
    timer.advance(0.1)
    assert stream._intake.pending  # "done" may still grow: nothing after it yet
    timer.advance(0.2)  # 150 ms of quiet: "done" is a word; 250 ms: the first phrase goes
    items = await until_word(stream, "done")
    assert [w for w, _ in words(items)] == ["It", "is", "done"]
    stream.cancel()


async def test_chunks_abutting_at_a_sentence_end_are_two_sentences(engine):
    items = await run(engine.stream(), ["Let me check that for you.", "Your order ships on Friday."])
    assert [w for w, _ in words(items)] == ["Let", "me", "check", "that", "for", "you", "Your", "order", "ships",
                                           "on", "Friday"]


# -- the first phrase early --------------------------------------------------------


async def test_the_first_phrase_is_synthesised_after_four_words_while_text_streams(engine):
    stream = engine.stream()
    for chunk in ["Well", " I", " think", " the", " answer", " is"]:
        stream.push_text(chunk)
    items = await until_word(stream, "think")  # the first phrase is out before the clause has ended
    assert [w for w, _ in words(items)] == ["Well", "I", "think"]  # (cut before "the", which leans on "answer")
    stream.cancel()


async def test_the_first_phrase_goes_after_the_wait_when_words_trickle(engine):
    timer = ManualTimer()
    stream = PiperStream(engine, chunker=STRATEGIES["clause"][0](), clock=timer.clock, call_later=timer.call_later)
    stream.push_text("Hmm ")
    timer.advance(0.1)
    stream.push_text("let ")  # "Hmm" is given on now (it could have taken a following "...")
    timer.advance(0.24)
    assert stream._units.empty()
    timer.advance(0.02)  # 250 ms after the first word
    assert not stream._units.empty()
    items = await until_word(stream, "let")
    assert [w for w, _ in words(items)] == ["Hmm", "let"]
    stream.cancel()


async def test_a_join_after_an_early_first_phrase_is_not_a_pause(engine):
    stream = engine.stream()
    for chunk in ["The", " meeting", " is", " at"]:
        stream.push_text(chunk)
    await asyncio.sleep(0)  # the first phrase goes alone
    stream.push_text(" ten tomorrow in room four.")
    items = await run(stream, [])
    pcm = audio(items)
    at, ten = starts_of(items, "at", "ten")
    assert longest_silence(pcm, engine.sample_rate, at, ten + 20) < PAUSE_MS


async def test_words_espeak_reads_as_fewer_are_timed_from_where_speech_starts(engine):
    """espeak-ng reads "I am" as one word, so a unit's words are spread over its audio by
    length; they start where its first spoken word starts, not in its quiet lead-in (from the
    unit's first sample, the turn's first chunk carried ~40 ms of sound: a gap in the first word)."""
    merged, plain = engine.encode_unit("I am sorry"), engine.encode_unit("We are sorry")
    assert len(merged.starts_ms) == 3 and merged.starts_ms == sorted(merged.starts_ms)
    assert merged.lead_frames(engine.sample_rate) >= 3 and merged.starts_ms[0] >= 0.5 * plain.starts_ms[0] > 0


# -- pauses measured on the audio ---------------------------------------------------


async def test_a_numbered_list_pauses_after_each_item_and_not_inside_one(engine):
    items = await run(engine.stream(), ["Sure! Here are three fruits:\n1. Apple\n2. Banana\n3. Orange"])
    pcm, rate = audio(items), engine.sample_rate
    one, apple, two, banana, three, orange = starts_of(items, "1", "Apple", "2", "Banana", "3", "Orange")
    assert longest_silence(pcm, rate, apple, two + 20) >= PAUSE_MS
    assert longest_silence(pcm, rate, banana, three + 20) >= PAUSE_MS
    for marker, item in ((one, apple), (two, banana), (three, orange)):
        assert longest_silence(pcm, rate, marker, item + 20) < PAUSE_MS


async def test_a_bullet_list_pauses_after_each_item(engine):
    items = await run(engine.stream(), ["- Apple\n", "- Banana\n", "- Cherry"])
    pcm, rate = audio(items), engine.sample_rate
    apple, banana, cherry = starts_of(items, "Apple", "Banana", "Cherry")
    assert longest_silence(pcm, rate, apple, banana + 20) >= PAUSE_MS
    assert longest_silence(pcm, rate, banana, cherry + 20) >= PAUSE_MS


@pytest.mark.parametrize(
    ("text", "around"),
    [
        ("The meeting is at 10 a.m. tomorrow in room four.", ("10", "in")),
        ("James T. Kirk is the captain.", ("James", "is")),
        ("She moved to the U.S. last year.", ("the", "year")),
        ("Mr. Smith is here.", ("Mr", "is")),
        ("Please take No. 5 from the shelf.", ("take", "from")),
        ("I will call at 5 p.m. tomorrow.", ("5", "tomorrow")),
    ],
)
async def test_no_pause_at_an_abbreviation_or_initial(engine, text, around):
    units = engine.compute_stats()["units"]
    items = await run(engine.stream(), [text])
    assert engine.compute_stats()["units"] - units == 1  # one unit: one sentence
    start, end = starts_of(items, *around)
    assert longest_silence(audio(items), engine.sample_rate, start, end + 20) < PAUSE_MS


# -- markup --------------------------------------------------------------------------


async def test_a_break_split_across_chunks_is_that_much_silence_and_never_spoken(engine):
    items = await run(engine.stream(), ["It's fine <bre", 'ak time="0.5s" />', " ok."])
    assert [w for w, _ in words(items)] == ["It's", "fine", "ok"]
    fine, ok = starts_of(items, "fine", "ok")
    gap = longest_silence(audio(items), engine.sample_rate, fine, ok + 20)
    assert 480 <= gap <= 620


async def test_other_tags_are_not_spoken(engine):
    items = await run(engine.stream(), ['<speak><emphasis level="strong">Hello</emphasis> <voice name="x">there</voice></speak>'])
    assert [w for w, _ in words(items)] == ["Hello", "there"]


# -- scripts --------------------------------------------------------------------------


async def test_unsupported_script_is_reported_and_not_spoken(engine):
    items = await run(engine.stream(), ["Привет"])
    assert [i for i in items if not isinstance(i, ErrorEvent)] == []
    (error,) = [i for i in items if isinstance(i, ErrorEvent)]
    assert error.code == "unsupported_language" and "Cyrillic" in error.message


async def test_mixed_text_speaks_the_supported_part_and_reports_the_rest_once(engine):
    items = await run(engine.stream(), ["Hello Привет мир, how are you? 你好"])
    assert [w for w, _ in words(items)] == ["Hello", "how", "are", "you"]
    errors = [i for i in items if isinstance(i, ErrorEvent)]
    assert [e.code for e in errors] == ["unsupported_language"] * 2
    assert "Cyrillic" in errors[0].message and "Han" in errors[1].message
    assert len(audio(items)) > 0.5 * engine.sample_rate


# -- said right ----------------------------------------------------------------------


async def test_captions_keep_the_written_words_and_the_voice_says_them_in_words(engine, whisper):
    items = await run(engine.stream(), ["It costs $500 in 1920."])
    assert [w for w, _ in words(items)] == ["It", "costs", "$500", "in", "1920"]
    import soxr

    heard = _transcribe(whisper, soxr.resample(audio(items), engine.sample_rate, 16_000))
    assert "dollar" in heard or "$" in heard
    assert "nineteen hundred" not in heard and "all our" not in heard


def _transcribe(model, pcm16k: np.ndarray) -> str:
    segments, _ = model.transcribe(pcm16k.astype(np.float32), beam_size=1, language="en", vad_filter=False)
    return " ".join(s.text for s in segments).lower()
