"""While plain decoding wins: when to speculate anyway (a probe), so that a change is noticed.

A probe lasts seconds(k) / seconds(0) plain steps and yields tokens(k): it loses the difference,
so probes spaced loss / PROBE_OVERHEAD apart cost ~0.5%: frequent near break-even, where the
decision is least sure, rare in a hopeless stretch. The estimate is optimistic while it rests on
few trials (start, after an alarm). Each probe in a row fully accepted against the estimate's odds
halves the interval and makes the next probe one longer: the estimate lags a change, the streak
does not. When drafting costs so much that even full acceptance would lose, no change of text can
help: probes become very rare.
"""

from __future__ import annotations

import numpy as np

PROBE_K = 2                # a probe drafts at least this many tokens: more evidence per probe,
                           # a dearer probe when acceptance is really low
PROBE_OVERHEAD = 0.005     # probes are spaced so their expected loss is ~0.5% of plain throughput:
                           # larger notices a change of text sooner, costs more while plain wins
PROBE_OPTIMISM = 2.0       # standard errors of optimism while α rests on few trials: larger
                           # probes more after a start or an alarm
PROBE_MIN, PROBE_MAX = 4, 48   # but every 4 to 48 plain steps: a lower MAX bounds how long a change
                               # goes unnoticed, a higher MIN bounds the cost near break-even
RESUME_OVERHEAD = 0.02     # plus as many as keep a costly resume (draft catch-up) to ~2% of plain
                           # time: larger probes a slow-to-resume draft model more often
HOPELESS = 0.9             # when even full acceptance would reach < 90% of plain speed, no text can
                           # make drafting pay (lower: fewer pairs are written off)...
HOPELESS_EVERY = 1024      # ...so probe only this often, to notice a cost change (the machine freed)


class Probes:
    """The probe schedule: plain steps since the last probe, the spacing, the surprise streak."""

    def __init__(self) -> None:
        self.since = 0             # plain steps since the last probe
        self.every = PROBE_MIN     # the spacing last decided
        self.probing = False       # this step is a probe
        self.streak = 0            # probes in a row fully accepted against the odds

    def choose(self, tokens: np.ndarray, seconds: np.ndarray, k_top: int, resume: float | None,
               in_sync: bool) -> int:
        """k for this plain-winning step: 0, or a probe of PROBE_K..k_top tokens. `tokens` and
        `seconds` are the optimistic estimates for k = 0..cap, `resume` the draft model's catch-up
        seconds, `in_sync`: the drafter would draft without catching up first."""
        cap = len(tokens) - 1
        full = np.arange(1, cap + 2)   # tokens per step if every draft were accepted
        if np.max(full[1:] / seconds[1:]) < HOPELESS * full[0] / seconds[0]:
            self.every = HOPELESS_EVERY
            self.since += 1
            if self.since < HOPELESS_EVERY:
                return 0
            self.since, self.probing = 0, True
            return min(PROBE_K, cap)
        best = 1 + int(np.argmax(tokens[1:] / seconds[1:]))
        k = min(max(best, PROBE_K + self.streak), k_top, cap)
        loss = seconds[k] / seconds[0] - tokens[k]
        every = int(np.clip(round(loss / PROBE_OVERHEAD), PROBE_MIN, PROBE_MAX))
        # A draft model that sat out plain steps must first re-read what it missed; that price
        # does not shrink with rarer probes, so it alone sets a floor on their spacing.
        if not in_sync:  # a drafter in step with the text probes without a catch-up
            every += round((resume or 0.0) / seconds[0] / RESUME_OVERHEAD)
        self.every = max(every >> self.streak, PROBE_MIN)
        self.since += 1
        if self.since < self.every:
            return 0
        self.since, self.probing = 0, True
        return k

    def learn(self, p_all: float, all_accepted: bool) -> None:
        """After a probe: `p_all`, the estimate's chance that the whole draft is accepted."""
        self.streak = self.streak + 1 if p_all < 0.5 and all_accepted else 0
