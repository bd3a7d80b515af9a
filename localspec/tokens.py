"""Rules on token sequences shared by every layer (no model needed): the common prefix of two
sequences, and whether a prompt fits the context."""

from __future__ import annotations

from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, by slice comparisons (C speed) and bisection."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def prompt_fits(n_prompt: int, n_ctx: int) -> bool:
    """The one prompt-fit rule of generate, chat and serve: a prompt fits when it leaves room in
    the context for at least one generated token (the last one is sampled, never evaluated)."""
    return n_prompt < n_ctx
