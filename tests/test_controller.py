"""KController against synthetic acceptance and cost streams (no model, no llama_cpp).

Each simulated step: the controller picks k, the accepted prefix is drawn from per-position
acceptance rates, and the timings are a cost curve times (1 +/- 5%) noise. Seeds are fixed.

Long because each controller decision (start-up, fallback, refresh, fits, warm start, floors)
needs its own simulated stream, and they share the helpers at the top.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from localspec.decoding.controller import EXPLORE_FIRST, REFRESH_PLAIN, WARM_TRUST, KController, expected_tokens
from localspec.decoding.drafters import best_lookup
from localspec.decoding.lookup import class_of

MS = 1e-3
# Measured on a 2-core CPU: F32 SmolLM2-135M decode of b tokens; the Q4_1 draft per token.
CPU_B = [1, 2, 4, 8, 16]
CPU_MS = [16.6, 27.1, 32.2, 42.7, 60.6]
CPU_DRAFT = 7.7 * MS


def cpu_verify(b: int) -> float:
    return float(np.interp(b, CPU_B, CPU_MS)) * MS


def linear_verify(slope: float):
    """10 ms for one token, growing by `slope` per extra token (GPU-like when slope ~ 0)."""
    return lambda b: 10 * MS * (1 + slope * (b - 1))


def constant(alpha):
    return lambda step, pos: alpha


def simulate(ctrl, rng, steps, rate, verify, draft, limit=None, noise=0.05, start=0):
    """Run `steps` decode steps; rate(step, position) is the acceptance at that 1-based position
    given the earlier ones were accepted. Returns the k chosen at each step."""
    ks = []
    for step in range(start, start + steps):
        lim = limit(step) if callable(limit) else limit
        k = ctrl.choose(lim)
        assert 0 <= k <= ctrl.k_max and (lim is None or k <= lim)
        n_acc = 0
        while n_acc < k and rng.random() < rate(step, n_acc + 1):
            n_acc += 1
        t_draft = (draft(k) if callable(draft) else k * draft) * (1 + noise * rng.uniform(-1, 1))
        t_verify = verify(k + 1) * (1 + noise * rng.uniform(-1, 1))
        ctrl.observe(k, k, n_acc, t_draft, t_verify)
        ks.append(k)
    return ks


def true_throughput(rates, draft, verify, k_max):
    """Brute force: expected tokens per second for every k in 0..k_max."""
    tokens = [1 + sum(np.prod(rates[:i]) for i in range(1, k + 1)) for k in range(k_max + 1)]
    cost = draft if callable(draft) else (lambda k: k * draft)
    seconds = [(cost(k) if k else 0.0) + verify(k + 1) for k in range(k_max + 1)]
    return np.array(tokens), np.array(seconds)


def realised_vs_plain(ks, rates, draft, verify):
    """Expected tokens per second of the chosen ks, relative to always decoding plain."""
    tokens, seconds = true_throughput(rates, draft, verify, max(ks))
    return tokens[ks].sum() / seconds[ks].sum() * seconds[0]


# ---- expected_tokens -------------------------------------------------------------------------

def test_expected_tokens_values():
    assert expected_tokens(0.0, 5) == pytest.approx(1.0)
    assert expected_tokens(1.0, 4) == pytest.approx(5.0)
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(0.9, 0) == pytest.approx(1.0)
    assert expected_tokens(1 - 1e-9, 7) == pytest.approx(8.0, rel=1e-6)   # continuous at 1


# ---- convergence -----------------------------------------------------------------------------

CASES = {
    "cpu f32 target, q4 draft, alpha 0.95": (lambda i: 0.95, CPU_DRAFT, cpu_verify),
    "cpu target, fast draft, alpha 0.8": (lambda i: 0.8, 1.5 * MS, cpu_verify),
    "steep curve, alpha 0.9": (lambda i: 0.9, 1 * MS, linear_verify(0.3)),
    "acceptance falls with position": (lambda i: 0.97 - 0.06 * (i - 1), 2 * MS, cpu_verify),
    "steep curve, alpha 0.6: best k is 1": (lambda i: 0.6, 1 * MS, linear_verify(0.3)),
    "steep curve, alpha 0.7, cheap draft": (lambda i: 0.7, 0.5 * MS, linear_verify(0.3)),
    "nearly flat curve, alpha 0.9": (lambda i: 0.9, 1 * MS, linear_verify(0.05)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_converges_to_best_k(name):
    rate_at, draft, verify = CASES[name]
    k_max = 12
    rates = [rate_at(i) for i in range(1, k_max + 1)]
    tokens, seconds = true_throughput(rates, draft, verify, k_max)
    thr = tokens / seconds
    good = set(np.flatnonzero(thr >= 0.97 * thr.max()).tolist())
    ctrl = KController(k_max=k_max)
    ks = simulate(ctrl, np.random.default_rng(1), 600, lambda s, p: rate_at(p), verify, draft)
    steady = ks[300:]
    counts = np.bincount(steady, minlength=k_max + 1)
    assert int(np.argmax(counts)) in good, (name, good, counts)
    assert np.mean([k in good for k in steady]) >= 0.7, (name, good, counts)
    # exploration and noise cost little: the realised throughput is close to the best
    best = thr.max() * seconds[0]
    assert realised_vs_plain(steady, rates, draft, verify) >= 0.96 * best, (name, counts)


def test_flat_cost_curve_high_alpha_gives_large_k():
    flat = linear_verify(0.002)
    ctrl = KController(k_max=12)
    ks = simulate(ctrl, np.random.default_rng(2), 400, constant(0.95), flat, 0.3 * MS)
    assert np.median(ks[200:]) >= 9
    assert ctrl.verify_cost(13) == pytest.approx(flat(13), rel=0.1)


def test_learns_cost_curve_growing_with_b():
    ctrl = KController(k_max=12)
    simulate(ctrl, np.random.default_rng(3), 400, constant(0.9), cpu_verify, 1 * MS)
    assert ctrl.draft_cost == pytest.approx(1 * MS, rel=0.1)
    assert ctrl.verify_cost(1) == pytest.approx(cpu_verify(1), rel=0.1)
    b = ctrl.last_k + 1
    assert ctrl.verify_cost(b) == pytest.approx(cpu_verify(b), rel=0.1)
    assert ctrl.verify_cost(b) > 1.3 * ctrl.verify_cost(1)
    assert ctrl.alpha == pytest.approx(0.9, abs=0.1)


def test_tracks_costs_that_drift_while_speculating():
    """The context grows, so every decode gets slower; t_verify(1) must not go stale."""
    ctrl = KController(k_max=12)
    drift = lambda step: 1 + step / 1000               # noqa: E731  1.0 -> 1.8 over the run
    rng = np.random.default_rng(11)
    for step in range(800):
        simulate(ctrl, rng, 1, constant(0.9), lambda b: drift(step) * cpu_verify(b), 2 * MS,
                 start=step)
    assert ctrl.verify_cost(1) == pytest.approx(1.8 * cpu_verify(1), rel=0.12)
    assert ctrl.snapshot()["steps"] == 800


def test_one_timing_spike_does_not_derail():
    ctrl = KController(k_max=12)
    rng = np.random.default_rng(12)
    simulate(ctrl, rng, 200, constant(0.9), cpu_verify, 2 * MS)
    k = ctrl.choose()
    ctrl.observe(k, k, k, k * 2 * MS, 20 * cpu_verify(k + 1))     # a GC pause or a swap-in
    assert ctrl.verify_cost(k + 1) < 1.3 * cpu_verify(k + 1)
    ks = simulate(ctrl, rng, 50, constant(0.9), cpu_verify, 2 * MS, start=201)
    assert np.median(ks) >= 3


# ---- going to plain decoding and coming back -------------------------------------------------

@pytest.mark.parametrize("alpha, draft, verify", [
    (0.2, CPU_DRAFT, cpu_verify),              # low acceptance
    (0.8, 10 * MS, linear_verify(0.1)),        # drafting a token costs as much as a verify
])
def test_goes_plain_when_unprofitable(alpha, draft, verify):
    ctrl = KController(k_max=12)
    ks = np.array(simulate(ctrl, np.random.default_rng(4), 500, constant(alpha), verify, draft))
    assert np.mean(ks > 0) < 0.10                   # probes (and the first step) are rare
    assert np.mean(ks[50:] == 0) >= 0.9
    assert realised_vs_plain(ks, [alpha] * 12, draft, verify) >= 0.95
    assert ctrl.expected_speedup(2) < 1.0


def test_near_break_even_costs_little():
    """alpha 0.5 with a fast draft on the CPU curve: speculation loses ~14%, barely."""
    ctrl = KController(k_max=12)
    ks = np.array(simulate(ctrl, np.random.default_rng(4), 600, constant(0.5), cpu_verify, 2 * MS))
    assert np.mean(ks[100:] == 0) >= 0.85
    assert realised_vs_plain(ks, [0.5] * 12, 2 * MS, cpu_verify) >= 0.95


def first_sustained(ks, k_min=2, run=5):
    """First step of `run` steps in a row with k >= k_min (len(ks) if none)."""
    starts = (i for i in range(len(ks) - run) if all(k >= k_min for k in ks[i:i + run]))
    return next(starts, len(ks))


def test_comes_back_when_acceptance_rises():
    ctrl = KController(k_max=12)
    rng = np.random.default_rng(5)
    ks_low = simulate(ctrl, rng, 1000, constant(0.1), cpu_verify, 2 * MS)
    assert np.mean(np.array(ks_low[100:]) == 0) > 0.9
    ks = simulate(ctrl, rng, 300, constant(0.95), cpu_verify, 2 * MS, start=1000)
    first = first_sustained(ks)
    assert first <= 120, ks[:150]
    assert np.mean(np.array(ks[first:]) >= 2) > 0.9


def test_comes_back_on_cpu_pair():
    """F32 target + Q4_1 draft: speculation only pays at high alpha, and only a little."""
    ctrl = KController(k_max=12)
    rng = np.random.default_rng(6)
    simulate(ctrl, rng, 600, constant(0.3), cpu_verify, CPU_DRAFT)
    ks = simulate(ctrl, rng, 400, constant(0.97), cpu_verify, CPU_DRAFT, start=600)
    assert first_sustained(ks) <= 250, ks[:250]


def test_drops_quickly_when_acceptance_falls():
    ctrl = KController(k_max=12)
    rng = np.random.default_rng(7)
    ks = simulate(ctrl, rng, 200, constant(0.95), cpu_verify, 2 * MS)
    assert np.median(ks[-20:]) >= 4
    ks = np.array(simulate(ctrl, rng, 100, constant(0.05), cpu_verify, 2 * MS, start=200))
    assert np.flatnonzero(ks == 0)[0] <= 10, ks[:20]      # a few wasted long drafts at most
    assert np.mean(ks[10:] == 0) >= 0.85                    # then plain, with a few probes


def test_measures_plain_cost_now_and_then_while_speculating():
    ctrl = KController(k_max=12)
    ks = simulate(ctrl, np.random.default_rng(8), 400, constant(0.95), cpu_verify, 2 * MS)
    plain = np.flatnonzero(np.array(ks) == 0)
    assert np.diff(plain).max() <= REFRESH_PLAIN + 1
    assert np.mean(np.array(ks[100:]) == 0) < 0.05


# ---- limit, plain steps, fixed k -------------------------------------------------------------

def test_limit_is_respected_and_zero_limit_is_plain():
    ctrl = KController(k_max=12, draft_cost_free=True)
    rng = np.random.default_rng(9)
    limits = rng.integers(0, 6, size=400)
    ks = simulate(ctrl, rng, 400, constant(0.9), cpu_verify, 0.01 * MS,
                  limit=lambda s: int(limits[s]))
    assert all(k <= lim for k, lim in zip(ks, limits))
    assert all(k == 0 for k, lim in zip(ks, limits) if lim == 0)
    # drafting is nearly free and alpha high: it drafts whatever the lookup offers
    assert np.mean([k == lim for k, lim in zip(ks[50:], limits[50:])]) > 0.9


def test_plain_step_tells_nothing_about_alpha():
    ctrl = KController(k_max=8, draft_cost_free=True)
    assert ctrl.choose(limit=0) == 0
    ctrl.observe(0, 0, 0, 0.0, 0.02)
    ctrl.observe(4, 0, 0, 1e-5, 0.021)      # asked 4, the lookup found nothing: still plain
    assert ctrl.alpha is None
    assert ctrl.acceptance_by_position() == [None] * 8
    assert ctrl.verify_cost(1) == pytest.approx(0.02 * 0.75 + 0.021 * 0.25)   # EWMA
    assert ctrl.draft_cost is None


def test_fixed_k_mode_records_statistics():
    ctrl = KController(k_max=12, fixed_k=5)
    ks = simulate(ctrl, np.random.default_rng(10), 200, constant(0.1), cpu_verify, CPU_DRAFT)
    assert ks == [5] * 200                   # even though plain would be faster
    assert ctrl.choose(limit=3) == 3
    assert ctrl.choose(limit=0) == 0
    assert ctrl.alpha == pytest.approx(0.1, abs=0.1)
    assert ctrl.verify_cost(6) == pytest.approx(cpu_verify(6), rel=0.1)
    assert ctrl.expected_speedup(5) < 1.0
    assert KController(k_max=4, fixed_k=8).choose() == 8


def test_start_up_explores_draft_and_plain():
    ctrl = KController()
    assert ctrl.alpha is None and ctrl.verify_cost(3) is None and ctrl.expected_speedup(2) is None
    k = ctrl.choose()
    assert 2 <= k <= 6
    ctrl.observe(k, k, k, k * 0.002, 0.045)  # cold: the first decode of a batch size is slow
    assert ctrl.choose() == k                # so the first size is timed twice
    ctrl.observe(k, k, k, k * 0.002, 0.030)
    assert ctrl.verify_cost(k + 1) == pytest.approx(0.030)   # a faster second timing wins
    assert ctrl.choose() == 0                # the plain cost is measured before optimising
    ctrl.observe(0, 0, 0, 0.0, 0.016)
    assert ctrl.choose() > 0


def test_drafter_may_propose_fewer_than_asked():
    ctrl = KController(k_max=8)
    ctrl.observe(6, 3, 1, 0.006, 0.02)       # the drafter stopped early; the batch was 4
    assert ctrl.verify_cost(4) == pytest.approx(0.02)
    assert ctrl.draft_cost == pytest.approx(0.002)
    by_pos = ctrl.acceptance_by_position()
    assert by_pos[0] == 1.0 and by_pos[1] == 0.0 and by_pos[2] is None
    with pytest.raises(ValueError):
        ctrl.observe(2, 3, 1, 0.0, 0.01)     # drafted more than asked
    with pytest.raises(ValueError):
        ctrl.observe(3, 2, 3, 0.0, 0.01)     # accepted more than drafted


# ---- cost curve and reporting ----------------------------------------------------------------

def test_verify_cost_interpolates_and_extrapolates():
    ctrl = KController(k_max=12)
    ctrl.observe(4, 4, 4, 0.004, 0.030)      # b = 5
    assert ctrl.verify_cost(1) == pytest.approx(0.030 / 1.4)   # prior shape 1 + 0.1 (b - 1)
    ctrl.observe(0, 0, 0, 0.0, 0.010)        # b = 1
    assert ctrl.verify_cost(3) == pytest.approx(0.020)         # linear between neighbours
    assert ctrl.verify_cost(9) == pytest.approx(0.050)         # linear fit beyond
    ctrl.observe(8, 8, 0, 0.008, 0.036)      # b = 9: the curve bends, the fit follows
    assert 0.030 < ctrl.verify_cost(7) < 0.036
    assert 0.036 < ctrl.verify_cost(13) < 0.036 + 4 * 0.005
    assert ctrl.verify_cost(40) > ctrl.verify_cost(13)         # beyond k_max + 1 too


def test_snapshot_is_json():
    assert json.loads(json.dumps(KController().snapshot()))["alpha"] is None
    ctrl = KController(k_max=6)
    simulate(ctrl, np.random.default_rng(13), 50, constant(0.8), cpu_verify, 2 * MS)
    snap = json.loads(json.dumps(ctrl.snapshot()))
    assert snap["alpha"] == pytest.approx(ctrl.alpha)
    assert len(snap["acceptance_by_position"]) == 6
    assert len(snap["verify_cost_curve"]) == 7
    assert snap["last_k"] == ctrl.last_k
    assert snap["expected_speedup"][0] == pytest.approx(1.0)
    assert snap["expected_speedup"][3] == pytest.approx(ctrl.expected_speedup(3))


def test_costly_resume_spaces_probes_out():
    """A draft model that must re-read what it missed pays that on every probe: the controller
    counts it and probes rarely, so plain decoding keeps ≥ 97% of its speed."""
    def probes(resume: float) -> int:
        c = KController(8)
        rng = np.random.default_rng(0)
        n = 0
        for step in range(3000):
            k = c.choose()
            n += k > 0
            drafted = k
            accepted = int(np.sum(np.cumprod(rng.random(k) < 0.3)))
            # Cheap drafts but rare acceptance: speculation loses now, would win on easier text.
            c.observe(k, drafted, accepted, 0.002 * k, 0.009 + 0.004 * k, resume if k else 0.0)
        return n

    cheap, costly = probes(0.0), probes(0.1)
    assert costly * 5 < cheap
    start = 2  # the two measuring steps at start-up resume nothing
    assert (costly - start) * (0.1 + 0.02) < 0.03 * 3000 * 0.009  # probes + resumes: < 3% of the time


def test_hopeless_costs_stop_probing_almost_entirely():
    """Drafting a token costs as much as a plain step (F16 target + Q4_1 draft on a CPU): even with
    every draft accepted speculation would lose, so the controller hardly ever probes: after 16
    plain steps, then 32, 64... up to every 1024 (a busy moment's verdict is re-tested soon)."""
    c = KController(8)
    n, seconds, lost = 0, 0.0, 0.0
    for step in range(3000):
        k = c.choose()
        n += k > 0
        t = 0.009 * k + 0.009 + 0.003 * k   # all accepted, and still no gain
        c.observe(k, k, k, 0.009 * k, 0.009 + 0.003 * k)
        seconds += t
        lost += (t - (k + 1) * 0.009) if step >= 2 else 0.0
    assert n <= 2 + 7  # the two measuring steps, then probes 16, 32, ..., 1024, 1024 steps apart
    assert lost < 0.002 * seconds   # they cost < 0.2 % of the time
    assert c.choose() == 0


# ---- warm start ------------------------------------------------------------------------------

def _learned_on(rate_at, draft, verify, steps=400, seed=21) -> dict:
    ctrl = KController(k_max=12)
    simulate(ctrl, np.random.default_rng(seed), steps, lambda s, p: rate_at(p), verify, draft)
    return json.loads(json.dumps(ctrl.learned()))  # what a record holds survives JSON


def _warm(learned: dict, **kw) -> KController:
    ctrl = KController(k_max=12, **kw)
    ctrl.warm_start({int(b): t for b, t in learned["verify"].items()}, learned["draft_cost"],
                    learned["resume_cost"], learned["alpha"], learned["by_position"])
    return ctrl


def test_warm_start_drafts_the_best_k_from_the_first_step():
    rate_at, draft, verify = CASES["cpu f32 target, q4 draft, alpha 0.95"]
    rates = [rate_at(i) for i in range(1, 13)]
    tokens, seconds = true_throughput(rates, draft, verify, 12)
    good = set(np.flatnonzero(tokens / seconds >= 0.97 * (tokens / seconds).max()).tolist())
    warm = _warm(_learned_on(rate_at, draft, verify))
    # One plain step first: the plain cost is the yardstick, and the machine's speed drifts
    # between runs. Then no start-up measuring at START_K: the best k at once.
    assert warm.choose() == 0
    warm.observe(0, 0, 0, 0.0, verify(1))
    assert warm.choose() in good
    # Over short runs (a CLI generate of ~30 steps) a warm controller is near the best from the
    # start on every seed; a cold one spends steps measuring and sometimes stalls in plain.
    def short(ctrl, seed):
        ks = simulate(ctrl, np.random.default_rng(seed), 30, lambda s, p: rate_at(p), verify, draft)
        return realised_vs_plain(ks, rates, draft, verify)
    best = (tokens / seconds).max() * seconds[0]
    warm = [short(_warm(_learned_on(rate_at, draft, verify, seed=s)), s) for s in range(10)]
    cold = [short(KController(k_max=12), s) for s in range(10)]
    assert np.mean(warm) >= 0.98 * best and min(warm) >= 0.93 * best, (warm, best)
    assert np.mean(warm) > np.mean(cold), (warm, cold)


def test_warm_start_on_an_unprofitable_pair_drafts_only_to_test_the_record():
    """A true record of a losing pair: no drafting at start; one probe after EXPLORE_FIRST plain
    steps tests it (a record can be stale), then the measured verdict probes hopeless-rarely. What
    the probes lose stays far inside EXPLORE_BUDGET."""
    def verify(b):
        return (9 + 3 * (b - 1)) * MS
    learned = _learned_on(lambda i: 1.0, 9 * MS, verify, steps=300)
    warm = _warm(learned)
    ks = simulate(warm, np.random.default_rng(2), 300, lambda s, p: 1.0, verify, 9 * MS)
    assert ks[:EXPLORE_FIRST - 1] == [0] * (EXPLORE_FIRST - 1)
    assert sum(k > 0 for k in ks) <= 5, ks     # after EXPLORE_FIRST, then 16, 32, 64, 128 steps apart
    lost = sum(9 * MS * k + verify(k + 1) - (k + 1) * verify(1) for k in ks)
    assert lost < 0.02 * sum(9 * MS * k + verify(k + 1) for k in ks)


def test_a_wrong_prior_is_overridden_by_fresh_measurements():
    """A record from a machine where verifying was flat (GPU-like) on a CPU-like curve: the
    controller follows what it measures within a few dozen steps."""
    rate_at, draft, verify = (lambda i: 0.9), 1 * MS, linear_verify(0.3)
    rates = [0.9] * 12
    tokens, seconds = true_throughput(rates, draft, verify, 12)
    thr = tokens / seconds
    good = set(np.flatnonzero(thr >= 0.97 * thr.max()).tolist())
    wrong = _learned_on(lambda i: 0.99, 0.1 * MS, linear_verify(0.0))
    warm = _warm(wrong)
    assert warm.choose() == 0
    warm.observe(0, 0, 0, 0.0, verify(1))
    assert warm.choose() >= 10    # the prior says: draft long
    ks = simulate(warm, np.random.default_rng(4), 200, lambda s, p: rate_at(p), verify, draft)
    assert np.mean([k in good for k in ks[100:]]) >= 0.7, np.bincount(ks[100:])


def test_learned_state_is_json_and_a_fixed_k_ignores_nothing_it_needs():
    learned = _learned_on(lambda i: 0.8, 2 * MS, cpu_verify, steps=100)
    assert set(learned) == {"verify", "draft_cost", "draft_by_n", "resume_cost", "alpha", "by_position", "trials",
                            "first_decode"}
    assert 0 < learned["alpha"] < 1 and learned["draft_cost"] > 0 and "1" in learned["verify"]
    fixed = _warm(learned, fixed_k=3)
    assert fixed.choose() == 3


def test_near_break_even_does_not_flap_into_losing_speculation():
    """Drafting a token costs 80% of a plain step: at alpha 0.97 speculation is ~5% behind at
    best. The controller stays plain but for probes, and those cost under 3%."""
    def verify(b):
        return (10.0 if b == 1 else 17.5 + 0.75 * (b - 1)) * MS
    ctrl = KController(k_max=12)
    ks = simulate(ctrl, np.random.default_rng(0), 600, lambda s, p: 0.97, verify, 8.1 * MS)
    rates = [0.97] * 12
    assert realised_vs_plain(ks, rates, 8.1 * MS, verify) >= 0.97
    assert np.mean(np.array(ks[100:]) > 0) < 0.1


def test_a_warm_start_from_a_slower_moment_is_rescaled_by_the_first_timing():
    """The machine ran 30% slower when the record was written: the first plain timing here sets
    the level of every recorded size, so the recorded shape is kept at today's speed."""
    learned = _learned_on(lambda i: 0.9, 2 * MS, cpu_verify, steps=200)
    warm = _warm(learned)
    recorded = {int(b): t for b, t in learned["verify"].items()}
    before = [warm.verify_cost(b) for b in range(1, 14)]
    assert warm.choose() == 0
    warm.observe(0, 0, 0, 0.0, recorded[1] / 1.3)
    after = [warm.verify_cost(b) for b in range(1, 14)]
    np.testing.assert_allclose(after, np.array(before) / 1.3, rtol=1e-9)
    warm.observe(4, 4, 4, 4 * 0.5 * MS, cpu_verify(5))   # the draft is faster today too
    assert warm.draft_cost == pytest.approx(0.5 * MS)        # replaced, not averaged in


def test_a_fixed_part_of_each_drafting_step_is_not_charged_per_token():
    """On a CPU a fully accepted draft re-reads two tokens in one decode that costs two, so a
    drafting step costs (k + 1) draft decodes. Priced per token from short drafts, long drafts
    look dearer than they are; the controller fits base + slope·k and finds the long best k."""
    def draft(k):
        return (k + 1) * 6.5 * MS
    rates = [0.97] * 12
    verify = linear_verify(0.03)
    tokens, seconds = true_throughput(rates, draft, verify, 12)
    thr = tokens / seconds
    good = set(np.flatnonzero(thr >= 0.97 * thr.max()).tolist())
    ctrl = KController(k_max=12)
    ks = simulate(ctrl, np.random.default_rng(8), 500, lambda s, p: 0.97, verify, draft)
    assert np.mean([k in good for k in ks[250:]]) >= 0.7, (good, np.bincount(ks[250:]))


# ---- costs that a fitted line would push to zero or below ------------------------------------

def _finite_positive(values) -> bool:
    arr = np.asarray(values, dtype=float)
    return bool(np.all(np.isfinite(arr)) and np.all(arr > 0))


def _all_numbers(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _all_numbers(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _all_numbers(v)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj


@pytest.mark.parametrize("case", ["steep verify, b = 1 never timed", "costs falling with k"])
def test_cost_lines_that_reach_zero_are_floored(case):
    """A line fitted to verify costs that rise steeply (2 → 5 tokens: 1 → 30 ms) crosses zero
    before b = 1, and costs that fall with k (noise, a warming machine) give negative slopes.
    Neither may put a cost <= 0, inf or NaN into a prediction, the snapshot, the warm-start
    record, or a choice of k."""
    ctrl = KController(k_max=8)
    rng = np.random.default_rng(3)
    for _ in range(6):
        for n in (1, 2, 3, 4):   # a drafter that offers 1-4 tokens; b = 1 is never verified
            if case.startswith("steep"):
                t_draft, t_verify = n * MS, (1 if n == 1 else 10 * (n - 1)) * MS
            else:
                t_draft, t_verify = (8 - 1.9 * n) * MS, (40 - 9.9 * n) * MS
            ctrl.observe(n, n, int(rng.integers(0, n + 1)), t_draft, t_verify)
    assert 1 not in ctrl._verify
    costs = [ctrl.verify_cost(b) for b in range(1, 41)]
    assert _finite_positive(costs), costs
    assert _finite_positive(ctrl._draft_seconds(8)[1:])
    speedups = [ctrl.expected_speedup(k) for k in range(9)]
    assert _finite_positive(speedups), speedups
    for record in (ctrl.snapshot(), ctrl.learned()):
        json.dumps(record, allow_nan=False)   # raises on inf or NaN
        assert all(np.isfinite(x) for x in _all_numbers(record)), record
    assert _finite_positive(ctrl.snapshot()["verify_cost_curve"])
    assert _finite_positive(ctrl.snapshot()["expected_speedup"])
    for _ in range(40):
        k = ctrl.choose(limit=6)
        assert 0 <= k <= 6
        ctrl.observe(k, k, k, k * MS, (1 if k == 0 else 10 * k) * MS)
        assert _finite_positive([ctrl.verify_cost(b) for b in range(1, 10)])
    # What it saved starts another controller on finite, positive numbers too.
    learned = json.loads(json.dumps(ctrl.learned(), allow_nan=False))
    warm = KController(k_max=8)
    warm.warm_start({int(b): t for b, t in learned["verify"].items()}, learned["draft_cost"],
                    learned["resume_cost"], learned["alpha"], learned["by_position"],
                    {int(n): t for n, t in learned["draft_by_n"].items()})
    assert _finite_positive([warm.verify_cost(b) for b in range(1, 10)])
    json.dumps(warm.snapshot(), allow_nan=False)
    assert 0 <= warm.choose() <= 8


def test_a_damaged_warm_start_record_is_ignored_where_not_finite():
    ctrl = KController(k_max=4)
    ctrl.warm_start({1: float("inf"), 2: float("nan"), 3: -1.0, 4: 0.02, 5: "0.03"}, float("inf"),
                    float("nan"), float("nan"), [float("inf"), 0.5], {1: float("inf")})
    assert ctrl._verify == {4: 0.02} and ctrl.draft_cost is None and ctrl.alpha is None
    json.dumps(ctrl.snapshot(), allow_nan=False)
    assert _finite_positive([ctrl.verify_cost(b) for b in range(1, 6)])
    assert ctrl.choose() == 4   # nothing usable about drafting: it measures from the start


def test_a_record_from_a_busy_moment_is_forgotten_unless_confirmed():
    """A record written while the machine was busy prices batches 3-6× too high. Believed for
    ever it would keep both drafters plain, so no size would be re-timed: prompt lookup never
    probes, and the model's probes become hopeless-rare. Recorded sizes that no step confirms
    within WARM_TRUST steps are forgotten; before that, the probe that tests a record's verdict
    after EXPLORE_FIRST plain steps re-times a size, which sets the record's level to today's, and
    drafting comes back at once."""
    today = linear_verify(0.05)
    busy = {b: today(1) * (3 + 1.5 * (b - 1) if b > 1 else 1) for b in range(1, 14)}
    model = KController(k_max=12)
    model.warm_start(busy, 1 * MS, None, 0.9, None)
    ks = simulate(model, np.random.default_rng(5), 300, lambda s, p: 0.9, today, 1 * MS)
    assert not any(ks[:EXPLORE_FIRST - 1])                 # the record is believed at first...
    assert np.mean(np.array(ks[EXPLORE_FIRST + 8:WARM_TRUST]) > 1) > 0.9, ks   # ...not for long
    assert np.mean(np.array(ks[WARM_TRUST + 40:]) > 1) > 0.9, np.bincount(ks)

    lookup = KController(k_max=12, draft_cost_free=True)
    lookup.warm_start(busy, 0.0, None, 0.9, None)
    classes = [class_of(16, False)] * 8
    rng, drafted = np.random.default_rng(6), []
    for _ in range(300):
        k = 0 if lookup.plain_due() else best_lookup(lookup, classes)[0]
        n_acc = 0
        while n_acc < k and rng.random() < 0.95:
            n_acc += 1
        lookup.lookup.observe(classes[:k], n_acc)
        lookup.observe(k, k, n_acc, 0.0, today(k + 1))
        drafted.append(k)
    assert not any(drafted[:WARM_TRUST - 1])
    assert np.mean(np.array(drafted[WARM_TRUST + 40:]) > 1) > 0.9, np.bincount(drafted)


def _tokens_run(ctrl, seed, n_tokens, rate_at, verify, draft) -> list[int]:
    """The ks of a simulated run that stops after n_tokens tokens (a generate --max-tokens run)."""
    rng, ks, done = np.random.default_rng(seed), [], 0
    while done < n_tokens:
        k = ctrl.choose(max(n_tokens - done - 1, 0))
        n_acc = 0
        while n_acc < k and rng.random() < rate_at(n_acc + 1):
            n_acc += 1
        ctrl.observe(k, k, n_acc, k * draft * (1 + 0.05 * rng.uniform(-1, 1)),
                     verify(k + 1) * (1 + 0.05 * rng.uniform(-1, 1)))
        ks.append(k)
        done += n_acc + 1
    return ks


@pytest.mark.parametrize("slow_draft", [10, 1], ids=["all 10x", "verify 10x"])
@pytest.mark.parametrize("name", ["cpu f32 target, q4 draft, alpha 0.95", "steep curve, alpha 0.9",
                                  "nearly flat curve, alpha 0.9"])
def test_a_record_from_a_busy_machine_costs_a_step_not_the_run(name, slow_draft):
    """A record written while other work held the cores: verify 10× slower than this machine
    (and the draft too, or not). Within N = 8 steps the run drafts as well as it can, and a
    256-token run keeps >= 90% of the throughput of a run from a correct record or from nothing.
    The expected throughput of the chosen ks is compared, so acceptance luck does not count."""
    rate_at, draft, verify = CASES[name]
    rates = [rate_at(i) for i in range(1, 13)]
    tokens, seconds = true_throughput(rates, draft, verify, 12)
    best = (tokens / seconds).max() * seconds[0]

    def speed(ks):
        return realised_vs_plain(ks, rates, draft, verify)

    for seed in range(3):
        right = _learned_on(rate_at, draft, verify, seed=seed)
        busy = _learned_on(rate_at, slow_draft * draft, lambda b: 10 * verify(b), seed=seed)
        poisoned = _tokens_run(_warm(busy), seed, 256, rate_at, verify, draft)
        assert speed(poisoned[8:]) >= 0.95 * best, (seed, poisoned[:16])
        for other in (_warm(right), KController(k_max=12)):
            assert speed(poisoned) >= 0.9 * speed(_tokens_run(other, seed, 256, rate_at, verify, draft)), seed


def test_a_cold_first_timing_that_set_the_record_level_is_undone_by_a_faster_second():
    """The first plain timing ran cold (+40%) and scaled the whole record up; the second, faster,
    replaces it and takes the sizes not timed yet back down with it (and the recorded draft cost)."""
    learned = _learned_on(lambda i: 0.9, 2 * MS, cpu_verify, steps=200)
    warm = _warm(learned)
    before = [warm.verify_cost(b) for b in range(1, 14)]
    draft = warm.draft_cost
    warm.observe(0, 0, 0, 0.0, before[0] * 1.4)
    np.testing.assert_allclose([warm.verify_cost(b) for b in range(1, 14)], np.array(before) * 1.4, rtol=1e-9)
    warm.observe(0, 0, 0, 0.0, before[0])
    np.testing.assert_allclose([warm.verify_cost(b) for b in range(1, 14)], before, rtol=1e-9)
    assert warm.draft_cost == pytest.approx(draft)


# ---- a stale record: tested within the run, at a bounded price (probes.py) -------------------------

def test_a_record_that_says_the_drafter_never_pays_is_tested_and_dropped_within_the_run():
    """A record from a busy hour: drafting 30× dearer than it is, α 0.1 where it is 0.9. Believed,
    it keeps the controller plain, and nothing re-times what is never tried. The record's verdict is
    tested after EXPLORE_FIRST plain steps; the test's fully accepted draft refutes its α, and the
    run speculates as a cold one would, well within a 256-token run."""
    rate_at, draft, verify = (lambda i: 0.9), 1 * MS, linear_verify(0.05)
    true = _learned_on(lambda i: 0.9, draft, verify)
    stale = dict(true, draft_cost=30 * true["draft_cost"], draft_by_n={n: 30 * t for n, t in true["draft_by_n"].items()},
                 alpha=0.1, by_position=[0.1] * 12)
    warm, cold = _warm(stale), KController(k_max=12)
    assert warm.choose() == 0
    runs = {}
    for name, ctrl in (("warm", warm), ("cold", cold)):
        ks = _tokens_run(ctrl, 3, 256, rate_at, verify, draft)
        runs[name] = realised_vs_plain(ks, [0.9] * 12, draft, verify)
        if name == "warm":
            first = next(i for i, k in enumerate(ks) if k)
            assert first <= EXPLORE_FIRST + 1, ks
            assert np.mean(np.array(ks[first + 4:]) > 1) > 0.9, ks
    assert runs["warm"] >= 0.9 * runs["cold"], runs


def test_a_true_record_of_a_losing_pair_costs_one_probe_to_confirm():
    """The same test on a record that is right (the draft model never pays here): one probe of
    PROBE_K tokens, then the measured verdict's rare probes; the controller never adopts drafting."""
    def verify(b):
        return (9 + 3 * (b - 1)) * MS
    warm = _warm(_learned_on(lambda i: 0.6, 9 * MS, verify, steps=300))
    ks = _tokens_run(warm, 4, 256, lambda p: 0.6, verify, 9 * MS)
    assert sum(k > 0 for k in ks) <= 5 and max(ks) <= 3, ks   # 16, then 16, 32, 64, 128 apart


def test_probes_lose_at_most_the_budget_whatever_the_estimates_say():
    """Probes priced by estimates alone could cost anything when the estimates are wrong (a record,
    a busy moment). Measured, what they lose stays under EXPLORE_BUDGET of the time decoded, plus
    the dearest probe and the one that went over: here every probe is much dearer than the estimates think (drafting costs 20× what
    the controller saw at start-up), and the estimate keeps saying "almost break-even"."""
    from localspec.decoding.controller.probes import EXPLORE_BUDGET

    c = KController(k_max=8)
    seconds = lost = 0.0
    worst = 0.0
    for step in range(2000):
        k = c.choose()
        probing = c.probes.probing
        t_draft = k * (1 * MS if step < 2 else 20 * MS)   # start-up saw a cheap draft
        t_verify = 10 * MS + 1 * MS * k
        n_acc = k if step < 2 else 0                       # and full acceptance
        c.observe(k, k, n_acc, t_draft, t_verify)
        if step >= 2:
            seconds += t_draft + t_verify
            if probing:
                loss = t_draft + t_verify - (n_acc + 1) * 10 * MS
                lost += loss
                worst = max(worst, loss)
    assert lost <= EXPLORE_BUDGET * seconds + 2 * worst, (lost, seconds)
    assert c.probes.count >= 3   # and it still probes now and then


def test_a_probe_that_another_drafter_served_is_made_at_the_next_step():
    from localspec.decoding.controller.probes import Probes

    p = Probes()
    tokens, seconds = np.array([1.0, 1.5, 1.8]), np.array([1.0, 1.8, 2.4])
    ks = [p.choose(tokens, seconds, 2, None, True) for _ in range(PROBE_EVERY_CAP)]
    due = ks.index(next(k for k in ks if k))
    p.defer()   # prompt lookup won that step
    assert p.choose(tokens, seconds, 2, None, True) > 0 and p.probing


PROBE_EVERY_CAP = 64


def test_the_budget_counts_the_records_test_and_expects_the_next_probe_to_cost_as_much_as_the_last():
    """The record's test is made whatever the budget, but what it lost counts; a later probe is
    refused while what probes lost, plus the last probe's loss, exceeds EXPLORE_BUDGET of the time
    decoded (before, the test was free and the dearest probe was forgiven: ~6 % of a short run on a
    GPU-class pass where drafting never pays)."""
    from localspec.decoding.controller.probes import EXPLORE_BUDGET, Probes

    p = Probes()
    tokens, seconds = np.array([1.0, 1.5, 1.8]), np.array([1.0, 1.6, 2.0])
    p.timed(1000.0)                           # a run far past BUDGET_HORIZON plain steps of 1 s
    k = 0
    for _ in range(EXPLORE_FIRST):
        k = p.choose(tokens, seconds, 2, None, True, unconfirmed=True)
    assert k and p.probing
    p.learn(0.9, False, loss=20.0)           # the test lost 20 s
    assert p.lost == 20.0 and p.last_loss == 20.0
    # 40 s of probe price against EXPLORE_BUDGET (2 %) of 1000 s: refused however long the wait in steps...
    assert not any(p.choose(tokens, seconds, 2, None, True) for _ in range(200))
    assert p.wait(1.0) == math.ceil((40.0 - EXPLORE_BUDGET * 1000.0) / EXPLORE_BUDGET)
    p.timed(40.0 / EXPLORE_BUDGET - 1000.0 + 1.0)   # ...until the time decoded pays for it
    assert p.choose(tokens, seconds, 2, None, True) > 0


def test_plain_is_held_without_re_deciding_until_a_probe_is_affordable(monkeypatch):
    """Once plain wins and the budget refuses probes, the controller does not re-price every step
    (~0.1 ms each, 3-4 % of a GPU-class pass): it re-decides at most every HOLD_PLAIN + 1 steps."""
    from localspec.decoding.controller.policy import HOLD_PLAIN

    def verify(b):
        return (3 + 1.2 * (b - 1)) * MS
    c = KController(k_max=8)
    simulate(c, np.random.default_rng(3), 40, lambda s, p: 0.5, verify, 2.5 * MS)
    c.probes.lost = 1.0    # probes have lost far more than the budget allows for a while
    calls = []
    real = c._throughput
    monkeypatch.setattr(c, "_throughput", lambda top: calls.append(top) or real(top))
    ks = simulate(c, np.random.default_rng(4), 330, lambda s, p: 0.5, verify, 2.5 * MS, start=40)
    assert not any(ks[REFRESH_PLAIN:]), ks
    assert len(calls) <= 330 // (HOLD_PLAIN + 1) + 3, len(calls)


def test_a_cold_first_plain_timing_is_re_timed_soon():
    """A run's first plain step is often cold (a new graph shape: 5.0 ms against 2.5 seen on the 128k
    stand-in). Beside drafting sizes re-timed at their true cost, that spike made a losing pair look
    paying until the next plain step, REFRESH_PLAIN steps on: half a short run at 0.67x plain. The
    second plain timing comes SECOND_PLAIN steps after the first, and the pair goes plain."""
    from localspec.decoding.controller.policy import SECOND_PLAIN

    def verify(b):
        return (2.5 + 2.0 * (b - 1)) * MS      # steep rows: drafting never pays here
    def spiked(b):                              # the run that wrote the record was cold at b = 1 too
        return 2.5 * verify(1) if b == 1 else verify(b)
    draft = 2.0 * MS
    c = _warm(_learned_on(lambda i: 0.75, draft, spiked))
    ks = []
    rng = np.random.default_rng(0)
    for step in range(60):
        k = c.choose()
        n = 0
        while n < k and rng.random() < 0.75:
            n += 1
        spike = 2.5 if step == 0 else 1.0      # only the first plain step is cold
        c.observe(k, k, n, k * draft, verify(k + 1) * (spike if k == 0 else 1.0))
        ks.append(k)
    assert 0 in ks[1:SECOND_PLAIN + 2], ks
    assert sum(k > 0 for k in ks[SECOND_PLAIN + 2:]) <= 4, ks   # then plain, bar a probe or two
    assert SECOND_PLAIN < REFRESH_PLAIN
