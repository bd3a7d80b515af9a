"""The reference for localspec.decoding.sampling: the straightforward full-vocabulary float64 implementation.

Masks over the whole row, full sorts, float64 throughout — what localspec did before its sampling
learned to cost what the support costs. It follows the same documented tie rule: every cut is a
threshold on the logit, and a token tied with the last one kept is kept too (top-k keeps every
token tied with the k-th; top-p keeps every token at least as likely as the one that brings the
mass to top_p).
"""

from __future__ import annotations

import numpy as np

from localspec.config import SamplingConfig


def softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def keep_mask(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Boolean mask of the tokens that survive top-k, top-p and min-p, per row ((rows, vocab))."""
    logits = np.asarray(logits, dtype=np.float32).astype(np.float64)
    rows, vocab = logits.shape
    keep = np.ones((rows, vocab), dtype=bool)
    if cfg.top_k and cfg.top_k < vocab:
        kth = np.sort(logits, axis=-1)[:, vocab - cfg.top_k][:, None]
        keep &= logits >= kth
    if cfg.top_p < 1.0 or cfg.min_p > 0.0:
        probs = softmax(np.where(keep, logits, -np.inf))
        if cfg.min_p > 0.0:
            keep &= probs >= cfg.min_p * probs.max(axis=-1, keepdims=True)
        if cfg.top_p < 1.0:
            order = np.argsort(-probs, axis=-1, kind="stable")
            sorted_p = np.take_along_axis(probs, order, axis=-1)
            before = np.cumsum(sorted_p, axis=-1) - sorted_p
            # The token that brings the mass to top_p is the last one the prefix needs; every token
            # at least as likely stays (ties included).
            last = (before < cfg.top_p).sum(axis=-1) - 1
            cut = np.take_along_axis(sorted_p, last[:, None], axis=-1)
            keep &= probs >= cut
    return keep


def probabilities(logits: np.ndarray, cfg: SamplingConfig, keep: np.ndarray | None = None) -> np.ndarray:
    """Dense float64 processed distribution per row ((rows, vocab) or (vocab,)). `keep`: the rows'
    `keep_mask`, when the caller has it already."""
    logits = np.asarray(logits, dtype=np.float32)
    squeeze = logits.ndim == 1
    logits = np.atleast_2d(logits)
    if cfg.greedy:
        out = np.zeros(logits.shape)
        out[np.arange(len(logits)), logits.argmax(axis=-1)] = 1.0
    else:
        keep = keep_mask(logits, cfg) if keep is None else np.atleast_2d(keep)
        x = logits.astype(np.float64)
        x = (x - x.max(axis=-1, keepdims=True)) / cfg.temperature
        out = softmax(np.where(keep, x, -np.inf))
    return out[0] if squeeze else out
