"""The controller's cost tables (`decoding.controller.costs`, `draft_costs`): what each fit
stands for after the timings that should move it, and that its fast paths compute what the plain
formula does."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.decoding.controller import KController, costs
from localspec.decoding.controller.costs import VerifyCost, fit_weight, fit_weights
from localspec.decoding.lookup import N_CLASSES, LookupRates


def _verify(sizes, rng) -> VerifyCost:
    v = VerifyCost(12)
    for b in sizes:
        for _ in range(int(rng.integers(1, 4))):
            v.observe(int(b), float(rng.uniform(0.001, 0.01) * (1 + 0.05 * b * rng.uniform(0, 1))))
    return v


def test_a_long_curve_built_with_numpy_is_the_scalar_curve(monkeypatch):
    """A batch's curve (serve --parallel: hundreds of rows) is built with numpy, a step's in
    scalar arithmetic; over random histories, dense and sparse, they agree to rounding."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        v = _verify(rng.choice(np.arange(1, 200), size=int(rng.integers(1, 8)), replace=False), rng)
        top = int(rng.integers(costs.SCALAR_TOP + 1, 300))
        fast = v._fit_curve(top)
        monkeypatch.setattr(costs, "SCALAR_TOP", 10**9)
        slow = v._fit_curve(top)
        monkeypatch.setattr(costs, "SCALAR_TOP", 32)
        assert isinstance(fast, np.ndarray) and fast.shape == slow.shape == (top,)
        np.testing.assert_allclose(fast, slow, rtol=1e-12)


def test_the_last_fit_follows_batched_timings_and_plain_ones_leave_it():
    """`last_fit` prices lookup on a step held plain. Between decisions only plain steps should
    leave it as it was; a lookup step's verify batch, or a record re-levelled, must reach it."""
    v = VerifyCost(8)
    for b, t in ((1, 0.010), (2, 0.011), (3, 0.012), (5, 0.014)):
        v.observe(b, t)
        v.observe(b, t)
    before = list(v.last_fit())
    v.observe(1, 0.0102)
    assert v.last_fit() == before                                # a plain timing: as last fitted
    for _ in range(6):
        v.observe(3, 0.030)                                      # a lookup step's batch, much dearer
    assert v.last_fit()[2] > before[2] * 1.3


def test_a_record_re_levelled_reaches_the_last_fit():
    v = VerifyCost(8)
    v.warm_start({1: 0.010, 2: 0.011, 3: 0.012, 5: 0.014})
    before = list(v.last_fit())
    assert v.observe(1, 0.020) == pytest.approx(2.0)            # today the machine runs at half speed
    assert v.last_fit()[4] == pytest.approx(2 * before[4])


def test_a_drafting_timing_sets_the_recorded_lengths_level_and_verify_re_levels_leave_it():
    c = KController(8)
    c.warm_start({1: 0.010, 3: 0.012}, 0.002, draft_by_n={1: 0.002, 3: 0.006, 6: 0.012})
    c.observe_draft(2, 2, 0.008)                                 # drafting runs 2x the record's
    assert c.draft_costs.by_n[6] == pytest.approx(0.024)
    c.observe_verify(3, 0.024)                                   # a verify size re-levelled 2x too
    assert c.draft_costs.by_n[6] == pytest.approx(0.024)         # not 0.048: drafting set its level
    # before any drafting is timed, a verify re-level is the only news of today's speed
    w = KController(8)
    w.warm_start({1: 0.010, 3: 0.012}, 0.002, draft_by_n={1: 0.002, 3: 0.006, 6: 0.012})
    w.observe_verify(1, 0.020)
    assert w.draft_costs.by_n[6] == pytest.approx(0.024)


def test_the_trust_moment_forgets_every_table_in_a_batch_too():
    """A record's untimed costs go at the trust moment whether this generation times its own
    decodes or shares a batch's (whose verify steps are counted, not timed, here)."""
    class Share:   # the part of `batch.SlotShare` observe_verify uses
        def verified(self, rows):
            pass

    for batch in (None, Share()):
        c = KController(8)
        c.warm_start({1: 0.010, 4: 0.02}, 0.002, draft_by_n={3: 0.006}, first_decode={9: 0.01})
        c.batch = batch
        for _ in range(c.verify_costs.trust):
            c.observe_verify(1, 0.010)
        assert c.draft_costs.recorded == set() and 3 not in c.draft_costs.by_n, batch
        assert c.first_decode.recorded == set(), batch
        assert 4 not in c.verify_costs.by_size, batch


def test_fit_weights_are_fit_weight():
    counts = [0, 1, 3, 16, 40]
    assert fit_weights(counts).tolist() == [fit_weight(c) for c in counts]


def test_lookups_rate_table_kept_class_by_class_is_the_table_made_afresh():
    rng = np.random.default_rng(3)
    r = LookupRates()
    kept = {o: r.table(o) for o in (0.0, 1.5)}
    for _ in range(300):
        classes = [int(c) for c in rng.integers(0, N_CLASSES, size=int(rng.integers(1, 6)))]
        r.observe(classes, int(rng.integers(0, len(classes) + 1)))
    for o, table in kept.items():
        assert table == r.rates(range(N_CLASSES), o).tolist()
        r._tables.clear()
        assert r.table(o) == table
