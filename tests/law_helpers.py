"""What the law tests share: the chi-square check, and the wrong acceptance rules whose failing
proves that a check has teeth.

The wrong rules take what `localspec.decoding.acceptance.accept_sampled` takes (draft tokens, the target's
`Dist`s, the draft's `Dist`s or None), so the same rule can be patched into the real decoder
(test_exact_e2e) or run by the acceptance harness (test_acceptance).

Statistic: Pearson chi-square, with its critical value at alpha = 1e-4 from the Wilson-Hilferty
approximation (scipy is not installed), which is slightly conservative (too large) for small df.
Cells with expected count < 5 are pooled so the chi-square approximation holds; cells with
probability exactly 0 are not tested statistically but must have count exactly 0 (one forbidden
token is a failure however rare).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

ALPHA = 1e-4


def chi2_critical(df: int, alpha: float = ALPHA) -> float:
    """Upper-alpha critical value of chi-square(df), Wilson-Hilferty approximation."""
    z = statistics.NormalDist().inv_cdf(1.0 - alpha)
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


@dataclass
class Check:
    ok: bool
    stat: float
    crit: float
    df: int
    forbidden: int  # draws that landed on probability-0 cells

    def __str__(self) -> str:
        return (
            f"chi2={self.stat:.1f} crit={self.crit:.1f} (df={self.df}, alpha={ALPHA}) "
            f"forbidden={self.forbidden}"
        )


def chi2_check(counts: np.ndarray, probs: np.ndarray) -> Check:
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = counts.sum()
    zero = probs == 0.0
    forbidden = int(counts[zero].sum())
    c, e = counts[~zero], n * probs[~zero] / probs[~zero].sum()
    small = e < 5.0
    if small.any():
        pooled_c, pooled_e = c[small].sum(), e[small].sum()
        c, e = c[~small], e[~small]
        if pooled_e >= 5.0 or len(c) == 0:
            c, e = np.append(c, pooled_c), np.append(e, pooled_e)
        else:  # fold a too-small pool into the largest cell
            j = int(np.argmax(e))
            c[j] += pooled_c
            e[j] += pooled_e
    df = len(c) - 1
    if df == 0:  # a single allowed cell: only the forbidden cells can fail
        return Check(forbidden == 0, 0.0, 0.0, 0, forbidden)
    stat = float(((c - e) ** 2 / e).sum())
    crit = chi2_critical(df)
    return Check(forbidden == 0 and stat <= crit, stat, crit, df, forbidden)


# -- wrong rules --------------------------------------------------------------------------------


def always_accept(draft, p, q, rng):
    """Accept every draft token, then the bonus token from p_{k+1}."""
    k = len(draft)
    return k, p[k].sample(rng)


def residual_is_p(draft, p, q, rng):
    """The right acceptance test, but a rejection resamples from p, not from max(0, p - q)."""
    for i, x in enumerate(draft):
        q_i = q[i] if q is not None else None
        p_x, q_x = p[i].prob(x), (q_i.prob(x) if q_i is not None else 1.0)
        if p_x > 0.0 and (p_x >= q_x or rng.random() * q_x < p_x):
            continue
        return i, p[i].sample(rng)
    return len(draft), p[len(draft)].sample(rng)
