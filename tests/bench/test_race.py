"""``myna bench race``'s own arithmetic: the page address it opens and the head-to-head count."""

from __future__ import annotations

import argparse
import urllib.parse

from myna.bench.race import head_to_head, page_url


def _args(**kw) -> argparse.Namespace:
    base = {"lanes": "piper,pipecat", "rate": 30, "text": None, "preset": "long", "phrase_cache": False,
            "openai_url": None}
    return argparse.Namespace(**{**base, **kw})


def test_the_page_address_carries_the_races_settings():
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(page_url("http://127.0.0.1:1", _args())).query)
    assert query == {"lanes": ["piper,pipecat"], "rate": ["30"], "preset": ["long"]}
    url = page_url("http://h", _args(text="Hi, there.", phrase_cache=True, openai_url="http://x/v1", rate=0))
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert query["text"] == ["Hi, there."] and "preset" not in query
    assert query["cache"] == ["1"] and query["openai_url"] == ["http://x/v1"] and query["rate"] == ["0"]


def test_head_to_head_counts_only_races_where_both_were_heard():
    def run(a, b):
        return {"lanes": {"piper": {"perceived_ttfa_ms": a}, "pipecat": {"perceived_ttfa_ms": b}}}

    history = [run(100, 400), run(500, 300), run(None, 200), run(90, None), run(120, 120)]
    assert head_to_head(history, "piper", "pipecat") == (1, 3)  # a tie is not ahead
    assert head_to_head(history, "pipecat", "piper") == (1, 3)
    assert head_to_head(history, "piper", "openai") == (0, 0)
