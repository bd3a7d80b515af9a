"""A draft model's catch-up (the text it missed during plain steps) against its drafting: read in a
decode of its own while the controller cannot tell them apart in one first decode, so that a warm
start's test of its record (one draft after plain steps) times drafting as a drafting step does.
The real record behind this (tests/records/loaded-hour.json) is tested end to end in
test_stale_records.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localspec.config import SamplingConfig
from localspec.decoding.controller import KController
from localspec.decoding.controller.draft_costs import USUAL_FIRST
from localspec.decoding.drafters import Draft, split_draft_time
from localspec.decoding.model_drafter import ModelDrafter
from localspec.loading import warmstart

GREEDY = SamplingConfig(temperature=0.0)
RECORD = Path(__file__).resolve().parent / "records" / "loaded-hour.json"


def _behind(draft, missed: int):
    """A prompt the drafter has read, and the text after `missed` plain steps."""
    prompt = draft.tokenize("The lighthouse keeper climbed the stairs at dusk, as every night,")
    drafter = ModelDrafter(draft)
    drafter.prepare(prompt)
    more = draft.tokenize(" and the lamp was cold, the glass was dark, and the sea was loud", add_special=False)
    return drafter, prompt + more[:missed]


def test_a_catch_up_is_read_apart_until_the_line_is_known_and_drafts_the_same(draft):
    missed = 9
    drafter, context = _behind(draft, missed)
    controller = KController(k_max=8)
    k = drafter.plan(context, 4, controller)
    assert k == 4 and drafter.split_catchup
    apart = drafter.propose(context, k, GREEDY, np.random.default_rng(0))
    # the cache held the prompt but its last token: that token and the missed ones are read
    assert apart.catchup[0] == missed + 1 - USUAL_FIRST and apart.catchup[1] > 0
    assert apart.n_first == USUAL_FIRST

    together, _ = _behind(draft, missed)
    together.split_catchup = False
    whole = together.propose(context, k, GREEDY, np.random.default_rng(0))
    assert whole.catchup == (0, 0.0) and whole.n_first == missed + 1
    assert apart.tokens == whole.tokens   # the same text read in two decodes: the same draft

    drafter.learn(controller, k, apart, len(apart.tokens), 0.05, 0.03)
    assert controller.first_decode.lined()   # two sizes timed: the catch-up size and the usual one
    drafter.plan(context + apart.tokens, 4, controller)
    assert not drafter.split_catchup

    # a fixed k prices nothing: its drafts never depend on what the controller has timed
    fixed, _ = _behind(draft, missed)
    fixed.plan(context, 4, KController(k_max=8, fixed_k=4))
    assert not fixed.split_catchup


def test_a_catch_up_read_apart_is_all_catch_up_and_a_point_on_the_line():
    c = KController(k_max=8)
    d = Draft([5, 6, 7], n_first=USUAL_FIRST, t_first=0.012, catchup=(7, 0.05))
    drafting, catchup = split_draft_time(c, d, 0.08)
    assert catchup == pytest.approx(0.05) and drafting == pytest.approx(0.03)
    assert c.first_decode.timed_here() == {7: 0.05, USUAL_FIRST: 0.012}
    # with the line known, a later 9-token first decode is split by it
    drafting, catchup = split_draft_time(c, Draft([5], n_first=9, t_first=0.06), 0.07)
    assert catchup == pytest.approx(c.first_decode.extra(9)) and 0 < catchup < 0.06


def test_the_record_that_tests_a_warm_start_leaves_only_this_runs_draft_lengths():
    """The real record prices a draft line 2.5x steeper than its 1-token cost (a busy hour's long
    drafts); once its plain verdict is tested, drafting is priced from the test's timing alone."""
    rec = json.loads(RECORD.read_text())
    c = KController(k_max=12)
    assert warmstart.apply(c, rec, "auto", 1.0)
    ks = []
    while not ks or ks[-1] == 0:
        k = c.choose(in_sync=False)
        ks.append(k)
        if k:
            c.observe(k, k, k, k * 0.015, 0.020 + 0.005 * k)
        else:
            c.observe(0, 0, 0, 0.0, 0.020)
        assert len(ks) < 20, ks
    assert c.draft_costs.recorded == set()
    np.testing.assert_allclose(c.draft_seconds(4), [0.0, 0.015, 0.030, 0.045, 0.060], rtol=1e-9)
    assert c.choose(in_sync=True) > 0, ks   # a pair that pays drafts on at once
