"""Turning a row of logits into the distribution that is sampled — identical for draft and target.

Order follows llama.cpp's default sampler chain: truncate (top-k, top-p, min-p) on the untempered
distribution, then apply the temperature to what survives.

Cost follows the support, not the vocabulary. A row is read once or twice in place, as the float32
llama.cpp wrote; what comes out is a `Sparse` distribution (ids + probabilities of the kept tokens)
whenever something truncates, and a `Dense` one (one float32 softmax, no sort) only when nothing
does. At 262k tokens a truncated row costs about as much as a few hundred kept tokens, not a
full-vocabulary float64 pass.

Tie rule, the same for every cut and for draft and target alike: each cut is a threshold on the
logit, and a token tied with the last one kept is kept too. Top-k keeps every token whose logit is
at least the k-th largest (more than k when the k-th is tied); top-p keeps every token at least as
likely as the one that brings the mass to top_p; min-p keeps logit >= max + ln(min_p). The kept set
depends on the values only, never on the order of ids.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from localspec.config import SamplingConfig
from .dists import _PY_MAX, Dense, Dist, Sparse
from .constrain import Grammar, constrain
from .processing import process

_NEAR = 8.0           # first look for top-k / nucleus candidates this far below the max logit
_TINY_T = 1e-20       # below this temperature float32 scaling overflows; the limit is the argmax


class BadLogits(ValueError):
    """A row of logits with NaN, or with no finite value: the model produced garbage. `model`
    names which one, filled in by whoever knows (the decoder, the draft model's drafter)."""

    model: str | None = None

    def __str__(self) -> str:
        message = super().__str__()
        return f"{self.model}: {message}" if self.model else message


def _max(row: np.ndarray) -> float:
    m = float(row.max())
    if not math.isfinite(m):
        raise BadLogits("the model returned NaN or no finite logits (corrupt weights or a broken backend?)")
    return m


def distribution(row: np.ndarray, cfg: SamplingConfig) -> Dist:
    """The processed next-token distribution of one float32 row of logits (read in place)."""
    row = np.asarray(row, dtype=np.float32)
    if cfg.greedy:
        return Sparse(np.array([int(row.argmax())]), np.ones(1))
    top_k = cfg.top_k if 0 < cfg.top_k < len(row) else 0
    total = None  # the mass top-p reads, relative to exp(max); None = the candidates' own
    if top_k:
        # top-p reads the mass of the whole top-k set, below min-p's floor too
        found = _top_k_sampled(row, top_k)
        if found is not None:
            ids, vals, m = found
        else:
            depth = _NEAR if cfg.top_p < 1.0 or cfg.min_p == 0.0 else min(_NEAR, -_log(cfg.min_p))
            ids, vals, m = _near(row, depth)
            if len(ids) < top_k and (cfg.top_p < 1.0 or depth < -_log(cfg.min_p)):
                ids, vals = _top_k_wide(row, m, top_k)
            elif len(ids) > top_k:
                ids, vals = _top_of(ids, vals, top_k)
    elif cfg.top_p < 1.0:
        ids, vals, m = _near(row, min(_NUCLEUS_DEPTHS[0], -_log(cfg.min_p)))
        ids, vals, total = _nucleus_candidates(row, m, cfg.top_p, m + _log(cfg.min_p), ids, vals)
    elif cfg.min_p > 0.0:
        ids, vals, m = _near(row, -_log(cfg.min_p))
    else:
        return _dense(row, _max(row), cfg.temperature)
    return _truncated(ids, vals, m, cfg, total)


_SAMPLE = 1024        # values read to place the top-k threshold: a strided sample of the row


def _top_k_sampled(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, float] | None:
    """(ids, logits, max) of every token whose logit is at least the k-th largest, found with one
    compare over the row: a threshold read off a strided sample, low enough that some 2k tokens
    pass it, so the k-th largest is among them (checked: at least k must pass). A flat row (a
    hot temperature, a random-weight model) holds a large part of the vocabulary within any fixed
    depth of its max; this costs the same on any row. None when too few passed (or the sample held
    a NaN): the caller's wider search decides."""
    n = len(row)
    stride = n // _SAMPLE
    if stride < 4 or 8 * k > n:
        return None
    sample = row[::stride]
    j = min(len(sample), 2 * k // stride + 4)
    t = np.partition(sample, len(sample) - j)[len(sample) - j]
    if t == -np.inf:
        # A masked row (a grammar's: -inf outside the allowed set) leaves the sample all -inf, and
        # every id would pass: keep the finite ones. The -inf tokens have no mass whatever top-k
        # keeps, so the distribution is the same, and fewer than k of them are all there is.
        ids = np.flatnonzero(row > t)
        if not len(ids):
            return None   # no finite logit: the wider search raises BadLogits
    else:
        ids = np.flatnonzero(row >= t)
        if len(ids) < k:
            return None
    vals = row[ids]
    ids, vals = _top_of(ids, vals, k)
    return ids, vals, _max(vals)


def _top_of(ids: np.ndarray, vals: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The candidates at least as large as the k-th largest of them (ties kept)."""
    if len(ids) <= k:
        return ids, vals
    kth = np.partition(vals, len(vals) - k)[len(vals) - k]
    keep = vals >= kth
    return ids[keep], vals[keep]


def _near(row: np.ndarray, depth: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(ids, logits, max) of every token whose logit is within `depth` of the row's max."""
    m = _max(row)
    ids = np.flatnonzero(row >= np.float32(m - depth))
    return ids, row[ids], m


def _log(min_p: float) -> float:
    return math.log(min_p) if min_p > 0.0 else -math.inf


def _truncated(ids: np.ndarray, vals: np.ndarray, m: float, cfg: SamplingConfig, total: float | None) -> Sparse:
    """What top-p and min-p keep of candidates that hold every token top-k keeps (or the nucleus),
    with the temperature applied to it. Only top-p needs an order, and only of the values: a
    (SIMD) sort of the candidates' logits finds its cut; the kept ids stay in candidate order."""
    if len(vals) <= _PY_MAX:
        return _truncated_small(ids, vals, m, cfg, total)
    x = vals.astype(np.float64) - m
    keep = x >= math.log(cfg.min_p) if cfg.min_p > 0.0 else None
    if cfg.top_p < 1.0:
        above = x >= _nucleus_cut(x, cfg.top_p, total)   # with the cut's ties
        keep = above if keep is None else keep & above
    if keep is not None:
        ids, x = ids[keep], x[keep]
    p = np.exp(x / cfg.temperature)  # float64: even t = 1e-38 leaves exp(0) = 1 at the top
    p /= p.sum()
    return Sparse(ids, p)


_SORT_MAX = 8192      # nuclei of more candidates find their cut by buckets of value, not a sort
_BUCKETS_PER_UNIT = 32


def _nucleus_cut(x: np.ndarray, top_p: float, total: float | None) -> float:
    """The smallest value top-p keeps of float64 logits `x` (relative to the max, so <= 0): in
    falling order, the last one whose mass before it is below top_p of the total (`total`, or
    their own). Up to _SORT_MAX candidates by one sort; more (a flat row's nucleus can hold most of
    a 128k vocabulary) by bucketing the values: the buckets' masses find the one bucket the cut
    falls in, and only that bucket is sorted."""
    if len(x) <= _SORT_MAX:
        mass = float(np.exp(x).sum()) if total is None else total
        return _cut_in(x, 0.0, top_p * mass)
    w = np.exp(x)
    limit = top_p * (float(w.sum()) if total is None else total)
    bucket = np.minimum(-x * _BUCKETS_PER_UNIT, 1 << 20).astype(np.int64)   # 0 holds the max
    mass = np.bincount(bucket, weights=w)
    before = np.cumsum(mass)
    before -= mass
    # The cut's bucket: the last non-empty one whose mass before it is below the limit.
    b = int(np.flatnonzero((before < limit) & (mass > 0))[-1])
    return _cut_in(x[bucket == b], float(before[b]), limit)


def _cut_in(x: np.ndarray, mass_before: float, limit: float) -> float:
    """Of values `x` that follow `mass_before` of mass in falling order: the last one whose mass
    before it is below `limit`."""
    desc = np.sort(x)[::-1]
    w = np.exp(desc)
    before = np.cumsum(w)
    before -= w
    before += mass_before
    return float(desc[max(int(np.searchsorted(before, limit, side="left")) - 1, 0)])


def _truncated_small(ids: np.ndarray, vals: np.ndarray, m: float, cfg: SamplingConfig,
                     total: float | None) -> Sparse:
    """`_truncated` for a few dozen candidates, in Python floats (the same float64 arithmetic):
    right after a decode each numpy call costs ~10 µs of cold caches, a list loop much less."""
    pairs = sorted(zip(vals.tolist(), ids.tolist()), reverse=True)
    x = [v - m for v, _ in pairs]   # descending, x[0] = 0
    n = len(x)
    if cfg.min_p > 0.0:
        floor = math.log(cfg.min_p)
        n = next((j for j, xj in enumerate(x) if xj < floor), n)
    w = None
    if cfg.top_p < 1.0:
        w = [math.exp(xj) for xj in x]
        limit = cfg.top_p * (math.fsum(w) if total is None else total)
        before, last = 0.0, 0
        for j, wj in enumerate(w):
            if before >= limit:
                break
            last = j
            before += wj
        cut = x[last]
        n = min(n, next((j for j in range(last + 1, len(x)) if x[j] < cut), len(x)))  # the cut's ties
    if cfg.temperature == 1.0 and w is not None:
        p = w[:n]
    else:
        t = cfg.temperature
        p = [math.exp(xj / t) for xj in x[:n]]
    z = math.fsum(p)
    return Sparse(np.array([i for _, i in pairs[:n]]), np.array([pj / z for pj in p]))


def _dense(row: np.ndarray, m: float, t: float) -> Dense:
    if t < _TINY_T:
        return Dense((row == np.float32(m)).astype(np.float32))
    w = np.subtract(row, np.float32(m))
    if t != 1.0:
        np.divide(w, np.float32(t), out=w)
    np.exp(w, out=w)
    return Dense(w)


def _top_k_wide(row: np.ndarray, m: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every token whose logit is at least the k-th largest, when fewer than k are near the max:
    widen the search, and partition the whole row only for a very peaked one."""
    near = 2 * _NEAR
    while near <= 8 * _NEAR:
        ids = np.flatnonzero(row >= np.float32(m - near))
        if len(ids) >= k:
            vals = row[ids]
            kth = np.partition(vals, len(vals) - k)[len(vals) - k]
            keep = vals >= kth
            return ids[keep], vals[keep]
        near *= 2
    finite = np.flatnonzero(row > -np.inf)
    if len(finite) <= k:   # a grammar's mask left k or fewer: all of them, no partition
        return finite, row[finite]
    kth = np.partition(row, len(row) - k)[len(row) - k]
    ids = np.flatnonzero(row >= kth)
    return ids, row[ids]


# How far below the max the nucleus search looks, in turn. Real rows at top-p 0.95 end their
# nucleus 5-9 units below it (Gemma-3-270M, T = 1): 10 units hold it nearly always, in a few
# thousand tokens (the count grows ~3x per 2 units); each further try is one more pass.
_NUCLEUS_DEPTHS = (10.0, 16.0, math.inf)


def _nucleus_candidates(row: np.ndarray, m: float, top_p: float, floor: float, ids: np.ndarray,
                        vals: np.ndarray):
    """Top-p over the whole vocabulary: one float32 exp pass for the mass, then the candidates near
    the max (`ids`, `vals`: those within the first depth), widened until they hold top_p of it.
    Returns (ids, logits, mass) where the ids hold the nucleus, or the min-p set when the
    nucleus reaches below min-p's floor; the mass is relative to exp(max)."""
    # Always relative to the max: a float32 exp(logit) underflows to 0 below about -103 (and loses
    # digits below -87), so a row whose max logit was near -110 kept 3 tokens instead of 1,276 at
    # top-p 0.9; above +88 it overflows.
    w = np.subtract(row, np.float32(m))
    np.exp(w, out=w)
    # float64 accumulation: a float32 sum's ~1e-7 error moves top-p 0.999 cuts by whole tokens
    total = float(w.sum(dtype=np.float64))
    need = top_p * total
    for i, near in enumerate(_NUCLEUS_DEPTHS):
        near = min(near, m - floor)
        if i:
            ids = np.flatnonzero(row >= np.float32(m - near)) if math.isfinite(near) else np.arange(len(row))
            vals = row[ids]
        mass = float(w[ids].sum(dtype=np.float64))
        if mass >= need or near >= m - floor:
            break
    return ids, vals, total


# -- blocks of rows ------------------------------------------------------------------------------


Seen = Callable[[int], Sequence[int]]
"""Row i -> the tokens the penalties see before it (`processing.window`)."""

States = Callable[[int], "Grammar"]
"""Row i -> the grammar state before it (`constrain.RowStates`)."""


class Rows:
    """The distributions of the rows of a logits block, each processed when first read.

    The acceptance rule stops at the first rejection, so rows after it are never processed.
    `seen`: with penalties or a logit bias (`SamplingConfig.processed`), what row i follows;
    `states`: under a grammar, row i's grammar state."""

    def __init__(self, logits: np.ndarray, cfg: SamplingConfig, seen: Seen | None = None,
                 states: States | None = None):
        self._logits = logits
        self._cfg = cfg
        self._seen = seen
        self._states = states
        self._done: dict[int, Dist] = {}

    def __getitem__(self, i: int) -> Dist:
        got = self._done.get(i)
        if got is None:
            row = processed(self._logits[i], self._cfg, self._seen, i, self._states)
            got = self._done[i] = distribution(row, self._cfg)
        return got

    def __len__(self) -> int:
        return len(self._logits)


def processed(row: np.ndarray, cfg: SamplingConfig, seen: Seen | None, i: int,
              states: States | None = None) -> np.ndarray:
    """Row i after the logit processing its history asks for, then its grammar's mask (the row
    itself when neither applies)."""
    if cfg.processed:
        row = process(row, seen(i) if seen is not None else (), cfg)
    if states is not None:
        row = constrain(row, cfg, states(i))
    return row


class Argmax:
    """Greedy counterpart of `Rows`: the argmax of each (processed) row, computed when first read."""

    def __init__(self, logits: np.ndarray, cfg: SamplingConfig | None = None, seen: Seen | None = None,
                 states: States | None = None):
        self._logits = logits
        self._cfg = cfg
        self._seen = seen
        self._states = states

    def __getitem__(self, i: int) -> int:
        row = self._logits[i] if self._cfg is None else processed(self._logits[i], self._cfg, self._seen, i,
                                                                  self._states)
        best = int(row.argmax())
        if not math.isfinite(float(row[best])):
            _max(row)  # raises BadLogits with the reason
        return best

    def __len__(self) -> int:
        return len(self._logits)


# -- dense helpers, for tests and analysis -------------------------------------------------------


def probabilities(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Dense float64 probabilities for each row of `logits` ((rows, vocab) or (vocab,)).

    For analysis and tests: the decoder works on `distribution`s and never makes these."""
    logits = np.asarray(logits, dtype=np.float32)
    if logits.ndim == 1:
        return distribution(logits, cfg).dense(len(logits))
    return np.stack([distribution(row, cfg).dense(logits.shape[1]) for row in logits])


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a dense probability vector (need not be exactly normalised)."""
    support = np.flatnonzero(probs)
    return Sparse(support, np.asarray(probs, dtype=np.float64)[support]).sample(rng)
