"""The draft-tree verification rule (localspec/decoding/tree.py) is exact: a statistical proof with teeth.

Target: a fixed first-order Markov table over a small vocabulary, p(x1) and p(x2 | x1); the row the
rule reads after a node is p(. | that node's token). Draft: its own Markov table q, from which the
trees are drawn afresh on every run exactly as tree_drafts.model_tree draws them: siblings from q
*without replacement*, each node recording Q = q with its earlier siblings removed (`without`).
Also one-hot trees (q = None: deterministic distinct rivals, as prompt lookup offers), and a mixed
tree. Each run's first two emitted tokens (the accepted path's tokens, then the next token; after
an empty path the second token is drawn from p(. | x1), as the decoder's next step would) are
chi-square tested against the exact joint p(x1) p(x2 | x1).

Teeth: three wrong variants of the rule, run by the same harness with the same draw counts, must
fail the same check: (a) siblings tested against p instead of the running residual, (b) the
un-updated q used for siblings drawn without replacement, (c) the first sibling always accepted.

Then: a chain is accept_sampled draw for draw (same rng, same consumption); greedy verification
is plain greedy decoding; the DraftTree helpers and tested_ranks; drafts with p = 0 and ids past
the target's vocabulary (Dense rows) are never accepted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from localspec.decoding.acceptance import accept_sampled
from localspec.decoding.dists import Dense, Sparse
from localspec.decoding import tree as tree_rule   # tested_ranks: imported by name, pytest would collect it
from localspec.decoding.tree import DraftTree, accept_tree_greedy, accept_tree_sampled
from tests.law_helpers import ALPHA, Check, against_p, chi2_check, chi2_critical

N = 12_000
"""Draws per chi-square case (every case and every wrong rule): ~190 per cell of a 64-cell joint."""


# --------------------------------------------------------------------------------------------
# Distributions


def sparse(row: np.ndarray) -> Sparse:
    ids = np.flatnonzero(row)
    return Sparse(ids, np.asarray(row, dtype=np.float64)[ids])


def dense(row: np.ndarray) -> Dense:
    return Dense(np.asarray(row, dtype=np.float32))


def _normalise(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum(axis=-1, keepdims=True)


class Draft:
    """The draft's Markov table q as `Dist`s, with the `without` chains of sampling siblings
    without replacement built once per (context, removed set): a drafter builds the very same
    distributions each time (Sparse.without / Dense.without are pure)."""

    def __init__(self, q1: np.ndarray, q2: np.ndarray, form: str = "sparse"):
        make = sparse if form == "sparse" else dense
        self.vocab = len(q1)
        self.rows = {None: make(q1), **{t: make(q2[t]) for t in range(len(q2))}}
        self._memo: dict = {}

    def removed(self, ctx, removed: frozenset):
        key = (ctx, removed)
        if key not in self._memo:
            if not removed:
                self._memo[key] = self.rows[ctx]
            else:
                x = max(removed)
                self._memo[key] = self.removed(ctx, removed - {x}).without(x)
        return self._memo[key]

    def siblings(self, ctx, b: int, rng) -> list[tuple[int, object]]:
        """Up to b distinct tokens from q(. | ctx), drawn without replacement, each with the
        distribution it was drawn from (tree_drafts.siblings)."""
        out, gone = [], frozenset()
        q = self.rows[ctx]
        while len(out) < b:
            x = q.sample(rng)
            out.append((x, q))
            gone = gone | {x}
            q = self.removed(ctx, gone)
            if q.total <= 0.0:
                break
        return out


class Rows:
    """The target's rows for one tree: row 0 after the text, row c + 1 after node c. A row after an
    id the target lacks (or a forbidden context) raises: the rule must never read it."""

    __slots__ = ("tree", "target")

    def __init__(self, tree: DraftTree, target: "Target"):
        self.tree, self.target = tree, target

    def __getitem__(self, row: int):
        if row == 0:
            return self.target.root
        return self.target.after[self.tree.tokens[row - 1]]


class Target:
    def __init__(self, p1: np.ndarray, p2: np.ndarray, form: str = "sparse"):
        make = sparse if form == "sparse" else dense
        self.p1, self.p2, self.vocab = p1, p2, len(p1)
        self.root = make(p1)
        # No row after a token the target never emits: reading one is a bug in the rule.
        self.after = {t: make(p2[t]) for t in range(len(p1)) if p1[t] > 0 or p2[:, t].any()}


# --------------------------------------------------------------------------------------------
# Trees, built the way the drafters build them


def sampled_tree(draft: Draft, shape, rng, target_vocab: int) -> DraftTree:
    """tree_drafts.model_tree at T > 0: level by level, shape[d] siblings per node at depth d,
    drawn from q without replacement; ids the target lacks are not expanded."""
    tokens, parents, qs = [], [], []
    frontier = [(-1, None)]
    for b in shape:
        level = []
        for node, ctx in frontier:
            for x, q in draft.siblings(ctx, b, rng):
                level.append((len(tokens), x))
                tokens.append(x)
                parents.append(node)
                qs.append(q)
        frontier = [(i, x) for i, x in level if x < target_vocab]
    return DraftTree(tokens, parents, qs)


def mixed_tree(draft: Draft, rng, rivals: dict) -> DraftTree:
    """The draft model's siblings (without replacement, recorded Q) and, after them, prompt
    lookup's rival for the same context (one-hot, Q = None) where it differs from all of them.
    Two levels; the shape depends on the draws, never on the target or the coins."""
    tokens, parents, qs = [], [], []

    def level(node, ctx, b):
        got = draft.siblings(ctx, b, rng)
        out = []
        for x, q in got:
            out.append(len(tokens))
            tokens.append(x)
            parents.append(node)
            qs.append(q)
        rival = rivals.get(ctx)
        if rival is not None and rival not in {x for x, _ in got}:
            out.append(len(tokens))
            tokens.append(rival)
            parents.append(node)
            qs.append(None)
        return out

    for i in level(-1, None, 2):
        level(i, tokens[i], 1)
    return DraftTree(tokens, parents, qs)


def fixed_tree(spec) -> DraftTree:
    """A one-hot tree from nested (token, [children]) lists, in level order."""
    tokens, parents = [], []
    frontier = [(-1, spec)]
    while frontier:
        nxt = []
        for node, kids in frontier:
            for tok, sub in kids:
                nxt.append((len(tokens), sub))
                tokens.append(tok)
                parents.append(node)
        frontier = nxt
    return DraftTree(tokens, parents)


# --------------------------------------------------------------------------------------------
# The cases


@dataclass(frozen=True)
class Case:
    target: Target
    make_tree: Callable[[np.random.Generator], DraftTree]
    """Draws one draft tree with the drafter's rng (a fixed tree ignores it)."""


def _markov(rng, v, conc):
    """A target table: p(x1), and p(x2 | x1) as rows."""
    return rng.dirichlet(np.full(v, conc)), rng.dirichlet(np.full(v, conc), size=v)


def _draft_near(rng, p1, p2, mix=0.4, spike=0.5):
    """A draft table that overlaps the target's but is peaked as a language model's rows are: in
    every context `spike` of its mass sits on one token of its own choosing, so its first sibling
    is often the same token and drawing the rest without replacement matters."""
    def one(p):
        q = _normalise(mix * p + (1 - mix) * rng.dirichlet(np.full(len(p), 0.4)))
        q *= 1 - spike
        q[int(rng.integers(len(p)))] += spike
        return q
    return one(p1), np.array([one(row) for row in p2])


@functools.lru_cache(maxsize=None)
def make_case(name: str) -> Case:
    rng = np.random.default_rng(sum(map(ord, name)))
    if name.startswith("sampled_"):
        # (2,2,2), (3,1,1,1), (4,): siblings from q without replacement, Sparse rows.
        shape = tuple(int(c) for c in name.removeprefix("sampled_"))
        v = 8
        p1, p2 = _markov(rng, v, 0.8)
        draft = Draft(*_draft_near(rng, p1, p2))
        return Case(Target(p1, p2), lambda r: sampled_tree(draft, shape, r, v))
    if name == "truncated_22":
        # Truncated supports that differ both ways: the draft proposes tokens the target never
        # emits (p = 0: always rejected), and the target has tokens the draft never proposes.
        v = 10
        p1, p2 = _markov(rng, v, 0.8)
        p1[[0, 1]] = 0.0
        p2[:, [0, 1]] = 0.0
        p1, p2 = _normalise(p1), _normalise(p2)
        q1, q2 = _draft_near(rng, p1, p2, mix=0.4)
        q1[[0, 1]] += 0.15
        q2[:, [0, 1]] += 0.15
        q1[[8, 9]] = 0.0
        q2[:, [8, 9]] = 0.0
        draft = Draft(_normalise(q1), _normalise(q2))
        return Case(Target(p1, p2), lambda r: sampled_tree(draft, (2, 2), r, v))
    if name == "onehot":
        # Deterministic distinct rivals (prompt lookup): 3 at the root, one of them with p = 0.
        v = 6
        p1 = _normalise([0.3, 0.25, 0.0, 0.2, 0.15, 0.1])
        p2 = rng.dirichlet(np.full(v, 0.8), size=v)
        p2[3, 4] = 0.0
        p2 = _normalise(p2)
        tree = fixed_tree([(0, [(1, []), (3, [(1, [])]), (2, [])]),
                           (2, [(0, [])]),
                           (3, [(4, []), (0, []), (5, [])])])
        return Case(Target(p1, p2), lambda r: tree)
    if name == "mixed":
        v = 8
        p1, p2 = _markov(rng, v, 0.8)
        draft = Draft(*_draft_near(rng, p1, p2))
        rivals = {None: int(np.argsort(p1)[-2]), **{t: int((t + 3) % v) for t in range(v)}}
        return Case(Target(p1, p2), lambda r: mixed_tree(draft, r, rivals))
    if name == "dense_wider":
        # Dense target rows over 8 ids; the draft's vocabulary has 2 more (ids 8, 9: p = 0, and no
        # row after them), which carry ~30% of the draft's mass. Shape (3, 2).
        v = 8
        p1, p2 = _markov(rng, v, 0.8)
        q1, q2 = _draft_near(rng, p1, p2)
        q1 = _normalise(np.append(0.7 * q1, [0.2, 0.1]))
        q2 = np.concatenate([0.7 * q2, np.tile([0.1, 0.2], (v, 1))], axis=1)
        draft = Draft(q1, _normalise(q2), form="dense")
        return Case(Target(p1, p2, form="dense"), lambda r: sampled_tree(draft, (3, 2), r, v))
    if name == "dense_blocks":
        # Untruncated rows over 2,600 ids: two of Dense's 1,024-id blocks and part of a third, so
        # sampling, `without` and the residual cross block borders. Eight ids spread over the
        # blocks (two on each side of a border) hold 95 % of each row, the rest is spread thin.
        v = 2600
        hot = np.array([3, 700, 1023, 1024, 1500, 2047, 2048, 2599])

        def row(conc):
            r = np.full(v, 0.05 / (v - len(hot)))
            r[hot] = 0.95 * rng.dirichlet(np.full(len(hot), conc))
            return r

        def near(p):
            q = 0.6 * (0.5 * p + 0.5 * row(0.4))
            q[rng.choice(hot)] += 0.4
            return q
        p1, p2 = row(0.8), np.array([row(0.8) for _ in range(v)])
        draft = Draft(near(p1), np.array([near(r) for r in p2]), form="dense")
        return Case(Target(p1, p2, form="dense"), lambda r: sampled_tree(draft, (2, 2), r, v))
    raise KeyError(name)


CASES = ["sampled_222", "sampled_3111", "sampled_4", "truncated_22", "onehot", "mixed", "dense_wider",
         "dense_blocks"]


# --------------------------------------------------------------------------------------------
# The harness


@dataclass
class Run:
    x1: np.ndarray
    x2: np.ndarray
    accepted: np.ndarray   # nodes accepted per run
    check: Check


def run_rule(rule, case: Case, seed: int, n: int = N) -> Run:
    draft_rng = np.random.default_rng([seed, 1])
    rng = np.random.default_rng([seed, 2])
    next_rng = np.random.default_rng([seed, 3])
    t = case.target
    x1 = np.zeros(n, dtype=np.int64)
    x2 = np.full(n, -1, dtype=np.int64)
    acc = np.zeros(n, dtype=np.int64)
    for j in range(n):
        tree = case.make_tree(draft_rng)
        path, nxt = rule(tree, Rows(tree, t), rng)
        out = tree.path_tokens(path) + [nxt]
        x1[j] = out[0]
        if len(out) > 1:
            x2[j] = out[1]
        acc[j] = len(path)
    v = t.vocab
    bad = x1 >= v
    # After an empty path the decoder's next step emits p(. | x1): drawn here, vectorised.
    need = np.flatnonzero((x2 < 0) & ~bad)
    u = next_rng.random(len(need))
    for lo in range(0, len(need), 512):   # a few hundred rows at a time: wide vocabularies too
        at = need[lo:lo + 512]
        cdf = np.cumsum(t.p2[x1[at]], axis=1)
        x2[at] = np.minimum((cdf <= (u[lo:lo + 512] * cdf[:, -1])[:, None]).sum(axis=1), v - 1)
    bad |= (x2 >= v) | (x2 < 0)
    counts = np.bincount(x1[~bad] * v + x2[~bad], minlength=v * v)
    check = chi2_check(counts, t.p1[:, None] * t.p2)
    if bad.any():
        check.forbidden += int(bad.sum())
        check.ok = False
    return Run(x1, x2, acc, check)


@functools.lru_cache(maxsize=None)
def cached_run(rule, name: str) -> Run:
    return run_rule(rule, make_case(name), seed=sum(map(ord, name)) + 11)


# --------------------------------------------------------------------------------------------
# Wrong rules: variants of accept_tree_sampled, same signature


def q_not_updated(tree: DraftTree, p, rng):
    """(b) Siblings drawn without replacement verified as if each came from q itself: Q_i = the
    first sibling's Q (q) instead of q with the earlier siblings removed."""
    q = tree.q
    if q is not None:
        q = [q[tree.children[par + 1][0]] if q[i] is not None else None for i, par in enumerate(tree.parents)]
    return accept_tree_sampled(DraftTree(tree.tokens, tree.parents, q), p, rng)


def first_always(tree: DraftTree, p, rng):
    """(c) The first sibling always accepted."""
    path, row = [], 0
    while tree.children[row]:
        c = tree.children[row][0]
        path.append(c)
        row = c + 1
    return path, p[row].sample(rng)


WRONG = [
    (against_p, "sampled_222"),
    (against_p, "dense_blocks"),
    (against_p, "onehot"),
    (q_not_updated, "sampled_4"),
    (q_not_updated, "sampled_222"),
    (first_always, "sampled_3111"),
    (first_always, "onehot"),
]


# --------------------------------------------------------------------------------------------
# 1. The law of the emitted tokens


def test_cases_are_what_they_claim():
    rng = np.random.default_rng(0)
    shapes = {"sampled_222": (2, 2, 2), "sampled_3111": (3, 1, 1, 1), "sampled_4": (4,)}
    for name, shape in shapes.items():
        case = make_case(name)
        tree = case.make_tree(rng)
        assert tree.depth() == len(shape) and len(tree.children[0]) == shape[0]
        assert len(tree) == sum(int(np.prod(shape[:d + 1])) for d in range(len(shape)))
        for kids in tree.children:   # distinct siblings, each Q = q less the earlier ones
            toks = [tree.tokens[c] for c in kids]
            assert len(set(toks)) == len(toks)
            for j, c in enumerate(kids):
                assert all(tree.q[c].prob(tree.tokens[e]) == 0.0 for e in kids[:j])
                assert tree.q[c].prob(tree.tokens[c]) > 0.0
    onehot = make_case("onehot")
    tree = onehot.make_tree(rng)
    assert tree.q is None and [tree.tokens[c] for c in tree.children[0]] == [0, 2, 3]
    assert onehot.target.p1[2] == 0.0   # a rival the target never emits
    mixed = [make_case("mixed").make_tree(rng) for _ in range(50)]
    assert all(t.q is not None for t in mixed)
    assert any(None in t.q for t in mixed) and all(any(q is not None for q in t.q) for t in mixed)
    wide = [make_case("dense_wider").make_tree(rng) for _ in range(50)]
    assert any(x >= 8 for t in wide for x in t.tokens)   # ids the target lacks are proposed
    assert isinstance(make_case("dense_wider").target.root, Dense)
    assert len(make_case("dense_blocks").target.root.blocks) == 3   # several blocks of Dense's
    tr = make_case("truncated_22")
    assert tr.target.p1[0] == 0.0 and any(0 in t.tokens or 1 in t.tokens for t in
                                          (tr.make_tree(rng) for _ in range(20)))


@pytest.mark.parametrize("name", CASES)
def test_first_two_tokens_follow_the_target(name):
    run = cached_run(accept_tree_sampled, name)
    print(f"{name}: {run.check}")
    assert run.check.ok, f"{name}: {run.check}"
    # The tree is doing something: a good share of runs accept at least one node.
    assert (run.accepted > 0).mean() > 0.3, name


def test_trees_accept_more_than_their_first_branch():
    """Sanity of the harness: a later sibling is accepted in a good share of runs, so the residual
    chain is exercised, and paths through depth 2 or more are common."""
    case = make_case("sampled_222")
    rng, draft_rng = np.random.default_rng(5), np.random.default_rng(6)
    later = deep = 0
    for _ in range(2000):
        tree = case.make_tree(draft_rng)
        path, _ = accept_tree_sampled(tree, Rows(tree, case.target), rng)
        later += any(tree.rank(c) > 0 for c in path)
        deep += len(path) >= 2
    assert later > 200 and deep > 200, (later, deep)


# --------------------------------------------------------------------------------------------
# 2. Teeth


@pytest.mark.parametrize("rule,name", WRONG, ids=[f"{r.__name__}-{n}" for r, n in WRONG])
def test_wrong_rule_fails_the_same_check(rule, name):
    check = cached_run(rule, name).check
    right = cached_run(accept_tree_sampled, name).check
    print(f"{rule.__name__} on {name}: {check}   (right rule: {right})")
    assert check.df == right.df or check.forbidden > 0
    assert check.forbidden > 0 or check.stat > check.crit, str(check)
    assert not check.ok
    # Not a near miss: each is at least 3 x the critical value at these draw counts.
    assert check.forbidden > 0 or check.stat > 3 * check.crit, str(check)


def test_critical_value_is_at_alpha():
    assert ALPHA == 1e-4
    assert 80.0 < chi2_critical(63) < 120.0


# --------------------------------------------------------------------------------------------
# 3. A chain is the chain rule, draw for draw


def _random_chain_case(rng):
    """Random rows of either form, with every corner the chain rule has: p = 0 drafts, one-hot
    (None) positions, draft vocabularies wider than the target's, q equal to p."""
    v = int(rng.integers(6, 13))
    k = int(rng.integers(0, 6))
    form = rng.choice(["sparse", "dense"])
    make = sparse if form == "sparse" else dense
    vd = v + int(rng.integers(0, 3)) if form == "dense" else v
    p = rng.dirichlet(np.full(v, 0.7), size=k + 1)
    p[rng.random((k + 1, v)) < 0.25] = 0.0
    p[:, 0] += 1e-3   # keep every row non-empty
    p = _normalise(p)
    q = _normalise(rng.dirichlet(np.full(vd, 0.7), size=max(k, 1))[:k]) if k else np.zeros((0, vd))
    if k and rng.random() < 0.2:
        q[0, :v] = p[0]
        q[0, v:] = 0.0
    tokens, qs = [], []
    for i in range(k):
        kind = rng.random()
        if kind < 0.6:          # drawn from q
            x = int(rng.choice(vd, p=q[i]))
            qs.append(make(q[i]))
        elif kind < 0.8:        # one-hot
            x = int(rng.integers(0, vd))
            qs.append(None)
        else:                   # a token the target never emits (p = 0, or past its vocabulary)
            zero = np.flatnonzero(p[i] == 0.0).tolist() + list(range(v, vd))
            x = int(rng.choice(zero)) if zero else int(rng.integers(0, v))
            qs.append(None if rng.random() < 0.5 else make(q[i]))
        tokens.append(x)
    q_arg = None if all(d is None for d in qs) and rng.random() < 0.5 else qs
    return tokens, [make(r) for r in p], q_arg


def test_chain_is_accept_sampled_draw_for_draw():
    rng = np.random.default_rng(2024)
    outcomes = set()
    for case in range(3000):
        tokens, p, q = _random_chain_case(rng)
        tree = DraftTree.chain(tokens, q)
        assert tree.is_chain() and len(tree) == len(tokens)
        a, b = np.random.default_rng([case, 9]), np.random.default_rng([case, 9])
        path, nxt = accept_tree_sampled(tree, p, a)
        n, t = accept_sampled(tokens, p, q, b)
        assert (len(path), nxt) == (n, t), (case, tokens)
        assert path == list(range(n))
        assert a.random() == b.random(), f"case {case}: the rng was consumed differently"
        outcomes.add((n == len(tokens), n > 0))
    assert len(outcomes) == 4   # full accepts, partial, rejections at 0, empty drafts among them


# --------------------------------------------------------------------------------------------
# 4. Greedy


def test_greedy_tree_is_greedy_decoding():
    rng = np.random.default_rng(7)
    depths = set()
    for case in range(500):
        v = int(rng.integers(4, 10))
        p1, p2 = rng.random(v), rng.random((v, v))   # continuous: no ties
        g = [int(p1.argmax())]
        for _ in range(12):
            g.append(int(p2[g[-1]].argmax()))
        # A random tree whose children hit the greedy token often.
        tokens, parents = [], []
        frontier = [(-1, None)]
        for _depth in range(int(rng.integers(0, 5))):
            nxt = []
            for node, ctx in frontier:
                best = int(p1.argmax()) if ctx is None else int(p2[ctx].argmax())
                b = int(rng.integers(1, min(4, v) + 1))
                kids = rng.permutation(v)[:b].tolist()
                if rng.random() < 0.6 and best not in kids:
                    kids[int(rng.integers(0, b))] = best
                for x in kids:
                    nxt.append((len(tokens), x))
                    tokens.append(x)
                    parents.append(node)
            frontier = nxt
        tree = DraftTree(tokens, parents)
        argmax = [int(p1.argmax())] + [int(p2[x].argmax()) for x in tokens]
        path, nxt = accept_tree_greedy(tree, argmax)
        out = tree.path_tokens(path) + [nxt]
        assert out == g[:len(out)], case
        # The path is the deepest branch on the greedy prefix: no child of its end matches.
        end = path[-1] + 1 if path else 0
        assert all(tree.tokens[c] != g[len(path)] for c in tree.children[end])
        assert all(tree.parents[c] == (path[i - 1] if i else -1) for i, c in enumerate(path))
        depths.add(len(path))
    assert {0, 1, 2, 3} <= depths


def test_greedy_takes_the_first_matching_child_and_stops():
    tree = DraftTree([5, 3, 3, 1, 2], [-1, -1, -1, 1, 2])
    assert accept_tree_greedy(tree, [3, 0, 9, 4, 2, 7]) == ([1], 9)
    assert accept_tree_greedy(tree, [4, 0, 0, 0, 0, 0]) == ([], 4)
    assert accept_tree_greedy(DraftTree([], []), [6]) == ([], 6)
    assert accept_tree_greedy(DraftTree.chain([1, 2]), [1, 2, 8]) == ([0, 1], 8)


# --------------------------------------------------------------------------------------------
# 5. DraftTree helpers and tested_ranks


def test_tree_helpers():
    #   root: 0 (a), 1 (b), 2 (c); 1: 3, 4; 3: 5
    tree = DraftTree([10, 11, 12, 13, 14, 15], [-1, -1, -1, 1, 1, 3])
    assert tree.children == [[0, 1, 2], [], [3, 4], [], [5], [], []]
    assert [tree.rank(i) for i in range(6)] == [0, 1, 2, 0, 1, 0]
    assert tree.depth() == 3 and tree.leaves() == 4 and not tree.is_chain() and len(tree) == 6
    assert tree.path_tokens([1, 3, 5]) == [11, 13, 15]
    chain = DraftTree.chain([4, 5, 6])
    assert chain.parents == [-1, 0, 1] and chain.q is None
    assert chain.depth() == 3 and chain.leaves() == 1 and chain.is_chain()
    assert [chain.rank(i) for i in range(3)] == [0, 0, 0]
    empty = DraftTree([], [])
    assert empty.depth() == 0 and empty.leaves() == 0 and empty.is_chain() and len(empty) == 0
    assert DraftTree.chain([]).children == [[]]
    q = [sparse(np.array([0.5, 0.5]))] * 2
    assert DraftTree.chain([0, 1], q).q == q


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, 2, 0], [-2], [-1, 0, 5]])
def test_parent_after_child_is_refused(parents):
    with pytest.raises(ValueError):
        DraftTree(list(range(len(parents))), parents)


def test_tested_ranks():
    tree = DraftTree([10, 11, 12, 13, 14, 15], [-1, -1, -1, 1, 1, 3])
    assert tree_rule.tested_ranks(tree, []) == [(0, False), (1, False), (2, False)]
    assert tree_rule.tested_ranks(tree, [], bonus_row_tried=False) == []
    assert tree_rule.tested_ranks(tree, [0]) == [(0, True)]
    assert tree_rule.tested_ranks(tree, [1]) == [(0, False), (1, True), (0, False), (1, False)]
    assert tree_rule.tested_ranks(tree, [1, 4]) == [(0, False), (1, True), (0, False), (1, True)]
    assert tree_rule.tested_ranks(tree, [1, 3]) == [(0, False), (1, True), (0, True), (0, False)]
    assert tree_rule.tested_ranks(tree, [1, 3, 5]) == [(0, False), (1, True), (0, True), (0, True)]
    assert tree_rule.tested_ranks(tree, [1, 3, 5], bonus_row_tried=False) == [(0, False), (1, True), (0, True), (0, True)]
    assert tree_rule.tested_ranks(DraftTree.chain([1, 2]), [0]) == [(0, True), (0, False)]


def test_tested_ranks_are_the_proposals_the_rule_tried():
    """Spy on the recorded Q of every node: the rule reads Q at each sibling it tries, so the nodes
    read are the tried ones, in order; tested_ranks must report their ranks and outcomes. And the
    target's rows the rule reads are those on the accepted path only."""
    case = make_case("sampled_222")
    rng, draft_rng = np.random.default_rng(3), np.random.default_rng(4)
    seen_ranks = set()
    for _ in range(500):
        tree = case.make_tree(draft_rng)
        tried: list[int] = []
        spied = DraftTree(tree.tokens, tree.parents, [_SpyQ(c, q, tried) for c, q in enumerate(tree.q)])
        rows = _LoggedRows(spied, case.target)
        path, _ = accept_tree_sampled(spied, rows, rng)
        assert tried == _tried_nodes(tree, path)
        # One target row per depth reached, in order: lazy rows are processed only on the path.
        assert rows.read == [0] + [c + 1 for c in path]
        ranks = tree_rule.tested_ranks(tree, path)
        assert ranks == [(tree.rank(c), c in path) for c in tried]
        seen_ranks |= set(ranks)
    assert {(0, True), (1, True), (0, False), (1, False)} <= seen_ranks


class _LoggedRows(Rows):
    __slots__ = ("read",)

    def __init__(self, tree, target):
        super().__init__(tree, target)
        self.read = []

    def __getitem__(self, row):
        self.read.append(row)
        return super().__getitem__(row)


class _SpyQ:
    """A draft distribution that notes which node's Q the rule reads at its token."""

    def __init__(self, node, q, log):
        self.node, self.q, self.log = node, q, log

    def prob(self, x):
        self.log.append(self.node)
        return self.q.prob(x)

    def probs_at(self, ids):
        return self.q.probs_at(ids)


def _tried_nodes(tree, path):
    out, row = [], 0
    for c in path:
        kids = tree.children[row]
        out += kids[:kids.index(c) + 1]
        row = c + 1
    return out + tree.children[row]


# --------------------------------------------------------------------------------------------
# p = 0 drafts and ids past the target's vocabulary


@pytest.mark.parametrize("form", ["sparse", "dense"])
def test_draft_with_zero_target_probability_is_never_accepted(form):
    """Token 1 has p = 0 and most of the draft's mass. At the root: a one-hot rival 1, then two
    siblings drawn from q without replacement. No row follows token 1: descending into it raises."""
    p = _normalise([0.4, 0.0, 0.3, 0.3])
    target = Target(p, np.tile(_normalise([0.3, 0.0, 0.3, 0.4]), (4, 1)), form=form)
    assert 1 not in target.after and isinstance(target.root, Sparse if form == "sparse" else Dense)
    draft = Draft(_normalise([0.1, 0.6, 0.2, 0.1]), np.tile(_normalise([1, 1, 1, 1]), (4, 1)), form=form)
    rng, draft_rng = np.random.default_rng(1), np.random.default_rng(2)
    first = np.zeros(4)
    drawn_1 = 0
    for _ in range(3000):
        got = draft.siblings(None, 2, draft_rng)
        drawn_1 += any(x == 1 for x, _ in got)
        tree = DraftTree([1] + [x for x, _ in got], [-1] * (1 + len(got)), [None] + [q for _, q in got])
        path, nxt = accept_tree_sampled(tree, Rows(tree, target), rng)
        out = tree.path_tokens(path) + [nxt]
        assert 1 not in out
        first[out[0]] += 1
    assert drawn_1 > 1500   # the draft proposed the p = 0 token a second time in most runs
    check = chi2_check(first, p)
    assert check.ok, str(check)


@pytest.mark.parametrize("q_form", ["sparse", "dense", "onehot"])
def test_id_past_the_target_vocabulary_is_never_accepted(q_form):
    """Dense target rows over 5 ids; the draft's vocabulary has 7, and ids 5 and 6 carry 70% of its
    mass (p = 0 there, and no row after them: descending into one raises)."""
    p = _normalise([0.1, 0.3, 0.2, 0.2, 0.2])
    target = Target(p, np.tile(_normalise(np.arange(1.0, 6.0)), (5, 1)), form="dense")
    assert isinstance(target.root, Dense) and len(target.root) == 5 and target.root.prob(6) == 0.0
    qw = _normalise([0.05, 0.1, 0.05, 0.05, 0.05, 0.4, 0.3])
    draft = Draft(qw, np.tile(qw, (7, 1)), form="dense" if q_form == "dense" else "sparse")
    rng, draft_rng = np.random.default_rng(4), np.random.default_rng(5)
    first = np.zeros(5)
    for _ in range(3000):
        if q_form == "onehot":
            tree = DraftTree([6, 5, 1], [-1, -1, -1])
        else:
            got = draft.siblings(None, 3, draft_rng)
            tree = DraftTree([x for x, _ in got], [-1] * len(got), [q for _, q in got])
        path, nxt = accept_tree_sampled(tree, Rows(tree, target), rng)
        out = tree.path_tokens(path) + [nxt]
        assert all(x < 5 for x in out)
        first[out[0]] += 1
    check = chi2_check(first, p)
    assert check.ok, str(check)
