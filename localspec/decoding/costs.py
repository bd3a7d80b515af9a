"""The cost of one decode of the draft model as a function of how many tokens it reads, and how a
warm start's recorded costs give way to today's timings (`replace_recorded`).

After prompt-lookup steps the draft model is behind the text by what lookup got accepted, and its
next proposal must first read those tokens. On a GPU that costs about one decode whatever the
count; on a CPU it grows with it. `BatchCost` learns the line a + c·n from the draft's first
decodes, so that choosing the draft model after lookup steps is charged what catching up costs.
"""

from __future__ import annotations

import numpy as np

WEIGHT = 0.25        # of a new timing in a size's EWMA
PRIOR_SLOPE = 0.1    # per extra token, as a share of a one-token decode, until two sizes are timed
MAX_SIZE = 512


class BatchCost:
    def __init__(self) -> None:
        self._by_n: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._line: tuple[float, float] | None = None

    def observe(self, n: int, seconds: float) -> None:
        if not (1 <= n <= MAX_SIZE and np.isfinite(seconds) and seconds > 0):
            return
        old = self._by_n.get(n)
        self._by_n[n] = seconds if old is None else (1 - WEIGHT) * old + WEIGHT * min(seconds, 2 * old)
        self._count[n] = self._count.get(n, 0) + 1
        self._line = None

    def predict(self, n: int) -> float | None:
        """Seconds for a decode of n tokens; None before any timing."""
        if not self._by_n:
            return None
        if self._line is None:
            ns = np.array(sorted(self._by_n), dtype=float)
            ts = np.array([self._by_n[int(x)] for x in ns])
            if len(ns) == 1:
                base = ts[0] / (1 + PRIOR_SLOPE * (ns[0] - 1))
                self._line = (base * (1 - PRIOR_SLOPE), base * PRIOR_SLOPE)
            else:
                w = np.sqrt(np.minimum([self._count[int(x)] for x in ns], 16))
                slope, base = np.polyfit(ns, ts, 1, w=w)
                slope = max(float(slope), 0.0)
                base = max(float(base), 0.0) if slope > 0 else float(np.average(ts, weights=w))
                self._line = (base, slope)
        base, slope = self._line
        return base + slope * n

    def extra(self, n, usual: int = 2):
        """What reading n tokens (an int or an array of them) costs beyond the usual in-step first
        decode (≈ `usual` tokens): the line's slope times the tokens past `usual`."""
        if self.predict(usual) is None:
            return np.zeros(np.shape(n)) if np.ndim(n) else 0.0
        extra = self._line[1] * np.maximum(np.asarray(n, dtype=float) - usual, 0.0)
        return extra if np.ndim(n) else float(extra)

    def snapshot(self) -> dict:
        return {str(n): t for n, t in sorted(self._by_n.items())}


def replace_recorded(costs: dict[int, float], key: int, timed: float, others: set[int]) -> float:
    """A warm start's cost gives way to the first timing made here, and the machine's speed now
    (it drifts between runs) rescales the recorded costs not timed yet: the record keeps its
    shape, this run sets its level. Returns the factor applied.

    The factor is not bounded. A record written while other work held the cores can be 10× or 50×
    too slow (seen: verify 910 ms against 17 ms today); a bounded factor (it was [0.5, 2]) left
    the sizes not re-timed yet 5× too dear, the controller plain, and those sizes unvisited until
    the controller's WARM_TRUST forgot them. The trade: one outlying first timing (a cold cache, a
    pause) moves the whole record by as much. That leaves the choice of k alone while every cost
    is the record's (tokens per second are compared, and a common factor cancels); the faster
    second timing that replaces a cold first one moves the record back with it
    (KController.observe_verify); and each other size's first timing sets the level again. What
    stays is a spiked t_verify(1) beside re-timed drafting sizes until the next plain step
    (REFRESH_PLAIN steps at most): the same as after a cold start's first timing."""
    old = costs[key]
    ratio = timed / old if old > 0 else 1.0
    for other in others:
        costs[other] *= ratio
    costs[key] = timed
    return ratio
