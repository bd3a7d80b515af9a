"""`--tree auto`'s choice (decoding/controller/trees.py), without a model: a tree only where the
measured costs and sibling acceptance say it beats the chain."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.config import MAX_TREE_NODES, DecodeConfig, ConfigError, parse_tree
from localspec.decoding.controller.trees import (CANDIDATES, MIN_TRIALS, PROBE_EVERY, SiblingRates,
                                                 TreeChooser, expected_tokens, level_sizes)


def curve(base: float, per_row: float, top: int = MAX_TREE_NODES + 1) -> np.ndarray:
    return base + per_row * np.arange(top)


def trained(beta: float, trials: int = 200) -> TreeChooser:
    c = TreeChooser()
    rng = np.random.default_rng(0)
    for _ in range(trials):
        c.observe("model", [(0, False), (1, bool(rng.random() < beta))])
    return c


def test_expected_tokens_of_a_chain_and_of_a_tree():
    a = [0.6, 0.6, 0.6]
    beta = np.array([0.0, 0.5, 0.4, 0.3])
    chain = expected_tokens(a, beta, (), 3)
    assert chain == pytest.approx(1 + 0.6 + 0.36 + 0.216)
    wide = 1 - 0.4 * 0.5   # a second child at depth 1
    assert expected_tokens(a, beta, (2,), 3) == pytest.approx(1 + wide + wide * 0.6 + wide * 0.36)
    assert level_sizes((3, 2), 4) == [3, 6, 6, 6]


def test_flat_verify_chooses_a_tree_steep_verify_keeps_the_chain():
    """A GPU-like flat verify cost: siblings cost nothing, so a tree wins; a CPU-like cost per
    row (the verify of 5 rows at 1.75x one, as measured on this machine's F32 target): the chain."""
    a = [0.6] * 4
    flat = trained(0.4).choose("model", 4, 8, a, 0.004, 0.0005, curve(0.02, 0.00002))
    assert flat is not None and flat in CANDIDATES
    steep = trained(0.4).choose("model", 4, 8, a, 0.004, 0.002, curve(0.028, 0.0054))
    assert steep is None


def test_siblings_that_are_never_accepted_keep_the_chain_even_when_rows_are_free():
    assert trained(0.0).choose("model", 4, 8, [0.6] * 4, 0.004, 0.0, curve(0.02, 0.0)) is None


def test_width_and_budget_bound_the_shapes():
    c = trained(0.5)
    shape = c.choose("model", 4, 2, [0.5] * 4, 0.0, 0.0, curve(0.02, 0.0))
    assert shape is not None and np.prod(shape) <= 2
    assert c.choose("model", 4, 1, [0.5] * 4, 0.0, 0.0, curve(0.02, 0.0)) is None


def test_probes_until_sibling_acceptance_is_known():
    """Before MIN_TRIALS trials of rank 1, where rows are cheap a tree is tried every PROBE_EVERY
    decisions even while the estimate keeps the chain; afterwards only the estimate decides."""
    c = TreeChooser()
    cheap = curve(0.028, 0.0005)
    for _ in range(MIN_TRIALS - 1):
        c.observe("lookup", [(0, False), (1, False)])
    shapes = [c.choose("lookup", 3, 8, [0.5] * 3, 0.0, 0.0, cheap) for _ in range(PROBE_EVERY * 9 * 3)]
    probes = [s for s in shapes if s is not None]
    assert 1 <= len(probes) <= 3
    c.observe("lookup", [(0, False), (1, False)])
    shapes = [c.choose("lookup", 3, 8, [0.5] * 3, 0.0, 0.0, cheap) for _ in range(PROBE_EVERY * 20)]
    assert all(s is None for s in shapes)


def test_no_probe_where_even_perfect_siblings_would_lose():
    """A CPU-like verify cost (each row ~20 % of a pass): no tree could beat the chain, so none is
    ever tried, not even to learn sibling acceptance."""
    c = TreeChooser()
    steep = curve(0.028, 0.0054)
    shapes = [c.choose("model", 11, 8, [0.96] * 11, 0.12, 0.007, steep) for _ in range(PROBE_EVERY * 30)]
    assert all(s is None for s in shapes)


def test_sibling_rates_learn_by_rank():
    r = SiblingRates()
    for _ in range(300):
        r.observe([(0, False), (1, True)])
        r.observe([(0, False), (1, False), (2, True)])
    beta = r.beta()
    assert beta[1] == pytest.approx(0.5, abs=0.05)
    assert beta[2] == pytest.approx(beta[1])   # 0.99 measured, but never above the rank before it
    assert r.trials[1] == 600 and r.trials[2] == 300


@pytest.mark.parametrize("text,shape", [("auto", "auto"), ("off", "off"), ("3,2,1,1", (3, 2, 1, 1)),
                                        (" 4 ", (4,)), ("2,2,2", (2, 2, 2))])
def test_parse_tree(text, shape):
    assert parse_tree(text) == shape
    assert DecodeConfig(tree=text).tree == shape


@pytest.mark.parametrize("text", ["", "0", "3,0", "a,b", "3,3", "9", "2,-1"])
def test_parse_tree_refuses(text):
    with pytest.raises(ConfigError):
        parse_tree(text)


def test_sequences_each_setting_needs():
    assert DecodeConfig(tree="off").n_seq == 1
    assert DecodeConfig(tree="2,2").n_seq == 4
    assert DecodeConfig(tree="auto").n_seq == 8


def test_a_fixed_shape_that_does_not_pay_falls_back_to_chains_not_to_plain():
    """--tree 2,2 where a verify row is half a plain step: the tree loses to plain decoding, a chain
    wins. Priced as trees only, every step decoded plainly (1.03 tokens/pass, against 7.27 with
    --tree auto); the k controller now drafts chains there and says its tree would not pay."""
    from localspec.decoding.controller import KController
    from localspec.decoding.tree_drafts import choose_shape

    c = KController(k_max=4)
    c.tree_shape = (2, 2)
    for _ in range(12):   # a row costs half a plain step; the draft model is cheap and right 90 % of the time
        for b in range(1, 8):
            c.observe_verify(b, 0.010 + 0.005 * (b - 1))
        c.observe_draft(2, 2, 0.0004)
        c.observe_draft(2, 1, 0.0004)
    k = c.choose()
    assert k >= 1, "a chain pays: not plain decoding"
    assert c.tree_pays is not None and not c.tree_pays[k]

    class Auto:   # choose_shape reads only who drafts this step (an AutoDrafter's plan)
        _plan = type("Plan", (), {"source": "model"})()
    assert choose_shape((2, 2), c, Auto(), [1, 2, 3], k, width=4) is None   # a chain this step
    c.tree_pays = None
    assert choose_shape((2, 2), c, Auto(), [1, 2, 3], k, width=4) == (2, 2)   # nothing priced: as asked
