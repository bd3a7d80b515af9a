"""While plain decoding wins: when to speculate anyway (a probe), so that a change is noticed.

A probe lasts seconds(k) / seconds(0) plain steps and yields tokens(k): it loses the difference,
so probes spaced loss / PROBE_OVERHEAD apart cost ~0.5%: frequent near break-even, where the
decision is least sure, rare in a hopeless stretch. The estimate is optimistic while it rests on
few trials (start, after an alarm). Each probe in a row fully accepted against the estimate's odds
halves the interval and makes the next probe one longer: the estimate lags a change, the streak
does not. When drafting costs so much that even full acceptance would lose, no change of text can
help: probes become rare, their spacing doubling from HOPELESS_FIRST to HOPELESS_EVERY steps, so
that a busy moment that made drafting look hopeless is corrected within the run.

Exploration with a bounded price. A verdict that rests on a warm start's record alone (the drafter
has not drafted in this run) is tested after EXPLORE_FIRST plain steps whatever the record says: a
record written while the machine was busy, or on another day, can price drafting 10-30× too high,
and believed it would keep itself, as nothing re-times what is never tried. That test is one draft
of PROBE_K tokens, made whatever the budget (where the record says hopeless, that verdict's first
probe). Every other probe is allowed only while what probes lost, measured (their seconds against
the plain steps their tokens would have taken), the record's test included, plus what the last probe
lost (the next one's likely price), stays under EXPLORE_BUDGET of the time decoded so far (a run
counted as at least BUDGET_HORIZON plain steps): whatever a record or a busy moment says, probes
cost at most that share of a run, or the test alone in a run too short to pay for it; a test that
refutes its record was a cold start's price, and the budget starts over. Probes that gain open the
budget again. Until a probe is due and affordable the controller holds plain without re-deciding.
"""

from __future__ import annotations

import math

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
HOPELESS_FIRST = 16        # ...so probe rarely: after 16 plain steps, then 32, 64... (a verdict
HOPELESS_EVERY = 1024      # from a busy moment is re-tested soon) up to every 1024 steps
EXPLORE_FIRST = 8          # a record's verdict is tested after this many plain steps: sooner
                           # corrects a stale record sooner, costs a short run more when it is right
EXPLORE_BUDGET = 0.02      # probes may lose at most this share of the time decoded (measured), so a
                           # pair that never pays stays >= 0.97x plain with auto's host work (~1 %
                           # of a GPU-class pass) beside it: larger re-tests more often
BUDGET_HORIZON = 128       # ...of a run taken as at least this many plain steps long: smaller stalls
                           # early probing longer after one unlucky probe, larger lets short runs
                           # (under this many tokens) pay more than the budget


class Probes:
    """The probe schedule: plain steps since the last probe, the spacing, the surprise streak, and
    what probes have lost against the time decoded."""

    def __init__(self) -> None:
        self.since = 0             # plain steps since the last probe
        self.every = PROBE_MIN     # the spacing last decided
        self.probing = False       # this step is a probe
        self.streak = 0            # probes in a row fully accepted against the odds
        self.hopeless_every = HOPELESS_FIRST   # the spacing of the next probe of a hopeless pair
        self._hopeless = False     # this probe tests a hopeless verdict
        self.lost = 0.0            # seconds probes lost against plain decoding (negative: gained)
        self.last_loss = 0.0       # what the last probe lost (>= 0): the price the budget expects next
        self.elapsed = 0.0         # seconds of every step timed
        self.count = 0             # probes made

    def choose(self, tokens: np.ndarray, seconds: np.ndarray, k_top: int, resume: float | None,
               in_sync: bool, unconfirmed: bool = False) -> int:
        """k for this plain-winning step: 0, or a probe of PROBE_K..k_top tokens. `tokens` and
        `seconds` are the optimistic estimates for k = 0..cap, `resume` the draft model's catch-up
        seconds, `in_sync`: the drafter would draft without catching up first; `unconfirmed`: the
        verdict rests on a warm start's record, not on drafting timed in this run."""
        cap = len(tokens) - 1
        full = np.arange(1, cap + 2)   # tokens per step if every draft were accepted
        self._hopeless = bool(np.max(full[1:] / seconds[1:]) < HOPELESS * full[0] / seconds[0])
        # The record's test is made whatever the budget; where the record says hopeless, it is
        # that verdict's first probe (the next comes 2 x HOPELESS_FIRST on).
        if unconfirmed:
            return self._due(EXPLORE_FIRST, min(PROBE_K, cap), budget=False)
        if self._hopeless:
            return self._due(self.hopeless_every, min(PROBE_K, cap), plain=float(seconds[0]))
        self.hopeless_every = HOPELESS_FIRST
        best = 1 + int(np.argmax(tokens[1:] / seconds[1:]))
        k = min(max(best, PROBE_K + self.streak), k_top, cap)
        loss = seconds[k] / seconds[0] - tokens[k]
        every = int(np.clip(round(loss / PROBE_OVERHEAD), PROBE_MIN, PROBE_MAX))
        # A draft model that sat out plain steps must first re-read what it missed; that price
        # does not shrink with rarer probes, so it alone sets a floor on their spacing.
        if not in_sync:  # a drafter in step with the text probes without a catch-up
            every += round((resume or 0.0) / seconds[0] / RESUME_OVERHEAD)
        return self._due(max(every >> self.streak, PROBE_MIN), k, plain=float(seconds[0]))

    def _due(self, every: int, k: int, budget: bool = True, plain: float = 0.0) -> int:
        """k when a probe spaced `every` plain steps is due (and, with `budget`, affordable), else 0.
        `plain`: the seconds of a plain step."""
        self.every = every
        self.since += 1
        if self.since < every or (budget and self._over(plain) > 0):
            return 0
        self.since, self.probing = 0, True
        return k

    def _over(self, plain: float) -> float:
        """Seconds by which a probe now, priced as the last one, would take probes past the budget
        (<= 0: affordable). A run is budgeted as at least BUDGET_HORIZON plain steps long: early in
        a run one probe that lost would otherwise stop probing for dozens of steps, a stall in plain
        decoding where a near-even pair may pay."""
        return self.lost + self.last_loss - EXPLORE_BUDGET * max(self.elapsed, BUDGET_HORIZON * plain)

    def wait(self, plain_seconds: float) -> int:
        """Plain steps of `plain_seconds` each before a probe can be due and affordable: the
        controller need not re-decide before then (deciding costs ~0.1 ms, 3-4 % of a GPU-class pass)."""
        steps = self.every - self.since
        over = self._over(plain_seconds)
        if over > 0 and plain_seconds > 0:
            steps = max(steps, math.ceil(over / (EXPLORE_BUDGET * plain_seconds)))
        return max(steps, 0)

    def defer(self) -> None:
        """The probe chosen was not made (another drafter served the step): make it at the next
        plain-winning step instead."""
        if self.probing:
            self.since, self.probing = self.every - 1, False

    def timed(self, seconds: float) -> None:
        """A step's (or a part of one's) seconds, probe or not: the budget's base."""
        if math.isfinite(seconds) and seconds > 0:   # every step: a scalar test, not numpy's
            self.elapsed += seconds

    def forget_losses(self) -> None:
        """The budget and the hopeless spacing start over, as in a cold run (a warm start's record
        was refuted)."""
        self.lost = self.last_loss = 0.0
        self.hopeless_every = HOPELESS_FIRST

    def learn(self, p_all: float, all_accepted: bool, loss: float | None = None) -> None:
        """After a probe: `p_all`, the estimate's chance that the whole draft is accepted; `loss`,
        the seconds it lost against decoding its tokens plainly (None: not timed)."""
        self.streak = self.streak + 1 if p_all < 0.5 and all_accepted else 0
        self.count += 1
        if loss is not None and math.isfinite(loss):
            self.lost += loss
            self.last_loss = max(loss, 0.0)
        if self._hopeless:
            self.hopeless_every = min(2 * self.hopeless_every, HOPELESS_EVERY)
            self._hopeless = False
