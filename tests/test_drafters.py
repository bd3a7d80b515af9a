"""Prompt lookup on plain token lists (no model needed), and what a drafter's random draws may
change (on the real target)."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.config import SamplingConfig
from localspec.decoding.drafters import LOOKUP_OPTIMISM, PromptLookup
from localspec.decoding.lookup import LookupRates, class_of
from localspec.tokens import common_prefix

MS = 1e-3

CFG = SamplingConfig(temperature=0.0)
RNG = np.random.default_rng(0)


def propose(lookup: PromptLookup, context: list[int], k: int = 8) -> list[int]:
    lookup.limit(context, k)
    return lookup.propose(context, k, CFG, RNG).tokens


def test_proposes_what_followed_the_latest_match_and_drafts_on_past_it():
    #           0  1  2  3  4  5  6  7  8  9 10 11
    context = [1, 2, 3, 9, 9, 1, 2, 3, 7, 7, 1, 2]
    # suffix (1, 2) was followed by 3 twice; then (1, 2, 3) by 9 (at 3) and by 7 (at 8): the copy
    # in progress is of the occurrence at 5..8, so 7 wins, and the draft goes on past the match.
    lookup = PromptLookup()
    assert propose(lookup, context)[:4] == [3, 7, 7, 1]
    _, classes = lookup.candidate()
    # the first token rests on a 2-token match with one continuation; the second on a 3-token
    # match whose n-gram had two continuations
    assert classes[0] == class_of(2, False) and classes[1] == class_of(3, True)


def test_the_most_frequent_continuation_wins_among_equally_long_matches():
    # (5, 6) is followed by 1 twice and by 2 once (most recently); all matches are 2 long
    context = [5, 6, 1, 0, 5, 6, 1, 0, 5, 6, 2, 9, 9, 5, 6]
    assert propose(PromptLookup(), context)[0] == 1


def test_a_longer_match_beats_a_more_frequent_continuation():
    # (5, 6) is followed by 1 three times, but the text ends like the occurrence at 10..13
    context = [5, 6, 1, 3, 5, 6, 1, 4, 5, 6, 1, 8, 8, 7, 3, 5, 6, 2, 4, 8, 8, 7, 3, 5, 6]
    assert propose(PromptLookup(), context)[0] == 2


def test_an_earlier_text_still_counts():
    lookup = PromptLookup()
    propose(lookup, [1, 2, 3, 4, 1, 2])
    # a new conversation: its own text has no match, but the earlier one says (1, 2) -> 3, 4
    assert propose(lookup, [9, 8, 1, 2])[:2] == [3, 4]
    # and no n-gram spans the boundary between the two texts
    assert lookup.store.text.count(-1) == 1


def test_lookup_rates_learn_per_class():
    rates = LookupRates()
    weak, strong = class_of(2, True), class_of(16, False)
    for _ in range(60):
        rates.observe([strong, strong, weak], 3)       # all accepted
        rates.observe([weak, strong], 0)               # the weak one rejected, the next untested
    got = rates.rates([strong, weak])
    assert got[0] > 0.95 and got[1] < 0.6
    assert rates.rates([class_of(8, False)])[0] == pytest.approx(0.65)   # untried: its prior


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


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], [1, 5, 3]) == 1
    assert common_prefix([], [1]) == 0
    a = list(range(1000))
    b = a[:617] + [-1] + a[618:]
    assert common_prefix(a, b) == 617


class DrawingLookup(PromptLookup):
    """Prompt lookup that draws random numbers as it drafts, as a draft model sampling does."""

    def propose(self, context, k, sampling, rng, grammar=None):
        rng.random(7)
        return super().propose(context, k, sampling, rng, grammar)


def test_what_a_drafter_draws_never_shifts_the_acceptance_draws(target):
    """Drafting has a random stream of its own: the same seed gives the same text whether the
    drafter drew numbers or not (both drafts are the same lookup tokens, so only the draws differ)."""
    from localspec.config import DecodeConfig
    from localspec.decoding.decoder import generate_steps

    prompt = target.tokenize("The cat sat on the mat. The dog sat on the rug. The cat sat on the mat. The dog")
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    runs = []
    for drafter in (PromptLookup(), DrawingLookup()):
        steps = list(generate_steps(target, drafter, prompt, cfg, DecodeConfig(max_tokens=24, k=3),
                                    rng=np.random.default_rng(5)))
        runs.append(([t for s in steps for t in s.tokens], sum(s.n_drafted for s in steps)))
    assert runs[0][1] > 0, "lookup drafted nothing: the test would prove nothing"
    assert runs[0] == runs[1]


def test_a_lookup_candidate_ends_where_a_token_earns_less_than_its_verify_row():
    """A token whose chance of being reached and accepted is under what one more verify row costs
    against a plain pass (`KController.row_share`) cannot be part of a plan that beats plain
    decoding, nor can any after it: the candidate ends before it, and the step skips pricing it."""
    from localspec.decoding.controller import KController

    context = [5, 6, 7, 8, 1, 2, 3, 5, 6, 7]   # "5 6 7" was followed by 8: a 3-token match
    c = KController(k_max=8)
    for _ in range(3):
        c.observe(0, 0, 0, 0.0, 3 * MS)
    for b in (2, 3, 4, 5):
        c.observe(b - 1, b - 1, 0, 0.0, (3 + 0.5 * (b - 1)) * MS)   # a row: 0.5 ms, 1/6 of a pass
    c.verify_curve(9)
    assert c.row_share() == pytest.approx(0.5 / 3, rel=1e-6)
    rate = c.lookup.table(LOOKUP_OPTIMISM)[class_of(3, False)]
    lookup = PromptLookup()
    assert lookup.limit(context, 4, c) >= 1        # the class's rate beats a cheap row
    for b in (2, 3, 4, 5):   # rows grow dear: each now costs more than the token could earn
        for _ in range(30):
            c.observe(b - 1, b - 1, 0, 0.0, (3 + 3 * (b - 1) * (rate + 0.05)) * MS)
    c.verify_curve(9)
    assert c.row_share() > rate
    assert lookup.limit(context, 4, c) == 0
