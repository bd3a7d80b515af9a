"""`auto`'s per-step choice (localspec.decoding.auto.choose) on a KController fed synthetic measurements.
Costs are in milliseconds-as-seconds; what matters is their ratios. Only the tests of what
`AutoDrafter.prepare` starts afresh use a model (the real draft, whose cache `prepare` fills)."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.decoding.controller import KController
from localspec.decoding.auto import PLAIN, Plan, choose
from localspec.decoding.lookup import class_of

LONG = class_of(16, False)     # a long copy: lookup's best class
SHORT = class_of(2, True)      # a two-token coincidence with rivals


def trained(verify, draft_per_token: float, model_alpha: float, lookup=(), steps: int = 200) -> KController:
    """A controller that has seen `steps` model steps at k = 4 with acceptance `model_alpha`,
    verify costs verify(b), and lookup trials [(class, rate)]."""
    c = KController(12)
    rng = np.random.default_rng(0)
    c.observe(0, 0, 0, 0.0, verify(1))
    for i in range(steps):
        k = 2 + i % 6
        acc = 0
        while acc < k and rng.random() < model_alpha:
            acc += 1
        c.observe(k, k, acc, draft_per_token * k, verify(k + 1))
        if i % 16 == 0:
            c.observe(0, 0, 0, 0.0, verify(1))
        for cls, rate in lookup:
            c.lookup.observe([cls], int(rng.random() < rate))
        c.first_decode.observe(2, draft_per_token)
        c.first_decode.observe(10, draft_per_token * (1.1 if verify(9) < 1.5 * verify(1) else 4.0))
    return c


gpu = lambda b: 0.010 + 0.0002 * b        # noqa: E731  verify nearly flat in b
cpu = lambda b: 0.016 + 0.004 * (b - 1)   # noqa: E731  each row costs a quarter of a pass


def test_a_long_reliable_copy_goes_to_lookup():
    c = trained(gpu, 0.001, 0.6, lookup=[(LONG, 0.97)])
    plan = choose(c, list(range(12)), [LONG] * 12, lag=0, cap=12)
    assert plan.source == "lookup" and plan.k >= 8, plan


def test_weak_lookup_matches_leave_the_step_to_the_model():
    c = trained(gpu, 0.001, 0.85, lookup=[(SHORT, 0.1)])
    plan = choose(c, [1, 2, 3], [SHORT] * 3, lag=0, cap=12)
    assert plan.source == "model" and plan.k >= 3, plan


def test_a_short_sure_match_is_extended_by_the_model():
    # two certain lookup tokens, then a good model: drafting both beats either alone
    c = trained(gpu, 0.0005, 0.9, lookup=[(LONG, 0.99)])
    plan = choose(c, [1, 2], [LONG, LONG], lag=1, cap=12)
    assert plan.source == "mixed" and plan.m == 2 and plan.k > 2, plan


def test_catching_up_on_a_cpu_makes_the_model_pay_for_its_lag():
    # the same model, once in step and once 40 tokens behind (after long lookup copies)
    c = trained(cpu, 0.002, 0.9, lookup=[(class_of(4, False), 0.6)])
    cand, classes = [1, 2, 3, 4], [class_of(4, False)] * 4
    assert choose(c, cand, classes, lag=1, cap=12).source in ("model", "mixed")
    assert choose(c, cand, classes, lag=40, cap=12).source == "lookup"


def test_nothing_pays_on_a_steep_cpu_with_a_poor_model_and_no_match():
    c = trained(cpu, 0.02, 0.2)
    plans = []
    for _ in range(10):
        plans.append(choose(c, [], [], lag=0, cap=12))
        # no candidate: the plan is the controller's own choice, a probe or plain, nothing else
        assert plans[-1] == (Plan("model", c.last_k) if c.last_k else PLAIN)
    # even full acceptance would lose to plain here, so its probes are HOPELESS_EVERY steps apart
    assert plans == [PLAIN] * 10


def test_start_up_and_plain_refresh_are_the_controllers():
    c = KController(12)
    plan = choose(c, list(range(8)), [LONG] * 8, lag=0, cap=12)
    assert plan == Plan("model", 4)      # start-up: the model's first timed drafts


@pytest.mark.parametrize("n,expect", [(6, Plan("lookup", 4, 4)), (2, Plan("mixed", 4, 2)), (0, Plan("model", 4))])
def test_a_fixed_k_fills_with_lookup_first(n, expect):
    c = KController(12, fixed_k=4)
    assert choose(c, list(range(n)), [LONG] * n, lag=0, cap=12) == expect


def test_a_candidate_the_step_did_not_use_is_scored_against_what_was_emitted():
    """Steps served by the model or plain still teach lookup's rates: the candidate lookup offered
    is compared with the tokens the step emitted. A step that verified lookup's tokens is not
    scored twice."""
    from localspec.decoding.drafters import Draft
    from localspec.decoding.auto import AutoDrafter

    c = KController(12)
    auto = AutoDrafter(model=None)
    before = c.lookup.rates([SHORT])[0]
    auto._offered = (3, [7, 8, 9], [SHORT, SHORT, SHORT])
    auto.learn(c, 2, Draft([7, 8], source="model"), 2, 0.01, 0.02)   # the model served it
    auto._score_unused([1, 2, 3, 7, 8, 4], c)                          # emitted 7 8 4: 2 hits, 1 miss
    assert c.lookup.trials == 3 and c.lookup.rates([SHORT])[0] > before
    auto._offered = (6, [5, 5], [SHORT, SHORT])
    auto.learn(c, 2, Draft([5, 5], source="lookup", n_lookup=2, classes=(SHORT, SHORT)), 0, 0.0, 0.02)
    assert c.lookup.trials == 4                     # its own trial (one miss), nothing more
    auto._score_unused([1, 2, 3, 7, 8, 4, 6], c)
    assert c.lookup.trials == 4


COPY = list(range(100, 130)) + [7, 7] + list(range(100, 120))   # the text is copying its start


def test_a_fixed_k_split_reads_only_this_generations_record(draft):
    """With a fixed k, what an earlier generation taught the controller (lookup failing, the model
    accepted) must not change this one's split: at T > 0 the text depends on who drafted."""
    from localspec.decoding.model_drafter import ModelDrafter
    from localspec.decoding.auto import AutoDrafter

    fresh, worn = KController(12, fixed_k=4), KController(12, fixed_k=4)
    for _ in range(100):
        worn.lookup.observe([class_of(16, False)] * 4, 0)
        worn.observe_draft(4, 4, 0.004)
    plans = []
    for controller in (fresh, worn):
        auto = AutoDrafter(ModelDrafter(draft))
        auto.prepare(COPY)
        auto.plan(COPY, 12, controller)
        plans.append(auto._plan)
    assert plans[0] == plans[1] == Plan("lookup", 4, 4), plans   # a long copy, judged by its prior


def test_a_new_generation_does_not_score_the_last_ones_unused_candidate(draft):
    from localspec.decoding.drafters import Draft
    from localspec.decoding.model_drafter import ModelDrafter
    from localspec.decoding.auto import AutoDrafter

    c = KController(12)
    auto = AutoDrafter(ModelDrafter(draft))
    auto.prepare(COPY[:4])
    auto._offered = (3, [120, 121, 122], [SHORT] * 3)
    auto.learn(c, 2, Draft([9, 9], source="model"), 0, 0.01, 0.02)   # the model served the last step
    trials = c.lookup.trials
    auto.prepare(COPY)          # the next generation: other tokens at that offset
    auto.plan(COPY, 4, c)
    assert c.lookup.trials == trials
