"""Top-k on a grammar-masked row (-inf outside the allowed set) at a 262k vocabulary: the strided
sample that places the threshold is all -inf there, and every id used to pass it (~14 ms a row
instead of ~0.1). The cut must stay the reference's, and cost what an unmasked row costs, counted
in candidates (no timing)."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.config import SamplingConfig
from localspec.decoding import sampling
from localspec.decoding.sampling import distribution
from tests.sampling_reference import probabilities as reference

N = 262_144


@pytest.fixture
def processed(monkeypatch):
    """The candidates each top-k cut partitions (`_top_of`'s input), in calls' order."""
    seen: list[int] = []
    real = sampling._top_of

    def top_of(ids, vals, k):
        seen.append(len(ids))
        return real(ids, vals, k)
    monkeypatch.setattr(sampling, "_top_of", top_of)
    return seen


def masked(rng, allowed: np.ndarray) -> np.ndarray:
    row = np.full(N, -np.inf, dtype=np.float32)
    row[allowed] = (rng.standard_normal(len(allowed)) * 2).astype(np.float32)
    return row


ALLOWED = {
    "three": lambda rng: rng.choice(N, 3, replace=False),                 # fewer than k
    "sixty": lambda rng: rng.choice(N, 60, replace=False),                # a few more than k
    "digits": lambda rng: np.arange(1000, 1010),                          # a run of ids
    "a_block": lambda rng: np.arange(50_000, 52_000),                     # a block between samples
    "wide": lambda rng: rng.choice(N, 40_000, replace=False),             # most samples finite
}


@pytest.mark.parametrize("c", [SamplingConfig(temperature=1.0, top_k=40, top_p=0.95, min_p=0.05),
                               SamplingConfig(temperature=0.8, top_k=40), SamplingConfig(temperature=1.0, top_k=300)],
                         ids=["default", "top_k", "wide_top_k"])
@pytest.mark.parametrize("kind", sorted(ALLOWED))
def test_a_masked_row_is_cut_as_the_reference_cuts_it_at_an_unmasked_rows_cost(c, kind, processed):
    rng = np.random.default_rng(5)
    allowed = np.sort(ALLOWED[kind](rng))
    row = masked(rng, allowed)
    got = distribution(row, c).dense(N)
    want = reference(row, c)
    np.testing.assert_array_equal(got > 0, want > 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)
    assert not got[np.setdiff1d(np.arange(N), allowed)].any()
    # What an unmasked row of this size partitions: some 2k candidates, never the vocabulary.
    on_masked = max(processed, default=0)
    processed.clear()
    distribution((rng.standard_normal(N) * 2).astype(np.float32), c)
    unmasked = max(processed)
    assert on_masked <= max(len(allowed), 2 * unmasked) and on_masked < N // 8, (on_masked, unmasked)


@pytest.mark.parametrize("n_allowed", [40, 41, 60, 500])
def test_with_k_or_more_allowed_the_candidates_are_the_ones_every_id_passing_gave(n_allowed):
    """Where k or more ids are allowed, the old pass over every id kept exactly these (in id
    order): the same candidates, so the same draws pick the same tokens as before."""
    rng = np.random.default_rng(n_allowed)
    row = masked(rng, rng.choice(N, n_allowed, replace=False))
    every = np.arange(N)
    old_ids, old_vals = sampling._top_of(every, row, 40)
    ids, vals, m = sampling._top_k_sampled(row, 40)
    np.testing.assert_array_equal(ids, old_ids)
    np.testing.assert_array_equal(vals, old_vals)
    assert m == row.max()


def test_a_row_with_no_finite_logit_is_still_refused():
    with pytest.raises(sampling.BadLogits):
        distribution(np.full(N, -np.inf, dtype=np.float32), SamplingConfig(temperature=1.0, top_k=40))
