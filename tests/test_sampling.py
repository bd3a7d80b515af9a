"""localspec.decoding.sampling: logits -> processed distribution, and drawing from it."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from localspec.config import ConfigError, SamplingConfig
from localspec.decoding.sampling import probabilities, sample
from tests import sampling_reference
from tests.sampling_reference import softmax


def cfg(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> SamplingConfig:
    return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


def distinct_logits(rng, rows, vocab, scale=3.0) -> np.ndarray:
    """Random logits without ties (a shuffled grid, exactly representable in float32)."""
    grid = (np.arange(vocab, dtype=np.float64) - vocab / 2) * (scale / vocab)
    return np.stack([rng.permutation(grid) for _ in range(rows)]).astype(np.float32)


def reference(logits: np.ndarray, c: SamplingConfig) -> np.ndarray:
    return sampling_reference.probabilities(logits, c)


# --------------------------------------------------------------------------------------------
# probabilities


@pytest.mark.parametrize("c", [cfg(0.0), SamplingConfig(temperature=0.0, top_k=3, top_p=0.5, min_p=0.3)])
def test_temperature_zero_is_one_hot_argmax(c):
    logits = distinct_logits(np.random.default_rng(0), 4, 50)
    out = probabilities(logits, c)
    assert out.shape == logits.shape
    np.testing.assert_array_equal(out, np.eye(50)[logits.argmax(axis=1)])
    np.testing.assert_array_equal(probabilities(logits[2], c), np.eye(50)[logits[2].argmax()])


@pytest.mark.parametrize(
    "c",
    [
        cfg(1.0),
        cfg(0.7, top_k=5),
        cfg(1.3, top_p=0.8),
        cfg(0.5, min_p=0.1),
        SamplingConfig(),  # the defaults: 0.8, 40, 0.95, 0.05
        cfg(2.0, top_k=20, top_p=0.9, min_p=0.02),
    ],
)
def test_rows_sum_to_one_and_match_reference(c):
    logits = distinct_logits(np.random.default_rng(1), 6, 100)
    out = probabilities(logits, c)
    assert out.dtype == np.float64 and out.shape == (6, 100)
    assert (out >= 0).all()
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out, reference(logits, c), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("vocab,k", [(50, 1), (50, 7), (50, 49), (5000, 40), (5000, 2000)])
def test_top_k_keeps_exactly_the_k_largest(vocab, k):
    # Without ties top-k keeps exactly k, however far below the max the k-th lies.
    logits = distinct_logits(np.random.default_rng(k), 3, vocab)
    out = probabilities(logits, cfg(1.0, top_k=k))
    for row, probs in zip(logits, out):
        kept = np.flatnonzero(probs)
        assert len(kept) == k
        assert set(kept) == set(np.argsort(-row)[:k])


def test_top_k_at_least_vocab_is_no_truncation():
    logits = distinct_logits(np.random.default_rng(3), 2, 10)
    # Untruncated rows are one float32 softmax: within float32 rounding of the float64 one.
    np.testing.assert_allclose(probabilities(logits, cfg(1.0, top_k=10)), softmax(logits), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(probabilities(logits, cfg(1.0, top_k=99)), softmax(logits), rtol=1e-6, atol=1e-9)


P5 = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
L5 = np.log(P5)[[3, 0, 4, 1, 2]]  # shuffled so position != rank; token ids 1, 3, 4, 0, 2 by rank


@pytest.mark.parametrize(
    "top_p,n_kept",
    [(1e-9, 1), (0.3, 1), (0.45, 1), (0.55, 2), (0.8, 3), (0.9, 4), (0.99, 5), (1.0, 5)],
)
def test_top_p_keeps_smallest_prefix_reaching_top_p(top_p, n_kept):
    # Cumulative masses 0.5, 0.7, 0.85, 0.95, 1.0: the nucleus is the shortest prefix whose mass
    # reaches top_p; the top token is always kept. No top_p sits on a boundary, where float
    # rounding of the masses would decide.
    out = probabilities(L5, cfg(1.0, top_p=top_p))
    by_rank = np.argsort(-L5)
    assert (out[by_rank[:n_kept]] > 0).all()
    assert (out[by_rank[n_kept:]] == 0).all()
    np.testing.assert_allclose(out[by_rank[:n_kept]], P5[:n_kept] / P5[:n_kept].sum(), rtol=1e-6)


@pytest.mark.parametrize("min_p,n_kept", [(0.0, 5), (0.09, 5), (0.15, 4), (0.25, 3), (0.35, 2), (0.5, 1), (0.99, 1)])
def test_min_p_drops_tokens_below_min_p_times_max(min_p, n_kept):
    # Thresholds min_p * 0.5 against masses 0.5, 0.2, 0.15, 0.1, 0.05.
    out = probabilities(L5, cfg(1.0, min_p=min_p))
    by_rank = np.argsort(-L5)
    assert (out[by_rank[:n_kept]] > 0).all()
    assert (out[by_rank[n_kept:]] == 0).all()


def test_top_p_applies_after_top_k_renormalisation():
    # Masses 0.5, 0.2, 0.15, ... ; top-2 renormalises to 5/7, 2/7. top_p = 0.7 is reached by the
    # top token alone after renormalisation (0.714), but not before (0.5).
    out = probabilities(L5, cfg(1.0, top_k=2, top_p=0.7))
    assert np.count_nonzero(out) == 1
    assert out[np.argmax(L5)] == 1.0


def test_temperature_is_applied_after_truncation_top_p():
    # Untempered masses 0.5, 0.3, 0.2 with top_p = 0.75 keep two tokens (0.5 < 0.75 <= 0.8).
    # Had the temperature 0.3 been applied first, the top token (0.81 of the tempered mass) would
    # have been alone in the nucleus.
    logits = np.log([0.3, 0.5, 0.2])
    out = probabilities(logits, cfg(0.3, top_p=0.75))
    a, b = 0.5 ** (1 / 0.3), 0.3 ** (1 / 0.3)
    np.testing.assert_allclose(out, [b / (a + b), a / (a + b), 0.0], rtol=1e-6)


def test_temperature_is_applied_after_truncation_min_p():
    # Untempered masses 0.5, 0.3, 0.2 with min_p = 0.5 keep 0.5 and 0.3 (threshold 0.25). Had the
    # temperature 2 been applied first (masses ~0.42, 0.32, 0.26; threshold 0.21) all three stay.
    logits = np.log([0.2, 0.3, 0.5])
    out = probabilities(logits, cfg(2.0, min_p=0.5))
    a, b = 0.5 ** 0.5, 0.3 ** 0.5
    np.testing.assert_allclose(out, [0.0, b / (a + b), a / (a + b)], rtol=1e-6)


def test_temperature_is_applied_after_truncation_top_k():
    logits = np.array([2.0, 1.0, 0.5, -1.0])
    out = probabilities(logits, cfg(0.5, top_k=2))
    e = math.exp(-2.0)  # (1 - 2) / 0.5
    np.testing.assert_allclose(out, [1 / (1 + e), e / (1 + e), 0.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize(
    "c",
    [
        cfg(0.7, top_k=40),
        cfg(0.7, top_k=40, top_p=0.9),
        cfg(1.1, top_k=40, top_p=0.95, min_p=0.05),
        cfg(0.8, top_k=1024, top_p=0.97),
    ],
)
def test_fast_top_k_path_equals_slow_path_and_reference(c):
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((4, 5000)) * 2.5).astype(np.float32)
    fast = probabilities(logits, c)
    # Slow path: top_k disabled, the same top-k done by hand with -inf.
    kth = np.sort(logits, axis=1)[:, -c.top_k][:, None]
    manual = np.where(logits >= kth, logits, -np.inf).astype(np.float32)
    slow = probabilities(manual, SamplingConfig(c.temperature, 0, c.top_p, c.min_p))
    np.testing.assert_array_equal(fast > 0, slow > 0)
    # Without top-p or min-p the by-hand row is untruncated, hence a float32 softmax.
    dense = c.top_p == 1.0 and c.min_p == 0.0
    np.testing.assert_allclose(fast, slow, rtol=1e-6 if dense else 1e-9, atol=1e-15)
    np.testing.assert_allclose(fast, reference(logits, c), rtol=1e-5, atol=1e-9)
    assert (np.count_nonzero(fast, axis=1) <= c.top_k).all()


def test_one_dimensional_input_matches_two_dimensional():
    logits = distinct_logits(np.random.default_rng(4), 3, 30)
    c = cfg(0.9, top_k=10, top_p=0.9, min_p=0.05)
    both = probabilities(logits, c)
    for r in range(3):
        one = probabilities(logits[r], c)
        assert one.shape == (30,)
        np.testing.assert_array_equal(one, both[r])


def test_float32_and_float64_inputs_agree():
    rng = np.random.default_rng(5)
    l64 = rng.standard_normal((2, 64)) * 3
    l32 = l64.astype(np.float32)
    c = SamplingConfig()
    out32 = probabilities(l32, c)
    assert out32.dtype == np.float64
    np.testing.assert_allclose(out32.sum(axis=1), 1.0, atol=1e-12)
    # Logits are processed in float32 either way, so the results are identical.
    np.testing.assert_array_equal(out32, probabilities(l64, c))
    # And a plain list works too.
    np.testing.assert_array_equal(probabilities(l32[0].tolist(), c), out32[0])


def test_minus_inf_logits_get_zero_probability():
    logits = np.array([1.0, -np.inf, 0.5, -np.inf, 0.0], dtype=np.float32)
    for c in [cfg(1.0), cfg(0.5, top_k=4), cfg(1.0, top_p=0.99), cfg(1.0, min_p=0.01)]:
        out = probabilities(logits, c)
        assert out[1] == 0 and out[3] == 0
        assert out.sum() == pytest.approx(1.0)


def test_tiny_positive_temperature_is_argmax_not_nan():
    logits = np.array([30.0, 10.0, 5.0, 1.0])
    with np.errstate(all="ignore"):
        out = probabilities(logits, cfg(1e-38))
    np.testing.assert_array_equal(out, [1.0, 0.0, 0.0, 0.0])


# --------------------------------------------------------------------------------------------
# sample


def _chi2_ok(counts, probs, alpha=1e-4):
    """Pearson chi-square against probs over the nonzero cells (Wilson-Hilferty critical value)."""
    nz = probs > 0
    e = counts.sum() * probs[nz] / probs[nz].sum()
    stat = float(((counts[nz] - e) ** 2 / e).sum())
    df = int(nz.sum()) - 1
    z = statistics.NormalDist().inv_cdf(1 - alpha)
    h = 2 / (9 * df)
    return stat <= df * (1 - h + z * math.sqrt(h)) ** 3, stat


@pytest.mark.parametrize(
    "probs",
    [
        [0.0, 0.1, 0.25, 0.0, 0.4, 0.05, 0.2, 0.0],  # zeros at both ends and inside
        [0.5, 0.25, 0.125, 0.125],
        [2.0, 0.0, 1.0, 0.5],  # not normalised
    ],
)
def test_sample_frequencies(probs):
    probs = np.array(probs)
    rng = np.random.default_rng(11)
    n = 100_000
    draws = np.fromiter((sample(probs, rng) for _ in range(n)), dtype=np.int64, count=n)
    counts = np.bincount(draws, minlength=len(probs))
    assert counts[probs == 0].sum() == 0, "drew a zero-probability token"
    ok, stat = _chi2_ok(counts, probs)
    assert ok, stat
    np.testing.assert_allclose(counts / n, probs / probs.sum(), atol=0.006)


def test_sample_returns_python_int_and_handles_one_hot():
    rng = np.random.default_rng(0)
    for j in range(5):
        x = sample(np.eye(5)[j], rng)
        assert x == j and type(x) is int


def test_sample_never_draws_trailing_zero_even_at_u_near_one():
    class MaxRng:
        def random(self):
            return 1.0 - 2.0**-53  # the largest value Generator.random returns

    assert sample(np.array([0.3, 0.7, 0.0, 0.0]), MaxRng()) == 1
    assert sample(np.array([0.1, 0.1, 0.1, 0.0]), MaxRng()) == 2

    class MinRng:
        def random(self):
            return 0.0

    assert sample(np.array([0.0, 0.0, 0.4, 0.6]), MinRng()) == 2


# --------------------------------------------------------------------------------------------
# SamplingConfig validation


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": -0.5},
        {"top_p": 1.01},
        {"top_p": float("nan")},
        {"min_p": -0.01},
        {"min_p": 1.0},
        {"min_p": float("nan")},
        # finite in float64, not in the float32 rows they are applied to (issue 33): a numpy
        # overflow made the rows NaN and the run blamed "corrupt weights"
        {"frequency_penalty": -1e300},
        {"presence_penalty": 1e308},
        {"logit_bias": ((1, 1e39),)},
        {"repeat_penalty": 1e-300},
        {"repeat_penalty": 1e300},
    ],
)
def test_sampling_config_rejects(kwargs):
    with pytest.raises(ConfigError):
        SamplingConfig(**kwargs)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"temperature": 0.0},
        {"top_k": 0},
        {"top_p": 1.0},
        {"top_p": 1e-6},
        {"min_p": 0.0},
        {"min_p": 0.999},
        {"seed": 123},
    ],
)
def test_sampling_config_accepts(kwargs):
    c = SamplingConfig(**kwargs)
    assert c.greedy == (c.temperature == 0)


@pytest.mark.parametrize("c", [cfg(1.0, top_k=40), cfg(1.0, top_k=40, top_p=0.9, min_p=0.05), cfg(0.8, top_p=0.9),
                               cfg(1.0, min_p=0.02), cfg(1.0, top_k=40, min_p=0.1), cfg(1.0, top_k=40, min_p=1e-5)])
def test_rows_of_every_level_and_spread_match_the_reference(c):
    """Rows whose max jumps up, drops a little, drops a lot, and rows of every spread (candidates
    near the max, or fewer than k of them): all as the reference says."""
    from localspec.decoding.sampling import distribution

    rng = np.random.default_rng(9)
    for shift in [0.0, 0.0, 3.0, -3.5, -4.5, 20.0, -40.0, 0.5, 100.0, -100.0]:
        for spread in (0.5, 3.0, 30.0, 300.0):
            row = (rng.standard_normal(5000) * spread + shift).astype(np.float32)
            got = distribution(row, c).dense(len(row))
            want = reference(row, c)
            np.testing.assert_array_equal(got > 0, want > 0)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("c", [cfg(1.0, top_p=0.9), cfg(0.8, top_p=0.95, min_p=0.05), cfg(1.0, top_k=40, top_p=0.9),
                               cfg(0.7, top_k=2000, top_p=0.97), cfg(1.0, min_p=0.01), cfg(1.0)],
                         ids=["top_p", "top_p-min_p", "top_k-top_p", "wide_top_k-top_p", "min_p", "untruncated"])
def test_shifting_every_logit_changes_nothing(c):
    """Only differences of logits matter. A float32 exp of the logits themselves underflows below
    about -103, and so did top-p's mass: at a shift of -110 top-p 0.9 kept 3 tokens instead of
    thousands. The row sits on a 2^-10 grid, so every shift here is exact in float32."""
    from localspec.decoding.sampling import distribution

    rng = np.random.default_rng(12)
    row = np.round(rng.standard_normal(49_152) * 2.5 * 1024) / 1024
    base = distribution(row.astype(np.float32), c).dense(len(row))
    assert np.count_nonzero(base) >= 20
    for shift in (-110.0, 110.0, -1e4):
        shifted = (row + shift).astype(np.float32)
        assert np.array_equal(shifted.astype(np.float64) - shift, row)   # the shift is exact
        got = distribution(shifted, c).dense(len(row))
        np.testing.assert_array_equal(got > 0, base > 0, err_msg=f"shift {shift}")
        np.testing.assert_allclose(got, base, rtol=1e-6, atol=1e-12, err_msg=f"shift {shift}")
        want = reference(shifted, c)
        np.testing.assert_array_equal(got > 0, want > 0, err_msg=f"shift {shift}")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9, err_msg=f"shift {shift}")


@pytest.mark.parametrize("c", [cfg(1.0, top_k=40, top_p=0.95, min_p=0.05), cfg(1.0, top_k=40), cfg(0.8, top_k=300, top_p=0.9),
                               cfg(1.0, top_p=0.95), cfg(1.0, top_p=0.999), cfg(0.7, top_p=0.5, min_p=0.01)],
                         ids=["default", "top_k", "wide_top_k-top_p", "top_p", "top_p-0.999", "top_p-min_p"])
def test_large_vocabularies_flat_peaked_tied_and_ordered_rows_match_the_reference(c):
    """At 128k ids the top-k set is found through a threshold read off a strided sample, and a
    nucleus of more than a few thousand candidates is cut by buckets of value: rows of every spread
    (a random-weight model's are nearly flat), rows on a coarse grid (ties at every cut), and
    rows sorted or periodic in the id (a strided sample that misleads: the wider search decides)
    are all cut as the reference cuts them."""
    from localspec.decoding.sampling import distribution

    rng = np.random.default_rng(21)
    n = 128_256
    rows = [rng.standard_normal(n) * s for s in (0.05, 0.4, 1.5, 6.0)]
    rows.append(np.round(rng.standard_normal(n) * 8) / 8)                     # ties everywhere
    rows.append(np.sort(rng.standard_normal(n)))                              # sorted by id
    rows.append(np.where(np.arange(n) % 31 == 0, -5.0, 0.0) + rng.standard_normal(n) * 0.01)  # periodic
    spike = rng.standard_normal(n) * 0.3
    spike[rng.choice(n, 50, replace=False)] += 9.0                            # a few far above the rest
    rows.append(spike)
    for row in rows:
        row = row.astype(np.float32)
        got = distribution(row, c).dense(n)
        want = reference(row, c)
        np.testing.assert_array_equal(got > 0, want > 0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)
