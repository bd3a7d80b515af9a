"""Acceptance (α) of the draft model's tokens, learned from each verified draft.

Discounted Beta counts overall and per draft position: an EWMA whose start-up bias is replaced by a
prior. A position's rate is conditional on the earlier ones being accepted, and is shrunk toward
the overall rate where its data are thin. A two-sided CUSUM notices a change of text (acceptance
collapsing or recovering) long before the EWMA memory would, and then keeps only FORGET of the old
evidence. `expected_tokens` is the textbook E(k) for one rate.
"""

from __future__ import annotations

import numpy as np

ALPHA_PRIOR = 0.7          # acceptance before any data, typical for a same-family draft: higher
                           # tries longer drafts before the first trials
ALPHA_PRIOR_WEIGHT = 2.0   # the prior is worth this many trials: larger keeps early steps near the
                           # prior, smaller lets the first few trials swing the estimate
ALPHA_DECAY = 0.98         # per accept/reject trial (remembers ~50 trials): larger is a steadier
                           # estimate, slower to follow a change of text
POSITION_DECAY = 0.97      # per observation of that position (~33): the same trade per position
POSITION_SHRINK = 3.0      # pseudo-trials of the overall rate mixed into each position's rate:
                           # larger trusts the overall rate over a position's few trials
CHANGE_DROP = 7.0          # CUSUM thresholds (log-likelihood ratios) for "the text changed": lower
CHANGE_RISE = 5.0          # notices sooner but a false drop alarm stalls good speculation, a false
                           # rise costs a probe
FORGET = 0.15              # on an alarm old trials keep this weight: larger keeps more of what was
                           # right before, smaller learns the new text from fewer trials
WARM_ALPHA_WEIGHT = 16.0   # a warm start's alpha is worth this many trials (a third of the EWMA
                           # memory): larger trusts the record longer against today's text
WARM_POSITION_WEIGHT = 3.0  # ...and its rate at each draft position this many (the same trade)

_FULL_POSITION = 1 / (1 - POSITION_DECAY) + POSITION_SHRINK   # weights of a saturated EWMA
_FULL_ALPHA = 1 / (1 - ALPHA_DECAY)


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per step with k drafts and per-token acceptance alpha (bonus included)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _cusum(total: float, hits: np.ndarray, p: np.ndarray, q: np.ndarray) -> float:
    """CUSUM recursion over Bernoulli trials: evidence for rate q against rate p."""
    for x in np.where(hits, np.log(q / p), np.log((1 - q) / (1 - p))).tolist():
        total = max(0.0, total + x)
    return total


class Acceptance:
    """Acceptance rates overall and at draft positions 1..k_max (s = weighted hits, w = weighted
    trials), and the change detection that resets them."""

    def __init__(self, k_max: int) -> None:
        self.k_max = k_max
        self.trials = 0
        self.reset()

    def reset(self) -> None:
        """Back to the prior (a warm start's record refuted): the trials counted stay counted."""
        self._cache: dict[tuple, np.ndarray] = {}   # rates and tokens by (what, n, optimism): see `rates`
        self._s, self._w = ALPHA_PRIOR * ALPHA_PRIOR_WEIGHT, ALPHA_PRIOR_WEIGHT
        self._pos_s, self._pos_w = np.zeros(self.k_max), np.zeros(self.k_max)
        self._cusum_low = self._cusum_high = 0.0   # change detection, see _detect_change

    @property
    def alpha(self) -> float | None:
        """EWMA acceptance rate (prior-smoothed), None before any drafted token was verified."""
        return self._s / self._w if self.trials else None

    def by_position(self) -> list[float | None]:
        """EWMA acceptance at positions 1..k_max given the earlier ones were accepted."""
        return [float(s / w) if w > 0 else None for s, w in zip(self._pos_s, self._pos_w)]

    def rates(self, n: int, optimism: float = 0.0) -> np.ndarray:
        """Acceptance at positions 1..n, each shrunk toward the overall rate where data are thin;
        optimism adds that many standard errors beyond those of a full EWMA memory. Kept (read
        only) until the next trial: between drafts, plain steps decide again and again from the
        same rates, and remaking them cost ~0.1 ms a decision cache-cold beside a GPU-class pass."""
        key = ("rates", n, optimism)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._rates(n, optimism)
            got.setflags(write=False)
        return got

    def tokens(self, n: int, optimism: float = 0.0) -> np.ndarray:
        """Expected tokens of a step drafting k = 0..n tokens (the target's own included), from
        `rates`; kept as they are."""
        key = ("tokens", n, optimism)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = 1.0 + np.concatenate(([0.0], np.cumsum(np.cumprod(self.rates(n, optimism)))))
            got.setflags(write=False)
        return got

    def _rates(self, n: int, optimism: float) -> np.ndarray:
        alpha = self._s / self._w
        weight = np.append(self._pos_w + POSITION_SHRINK, self._w)
        rates = np.append((self._pos_s + POSITION_SHRINK * alpha) / weight[:-1], alpha)
        if optimism:
            full = np.append(np.full(self.k_max, _FULL_POSITION), _FULL_ALPHA)
            excess = np.maximum(1 / np.sqrt(weight) - 1 / np.sqrt(full), 0.0)
            rates = np.minimum(rates + optimism * np.sqrt(rates * (1 - rates)) * excess, 1.0)
        return np.concatenate((rates[:n], np.full(max(0, n - self.k_max), rates[-1])))

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """Trials: positions 1..n_accepted accepted, then one rejection unless all were accepted;
        later positions were never tested (acceptance there is conditional on reaching them)."""
        hits = np.arange(min(n_accepted + 1, n_drafted)) < n_accepted
        self._detect_change(hits)
        self._cache.clear()
        for i, hit in enumerate(hits.tolist()):
            self._s = ALPHA_DECAY * self._s + hit
            self._w = ALPHA_DECAY * self._w + 1.0
            if i < self.k_max:
                self._pos_s[i] = POSITION_DECAY * self._pos_s[i] + hit
                self._pos_w[i] = POSITION_DECAY * self._pos_w[i] + 1.0
        self.trials += len(hits)

    def _detect_change(self, hits: np.ndarray) -> None:
        """Two-sided CUSUM on the trials; on an alarm, old trials lose most of their weight.

        The long memory that keeps k steady would take dozens of steps to notice a change of
        text: k = 10 drafts failing at position 1 after acceptance collapses, or rare probes
        against a long low-acceptance history. Each side sums the log-likelihood ratio of
        "acceptance halved" (p/2) or "rejection halved" ((1+p)/2) against the estimate p."""
        p = np.clip(self.rates(len(hits)), 0.01, 0.99)
        low = np.minimum(p, 0.95)    # one rejection where p ~ 1 is no collapse yet
        self._cusum_low = _cusum(self._cusum_low, hits, low, low / 2)
        self._cusum_high = _cusum(self._cusum_high, hits, p, (1 + p) / 2)
        if self._cusum_low >= CHANGE_DROP or self._cusum_high >= CHANGE_RISE:
            self._s, self._w = FORGET * self._s, FORGET * self._w
            self._pos_s *= FORGET
            self._pos_w *= FORGET
            self._cusum_low = self._cusum_high = 0.0

    def warm_start(self, alpha: float, by_position: dict[int, float], weight: float = 1.0) -> None:
        """A record's rates (already checked usable) as a few pseudo-trials: position i -> rate;
        `weight` (0..1) scales what the record is worth, down to one trial."""
        self._cache.clear()
        w_all, w_pos = max(WARM_ALPHA_WEIGHT * weight, 1.0), max(WARM_POSITION_WEIGHT * weight, 1.0)
        self._s, self._w = alpha * w_all, w_all
        for i, rate in by_position.items():
            self._pos_s[i], self._pos_w[i] = rate * w_pos, w_pos
