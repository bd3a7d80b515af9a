"""Turning logits into the distribution that is sampled — identical for draft and target.

Order follows llama.cpp's default sampler chain: truncate (top-k, top-p, min-p) on the untempered
distribution, then apply the temperature to what survives. Rows are processed together so a whole
verification block costs a handful of numpy calls, not a Python loop over the vocabulary.
"""

from __future__ import annotations

import numpy as np

from .config import SamplingConfig


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (probabilities are compared and divided by the acceptance rule)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def _keep_mask(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Boolean mask of the tokens that survive top-k, top-p and min-p, per row."""
    rows, vocab = logits.shape
    keep = np.ones((rows, vocab), dtype=bool)
    if cfg.top_k and cfg.top_k < vocab:
        kth = np.partition(logits, vocab - cfg.top_k, axis=-1)[:, vocab - cfg.top_k][:, None]
        keep &= logits >= kth
    if cfg.top_p < 1.0 or cfg.min_p > 0.0:
        probs = softmax(np.where(keep, logits, -np.inf))
        if cfg.min_p > 0.0:
            keep &= probs >= cfg.min_p * probs.max(axis=-1, keepdims=True)
        if cfg.top_p < 1.0:
            order = np.argsort(-probs, axis=-1, kind="stable")
            sorted_p = np.take_along_axis(probs, order, axis=-1)
            before = np.cumsum(sorted_p, axis=-1) - sorted_p
            # A token stays while the mass strictly before it is below top_p, so the top one always does.
            in_nucleus = np.zeros_like(keep)
            np.put_along_axis(in_nucleus, order, before < cfg.top_p, axis=-1)
            keep &= in_nucleus
    return keep


def probabilities(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """The processed next-token distribution for each row of `logits` (shape (rows, vocab) or (vocab,)).

    For greedy configs this is the one-hot argmax, which keeps the acceptance rule uniform.
    """
    logits = np.asarray(logits, dtype=np.float32)
    squeeze = logits.ndim == 1
    if squeeze:
        logits = logits[None, :]
    if cfg.greedy:
        out = np.zeros(logits.shape, dtype=np.float64)
        out[np.arange(len(logits)), logits.argmax(axis=-1)] = 1.0
    else:
        rows, vocab = logits.shape
        if cfg.top_k and cfg.top_k < vocab and cfg.top_k <= 1024:
            # Work on the top-k columns only: everything else gets probability 0 anyway.
            idx = np.stack([_top_k_ids(row, cfg.top_k) for row in logits])
            sub = np.take_along_axis(logits, idx, axis=-1)
            small = _processed(sub, SamplingConfig(cfg.temperature, 0, cfg.top_p, cfg.min_p))
            out = np.zeros((rows, vocab), dtype=np.float64)
            np.put_along_axis(out, idx, small, axis=-1)
        else:
            out = _processed(logits, cfg)
    return out[0] if squeeze else out


# Real logit rows have their top 40 within a few units of the maximum; looking there first turns a
# full-vocabulary partition (~0.4 ms at 49k) into a compare and a partition of a few hundred.
_TOP_K_MARGIN = 8.0


def _top_k_ids(row: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries (as argpartition would give), found among the entries near
    the maximum whenever at least k of them are there — then the top k are certainly among them."""
    near = np.flatnonzero(row >= row.max() - _TOP_K_MARGIN)
    if len(near) < k:
        return np.argpartition(row, len(row) - k)[len(row) - k :]
    return near[np.argpartition(row[near], len(near) - k)[len(near) - k :]]


def _processed(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    keep = _keep_mask(logits, cfg)
    # Shift by the row max before dividing: a tiny temperature must not overflow to inf - inf.
    # The top token always survives truncation, so the shift keeps one finite 0.
    x = logits.astype(np.float64)
    x = (x - x.max(axis=-1, keepdims=True)) / cfg.temperature
    return softmax(np.where(keep, x, -np.inf))


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a probability vector (need not be exactly normalised)."""
    support = np.flatnonzero(probs)  # usually a few dozen of ~50k entries
    cdf = np.cumsum(probs[support])
    u = rng.random() * cdf[-1]
    return int(support[min(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)])
