"""Prompt lookup on plain token lists (no model needed)."""

from __future__ import annotations

import numpy as np

from localspec.config import SamplingConfig
from localspec.drafters import PromptLookup
from localspec.prefix import common_prefix

CFG = SamplingConfig(temperature=0.0)
RNG = np.random.default_rng(0)


def propose(lookup: PromptLookup, context: list[int], k: int = 8) -> list[int]:
    lookup.limit(context, k)
    return lookup.propose(context, k, CFG, RNG).tokens


def test_proposes_what_followed_the_latest_match():
    #           0  1  2  3  4  5  6  7  8  9 10 11
    context = [1, 2, 3, 9, 9, 1, 2, 3, 7, 7, 1, 2]
    # suffix (1, 2) last occurred at 5..6 (followed by 3, 7, 7), earlier at 0..1 (followed by 3, 9).
    assert propose(PromptLookup(), context) == [3, 7]  # bounded by the match length (2)


def test_longest_ngram_wins_over_a_more_recent_shorter_one():
    context = [5, 6, 7, 8, 40, 41, 42, 43, 44, 0, 6, 7, 8, 1, 1, 7, 8, 2, 2, 5, 6, 7, 8]
    # (6, 7, 8) at 10..12 is followed by 1; the 4-gram (5, 6, 7, 8) only at 0..3, followed by 40...
    got = propose(PromptLookup(ngram_max=4), context)
    assert got[0] == 40


def test_long_identical_run_allows_a_long_proposal():
    source = list(range(100, 130))
    context = source + [7, 7] + source[:12]  # the model is copying its input
    assert propose(PromptLookup(), context, k=10) == source[12:22]


def test_no_match_proposes_nothing():
    lookup = PromptLookup()
    assert lookup.limit([1, 2, 3, 4, 5], 8) == 0
    assert propose(lookup, [1, 2, 3, 4, 5]) == []


def test_incremental_index_equals_a_fresh_one():
    rng = np.random.default_rng(3)
    text = rng.integers(0, 6, size=300).tolist()
    grown = PromptLookup()
    grown.prepare(text[:50])
    for end in range(51, 300, 7):  # the text grows by a few tokens per step, as in decoding
        got = propose(grown, text[:end])
        assert got == propose(PromptLookup(), text[:end]), end


def test_a_different_text_resets_the_index():
    lookup = PromptLookup()
    assert propose(lookup, [1, 2, 3, 4, 1, 2]) == [3, 4]
    assert propose(lookup, [9, 8, 9, 8, 5, 5]) == []  # new conversation: no stale matches from the old one


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], [1, 5, 3]) == 1
    assert common_prefix([], [1]) == 0
    a = list(range(1000))
    b = a[:617] + [-1] + a[618:]
    assert common_prefix(a, b) == 617
