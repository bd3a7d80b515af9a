"""A grammar's mask on a row of logits, checking only the tokens sampling can reach.

The constrained distribution is the processed one computed on the row with every token the grammar
forbids set to -inf (llama.cpp's order when the grammar goes first: the mask, then top-k, top-p,
min-p and the temperature on what is left). Asking the grammar about all 49k-262k ids costs
3-15 ms a row at 49k (llama.cpp matches each token's text against the grammar's stacks), so where
sampling truncates, `constrain` asks only about the tokens it can reach: it walks the ids in
falling order of logit, in growing chunks, until the allowed ones found settle what is kept —
- greedy: the best allowed logit, with every allowed token tied with it;
- top-k: the k best allowed logits, with the k-th's ties;
- min-p without top-p: every allowed token within ln(min_p) of the best allowed one;
- top-p: its cut, once it is the same whatever mass the unasked tokens hold (at most their count
  times exp(the next unasked logit - the best allowed one)), and above every unasked token.
Every token below that point gets probability 0 whether the grammar allows it or not, so the row
returned (the allowed tokens found, every other -inf) gives exactly the distribution of the fully
masked row. Only sampling with no truncation at all keeps every allowed token: then every id is
asked (measured and reported, docs/performance.md).

`RowStates` gives each verify row its grammar state: the text's state advanced by the drafted
tokens on the row's path, forked lazily (a rejected branch's forks are dropped: that is the
rollback).
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

import numpy as np

from localspec.config import SamplingConfig

_FIRST_CHUNK = 64   # ids asked about first; each further chunk is twice the last
_DEPTHS = (4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, math.inf)   # bands below the max, sorted in turn


class Grammar(Protocol):
    """A grammar state (engine.grammar.Grammar)."""

    n_vocab: int

    def allowed(self, ids) -> np.ndarray: ...
    def accept(self, token: int) -> None: ...
    def fork(self) -> "Grammar": ...


class NothingAllowed(ValueError):
    """The grammar allows no token the model gives a finite logit: it cannot go on."""


def full_mask(cfg: SamplingConfig) -> bool:
    """Whether sampling under `cfg` keeps every allowed token (nothing truncates), so every id
    must be asked."""
    return not cfg.greedy and cfg.top_k <= 0 and cfg.top_p >= 1.0 and cfg.min_p <= 0.0


def constrain(row: np.ndarray, cfg: SamplingConfig, grammar: Grammar) -> np.ndarray:
    """A float32 row whose distribution under `cfg` is that of `row` masked by `grammar`."""
    row = np.asarray(row, dtype=np.float32)
    n = min(len(row), grammar.n_vocab)
    out = np.full(len(row), -np.inf, dtype=np.float32)
    if full_mask(cfg):
        ids = np.flatnonzero(grammar.allowed(np.arange(n)))
        if not ids.size or not np.isfinite(row[ids]).any():
            raise NothingAllowed("the grammar allows no token here")
    else:
        ids = _walk(row[:n], cfg, grammar)
    out[ids] = row[ids]
    return out


_SLACK = 1e-6   # relative: the float arithmetic of sampling's own top-p sum, with room to spare


def _settled(kept: list[float], nxt: float, rest: int, cfg: SamplingConfig) -> bool:
    """Whether the allowed logits found (falling) already decide what sampling keeps, when at
    most `rest` ids are left unasked, each with a logit below `nxt`."""
    if not kept or nxt >= kept[0]:
        return False
    if cfg.greedy:
        return True
    if cfg.top_k > 0 and len(kept) >= cfg.top_k and nxt < kept[cfg.top_k - 1]:
        return True    # the top-k set is found; top-p and min-p read only it
    if cfg.top_p >= 1.0:
        # min-p alone cuts below its floor (with fewer than k found, top-k keeps every one)
        return cfg.min_p > 0.0 and nxt < kept[0] + math.log(cfg.min_p)
    # Top-p reads the mass of all the allowed tokens it could keep, the unasked ones too: at most
    # rest * exp(nxt - best). Settled when its cut is the same whatever that mass is, and falls
    # above nxt (so every token it keeps, with the cut's ties, has been asked).
    # (Fewer than top_k found: top-k may keep any number of the unasked, every one tied with its
    # k-th value, so all `rest` count; capping them at top_k - found kept 4 tokens of a true 435.)
    x = np.asarray(kept, dtype=np.float64) - kept[0]
    w = np.exp(x)
    before = np.cumsum(w) - w
    mass = float(before[-1] + w[-1])
    lo = int(np.searchsorted(before, cfg.top_p * mass * (1 - _SLACK), side="left"))
    if cfg.min_p > 0.0 and nxt < kept[0] + math.log(cfg.min_p):
        # Min-p cuts after top-p: when top-p keeps every token above min-p's floor even at the
        # least mass (more unasked mass only moves its cut down), min-p alone decides.
        above = int(np.count_nonzero(x >= math.log(cfg.min_p)))
        if lo - 1 >= above - 1:
            return True
    unasked = rest * math.exp(nxt - kept[0]) if math.isfinite(nxt) else 0.0
    hi = int(np.searchsorted(before, cfg.top_p * (mass + unasked) * (1 + _SLACK), side="left"))
    last = max(hi - 1, 0)
    return lo == hi and last < len(kept) - 1 and kept[last] > nxt


def _walk(row: np.ndarray, cfg: SamplingConfig, grammar: Grammar) -> np.ndarray:
    """The ids of the allowed tokens met walking the row in falling order until settled."""
    m = float(row.max())
    if not math.isfinite(m):
        raise NothingAllowed("the row has no finite logit")
    got: list[np.ndarray] = []
    kept: list[float] = []     # allowed logits found, falling
    asked = 0
    chunk = _FIRST_CHUNK
    upper = math.inf           # the band below the previous depth
    for depth in _DEPTHS:
        floor = m - depth
        below = row < np.float32(upper)
        band = np.flatnonzero((row >= np.float32(floor)) & below if math.isfinite(floor) else below)
        upper = floor
        if not band.size:
            continue
        band = band[np.argsort(-row[band], kind="stable")]
        vals = row[band]
        at = 0
        while at < len(band):
            ids = band[at:at + chunk]
            ok = grammar.allowed(ids)
            got.append(ids[ok])
            kept.extend(vals[at:at + chunk][ok].tolist())
            at += len(ids)
            asked += len(ids)
            chunk *= 2
            nxt = float(vals[at]) if at < len(band) else floor
            if _settled(kept, nxt, len(row) - asked, cfg):
                return np.concatenate(got)
    if not kept or not math.isfinite(kept[0]):
        raise NothingAllowed("the grammar allows no token here")
    return np.concatenate(got)


class RowStates:
    """The grammar state before each row of a verify batch: row 0 follows the text (`root`), row
    j > 0 follows row parents[j]'s state advanced by tokens[j]. A chain is tokens = [last, *drafted]
    with parents = [-1, 0, 1, ...]; a tree batch gives its own. Built when first asked, so only
    the rows the rule reads (accepted paths) cost a fork. The row after an end-of-generation token
    (read for the rule's bonus, never emitted: generation ends there) keeps its parent's state."""

    def __init__(self, root: Grammar, tokens: Sequence[int], parents: Sequence[int] | None = None,
                 is_eog=lambda t: False):
        self._tokens = tokens
        self._parents = parents
        self._is_eog = is_eog
        self._states: dict[int, Grammar] = {0: root}

    def __call__(self, j: int) -> Grammar:
        got = self._states.get(j)
        if got is None:
            parent = self._parents[j] if self._parents is not None else j - 1
            if self._is_eog(self._tokens[j]):
                got = self(parent)
            else:
                got = self(parent).fork()
                got.accept(self._tokens[j])
            self._states[j] = got
        return got

    def allows(self, j: int) -> bool:
        """Whether row j's token (tokens[j]) is allowed after its parent's state."""
        parent = self._parents[j] if self._parents is not None else j - 1
        return bool(self(parent).allowed([self._tokens[j]])[0])
