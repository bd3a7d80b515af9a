"""Next-token distributions as the sampler makes them and the acceptance rule reads them.

`Sparse`: ids + float64 weights of the kept tokens (whatever truncates). `Dense`: float32 weights
over the whole vocabulary with their block sums (untruncated sampling only). Both answer p(x),
draw a token, and build the residual max(0, p - q) over their own support.
"""

from __future__ import annotations

import math

import numpy as np

BLOCK = 1024          # dense rows are summed in blocks: Z, and two short cumsums to sample
_PY_MAX = 48          # sets up to this size are handled in plain Python: right after a decode each
                      # numpy call costs ~10 µs of cold caches, a short list loop much less


class Sparse:
    """A distribution over a few token ids: weights (normalised for processed rows, unnormalised
    for residuals) in float64, every weight > 0 except in residuals."""

    __slots__ = ("ids", "weights", "_total", "_order", "_lists")

    def __init__(self, ids: np.ndarray, weights: np.ndarray):
        self.ids = ids
        self.weights = weights
        self._total: float | None = None
        self._order: np.ndarray | None = None
        self._lists: tuple[list, list] | None = None

    @property
    def total(self) -> float:
        if self._total is None:
            self._total = float(self.weights.sum())
        return self._total

    def _as_lists(self) -> tuple[list, list]:
        if self._lists is None:
            self._lists = (self.ids.tolist(), self.weights.tolist())
        return self._lists

    def prob(self, x: int) -> float:
        if len(self.ids) <= _PY_MAX:  # a list scan beats two numpy calls on a few dozen ids
            ids, weights = self._as_lists()
            return weights[ids.index(x)] / self.total if x in ids else 0.0
        hit = np.flatnonzero(self.ids == x)
        return float(self.weights[hit[0]]) / self.total if len(hit) else 0.0

    def probs_at(self, ids: np.ndarray) -> np.ndarray:
        if self._order is None:
            self._order = np.argsort(self.ids)
        sorted_ids = self.ids[self._order]
        j = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
        found = sorted_ids[j] == ids
        return np.where(found, self.weights[self._order[j]], 0.0) / self.total

    def sample(self, rng: np.random.Generator) -> int:
        if len(self.ids) <= _PY_MAX:
            ids, weights = self._as_lists()
            u = rng.random() * math.fsum(weights)
            acc = 0.0
            for i, w in zip(ids, weights):
                acc += w
                if u < acc:
                    return i
            return ids[max(j for j, w in enumerate(weights) if w > 0)]  # u rounded onto the end
        cdf = np.cumsum(self.weights)
        u = rng.random() * cdf[-1]
        j = int(np.searchsorted(cdf, u, side="right"))
        if j >= len(cdf):  # u rounded onto the end: the last token with weight
            j = int(np.flatnonzero(self.weights)[-1])
        return int(self.ids[j])

    def minus(self, q: "Dist") -> "Sparse":
        """max(0, p - q), unnormalised: its support is inside p's."""
        r = self.weights / self.total - q.probs_at(self.ids)
        np.maximum(r, 0.0, out=r)
        return Sparse(self.ids, r)

    def without(self, x: int) -> "Sparse":
        r = self.weights.copy()
        r[self.ids == x] = 0.0
        return Sparse(self.ids, r)

    def dense(self, vocab: int) -> np.ndarray:
        out = np.zeros(vocab)
        ok = self.ids < vocab
        out[self.ids[ok]] = self.weights[ok] / self.total
        return out

    def __len__(self) -> int:
        return len(self.ids)


class Dense:
    """A distribution over the whole vocabulary: float32 weights and their float64 block sums.

    Kept unnormalised (p(x) = weights[x] / total) so making one costs a subtract, an exp and a
    blocked sum; drawing costs a cumsum over the block sums and one over a block."""

    __slots__ = ("weights", "blocks", "total")

    def __init__(self, weights: np.ndarray, blocks: np.ndarray | None = None):
        self.weights = weights
        self.blocks = _block_sums(weights) if blocks is None else blocks
        self.total = float(self.blocks.sum())

    def prob(self, x: int) -> float:
        return float(self.weights[x]) / self.total if 0 <= x < len(self.weights) else 0.0

    def probs_at(self, ids: np.ndarray) -> np.ndarray:
        ok = ids < len(self.weights)
        return np.where(ok, self.weights[np.where(ok, ids, 0)], 0.0) / self.total

    def sample(self, rng: np.random.Generator) -> int:
        u = rng.random() * self.total
        cum = np.cumsum(self.blocks)
        b = int(np.searchsorted(cum, u, side="right"))
        if b >= len(cum):
            b = int(np.flatnonzero(self.blocks)[-1])
            u = cum[-1]
        u -= cum[b - 1] if b else 0.0
        block = self.weights[b * BLOCK:(b + 1) * BLOCK]
        local = np.cumsum(block, dtype=np.float64)
        j = int(np.searchsorted(local, u, side="right"))
        if j >= len(local):  # rounding between the block sum and its cumsum
            j = int(np.flatnonzero(block)[-1])
        return b * BLOCK + j

    def minus(self, q: "Dist") -> "Dense":
        r = self.weights * np.float32(1.0 / self.total)
        if isinstance(q, Dense):
            n = min(len(r), len(q.weights))
            r[:n] -= q.weights[:n] * np.float32(1.0 / q.total)
        else:
            ok = q.ids < len(r)
            r[q.ids[ok]] -= (q.weights[ok] / q.total).astype(np.float32)
        np.maximum(r, 0.0, out=r)
        return Dense(r)

    def without(self, x: int) -> "Dense":
        r = self.weights.copy()
        blocks = self.blocks.copy()
        if 0 <= x < len(r):
            r[x] = 0.0
            # Summed afresh, not by subtraction: where x dominated its block, the block's float32
            # sum had lost the others' mass (-6.8 % of a block in a constructed row).
            b = x // BLOCK
            blocks[b] = float(r[b * BLOCK:(b + 1) * BLOCK].sum(dtype=np.float64))
        return Dense(r, blocks)

    def dense(self, vocab: int) -> np.ndarray:
        out = np.zeros(vocab)
        n = min(vocab, len(self.weights))
        out[:n] = self.weights[:n]
        out /= out.sum()  # float64 over the float32 weights (`total` sums them in float32 blocks)
        return out

    def __len__(self) -> int:
        return len(self.weights)


Dist = Sparse | Dense


def _block_sums(w: np.ndarray) -> np.ndarray:
    n = len(w) // BLOCK * BLOCK
    sums = w[:n].reshape(-1, BLOCK).sum(axis=1).astype(np.float64)
    if n < len(w):
        sums = np.append(sums, float(w[n:].sum(dtype=np.float64)))
    return sums
