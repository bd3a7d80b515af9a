"""Choosing the draft tree (`--tree auto`): widen the chain only where measured costs say it pays.

A tree of shape (b_1, b_2, ...) (b_d children per node at depth d, 1 past the shape) and depth k
yields, with a_d the acceptance of the first-ranked proposal at depth d (the chain's, per position)
and beta_r that of the r-th further sibling once the ones before it failed (`SiblingRates`):
    A_d = 1 - (1 - a_d) * prod_{r=1}^{b_d - 1} (1 - beta_r)      (some child at depth d accepted)
    E   = 1 + sum_{d=1}^{k} prod_{j<=d} A_j                       (tokens per step, the bonus included)
and costs t_draft(k) + row_cost * (extra rows the draft decodes) + t_verify(1 + nodes), from the
same verify curve the chain uses (a tree of b rows verifies in about what a chain of b rows does;
measured: docs/performance.md). The tree is used only when its E per second beats the chain's by
TREE_MARGIN; a chain is the tree with one branch, so on a machine where rows cost (a CPU) the chain
stays, and where they are nearly free (a GPU, a network round trip) siblings are added.

Sibling acceptance is learned from every tree step's trials (`Step.sibling_trials`). Before it is
known (MIN_TRIALS trials of rank 1), every PROBE_EVERY decisions the tree that would be best if
siblings were always accepted is tried, if there is one: on a machine where rows cost (a CPU)
even that loses to the chain, so trees are never tried there.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from localspec.config import MAX_TREE_NODES, tree_leaves

RANKS = 4                  # siblings per node considered (ranks 0..3): more are seldom accepted
PRIOR_BETA = 0.25          # a further sibling's acceptance before any trial, worth PRIOR_WEIGHT trials:
PRIOR_WEIGHT = 2.0         # lower makes untried trees look worse, so probes decide sooner or later
DECAY = 0.98               # each trial discounts a rank's older ones (the text changes)
MIN_TRIALS = 12            # trials of rank 1 before the estimate alone decides (no more probes)
PROBE_EVERY = 48           # speculating steps between probes while rank 1 is under MIN_TRIALS:
                           # smaller learns sooner, costs more on a machine where trees lose
TREE_MARGIN = 0.03         # a tree must beat the chain's estimated rate by this share: estimates
                           # are noisy, and a wrong switch costs more than a missed small gain
RECHOOSE_EVERY = 8         # steps a decision is kept while the source stays the same: deciding
                           # fits a verify curve (~0.1-0.3 ms), a few % of a small model's step

# Shapes compared with the chain (then chains below their last entry).
CANDIDATES = ((2,), (3,), (4,), (1, 2), (2, 2), (3, 2), (4, 2), (1, 1, 2), (2, 1, 2), (1, 2, 2),
              (2, 2, 2), (8,))


def level_sizes(shape: Sequence[int], k: int) -> list[int]:
    """Nodes at depths 1..k of a full tree of this shape."""
    out, n = [], 1
    for d in range(k):
        n *= shape[d] if d < len(shape) else 1
        out.append(n)
    return out


class SiblingRates:
    """beta_r: acceptance of the sibling of rank r (r >= 1) given the ranks before it were rejected,
    as discounted counts with a prior."""

    def __init__(self) -> None:
        self._s = np.full(RANKS, PRIOR_BETA * PRIOR_WEIGHT)
        self._w = np.full(RANKS, PRIOR_WEIGHT)
        self.trials = np.zeros(RANKS, int)

    def observe(self, trials: Sequence[tuple[int, bool]]) -> None:
        for rank, ok in trials:
            if 1 <= rank < RANKS:
                self._s[rank] = DECAY * self._s[rank] + ok
                self._w[rank] = DECAY * self._w[rank] + 1.0
                self.trials[rank] += 1

    def beta(self) -> np.ndarray:
        """beta_1..beta_{RANKS-1}; beta[0] is unused (the first rank's is the chain's a_d). A later
        sibling is never rated above an earlier one (it is what is left after it): a rank seldom
        reached keeps no prior above what the ranks before it earned."""
        beta = self._s / self._w
        beta[1:] = np.minimum.accumulate(beta[1:])
        return beta

    def snapshot(self) -> list[float]:
        return [round(float(b), 3) for b in self.beta()[1:]]


def expected_tokens(first: Sequence[float], beta: np.ndarray, shape: Sequence[int], k: int) -> float:
    """E above: `first` = a_1..a_k, `beta` from SiblingRates.beta()."""
    reach, total = 1.0, 1.0
    for d in range(k):
        b = min(shape[d] if d < len(shape) else 1, RANKS)
        miss = 1.0 - first[d]
        for r in range(1, b):
            miss *= 1.0 - beta[r]
        reach *= 1.0 - miss
        total += reach
    return total


class TreeChooser:
    """Per source ("model", "lookup"): sibling rates, the last decision, probe spacing."""

    def __init__(self) -> None:
        self.rates = {"model": SiblingRates(), "lookup": SiblingRates()}
        self._since_probe = 0
        self._kept: tuple | None = None   # (source, width, shape or None, steps left)
        self.verify: dict[int, float] = {}   # seconds of a tree's verify by rows, measured here

    def kept(self, source: str, width: int) -> tuple[tuple[int, ...] | None] | None:
        """(the shape,) decided at a recent step with the same source and width, for
        RECHOOSE_EVERY steps (each call uses one; k may have moved by one or two meanwhile, which
        changes a tree's worth little); None when a decision is due."""
        kept = self._kept
        if kept and kept[:2] == (source, width) and kept[3] > 0:
            self._kept = (*kept[:3], kept[3] - 1)
            return (kept[2],)
        return None

    def observe_verify(self, rows: int, seconds: float) -> None:
        """A tree step's verify: kept here, apart from the chain's curve (under --tree auto)."""
        if np.isfinite(seconds) and seconds > 0:
            old = self.verify.get(rows)
            self.verify[rows] = seconds if old is None else 0.75 * old + 0.25 * seconds

    def observe(self, source: str, trials) -> None:
        if source in self.rates:
            self.rates[source].observe(trials)

    def choose(self, source: str, k: int, width: int, first: Sequence[float], draft_chain: float,
               row_cost: float, verify: np.ndarray) -> tuple[int, ...] | None:
        """The shape for a step of depth k (None: the chain). `first`: a_1..a_k; `draft_chain`:
        seconds to draft the chain (0 for lookup); `row_cost`: seconds per extra row a draft level
        decodes (0 for lookup); `verify[b - 1]`: seconds to verify b rows; `width`: the most
        branches the caches hold."""
        if source not in self.rates or k < 1 or width < 2:
            return None
        kept = self.kept(source, width)
        if kept is not None:
            return kept[0]
        verify = np.array(verify, dtype=float)
        for rows, seconds in self.verify.items():   # where a tree of that size was timed
            if rows <= len(verify):
                verify[rows - 1] = max(verify[rows - 1], seconds)
        rates = self.rates[source]
        self._since_probe += 1
        if rates.trials[1] < MIN_TRIALS and self._since_probe >= PROBE_EVERY:
            # A probe only where a tree could pay at all: with siblings that are always accepted.
            # On a machine where rows cost (a CPU) none can, and trees are never tried.
            self._since_probe = 0
            return self._best(k, width, first, draft_chain, row_cost, verify, np.ones(RANKS))
        shape = self._best(k, width, first, draft_chain, row_cost, verify, rates.beta())
        self._kept = (source, width, shape, RECHOOSE_EVERY)
        return shape

    @staticmethod
    def _best(k, width, first, draft_chain, row_cost, verify, beta) -> tuple[int, ...] | None:
        """The candidate shape whose estimated tokens per second beat the chain's by TREE_MARGIN
        the most, or None."""
        def rate(shape) -> float:
            sizes = level_sizes(shape, k)
            extra = sum(n - 1 for n in sizes[:-1])   # rows the draft decodes beyond the chain's
            seconds = draft_chain + row_cost * extra + verify[min(sum(sizes), len(verify) - 1)]
            return expected_tokens(first, beta, shape, k) / seconds

        best, shape = rate(()) * (1.0 + TREE_MARGIN), None
        for cand in CANDIDATES:
            if len(cand) > k or tree_leaves(cand) > width or sum(level_sizes(cand, k)) > MAX_TREE_NODES:
                continue
            r = rate(cand)
            if r > best:
                best, shape = r, cand
        return shape

    def estimates(self, shape: Sequence[int], first: np.ndarray, draft: np.ndarray, row_cost: float,
                  verify_curve) -> tuple[np.ndarray, np.ndarray]:
        """(expected tokens, seconds) for k = 0..len(first) of a fixed shape's trees (the draft
        model's sibling rates): what `KController.estimates` gives for chains. `draft[k]`: the
        chain's drafting seconds; `verify_curve(top)`: seconds to verify 1..top rows."""
        beta = self.rates["model"].beta()
        k_top = len(first)
        sizes = level_sizes(shape, k_top)
        nodes = np.concatenate(([0], np.cumsum(sizes)))
        verify = verify_curve(int(nodes[-1]) + 1)
        tokens = np.array([expected_tokens(first, beta, shape, k) for k in range(k_top + 1)])
        extra = np.concatenate(([0, 0], np.cumsum([n - 1 for n in sizes[:-1]])))[:k_top + 1]
        return tokens, draft + row_cost * extra + verify[nodes]

    def snapshot(self) -> dict:
        return {s: r.snapshot() for s, r in self.rates.items()}
