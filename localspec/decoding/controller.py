"""Adaptive draft length: pick the k that maximises expected tokens per second.

The model. A step drafts k tokens (t_draft(k) = base + k * slope seconds) and verifies them in one
target decode of b = k + 1 tokens (t_verify(b)), yielding E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j
tokens for per-position acceptance rates a_j. k = 0 is plain decoding. Rates and costs are learned
online from the decoder's reports: on a CPU t_verify grows with b, on a GPU it is nearly flat, and
acceptance changes with the text.

How `choose` decides, in order (the constants below set each step):
1. A fixed -k is obeyed. Nothing to draft (a lookup without a match, the end of the budget): plain.
2. Start-up. The first two drafting steps use START_K, to time the draft and a verify size (twice,
   since a first timing is often cold); then one plain step times t_verify(1). A warm start
   (`warm_start`) skips the drafting part but still times one plain step first.
3. A plain step every REFRESH_PLAIN speculating steps keeps t_verify(1) current.
4. Otherwise k = argmax E(k) / (t_draft(k) + t_verify(k + 1)), ties to the smaller k. While
   speculating, every EXPLORE_EVERY steps the neighbours k - 1 and k + 1 are tried, so one noisy
   timing cannot keep a better k unvisited.
5. When plain wins, it is held for up to HOLD_PLAIN steps (deciding costs ~0.1 ms). Now and then it
   probes with k = PROBE_K..START_K (`_maybe_probe`): spaced so that the expected loss stays near
   PROBE_OVERHEAD of plain throughput, judged with PROBE_OPTIMISM standard errors while acceptance
   rests on few trials, plus a spacing that keeps a draft model's catch-up (a resume) near
   RESUME_OVERHEAD, waived when the drafter is in step with the text. A pair where even full
   acceptance stays below HOPELESS of plain speed is probed only every HOPELESS_EVERY steps.
How `observe` learns:
- Verify costs are EWMAs per batch size (COST_WEIGHT, one timing clipped to COST_CLIP), a faster
  second timing replacing a cold first one, a size unmeasured for COST_STALE steps weighing half.
  With three batched sizes a line a + c·b is fitted; before that VERIFY_PRIOR_SLOPE shapes it.
  A warm start's costs take their level from each first timing here (costs.replace_recorded).
  No size is predicted below VERIFY_FLOOR of the cheapest timing (a line can cross zero).
- Drafting costs are EWMAs per draft length, with a line base + slope·k once two lengths are timed.
- Acceptance: discounted Beta counts overall (ALPHA_DECAY, prior ALPHA_PRIOR worth
  ALPHA_PRIOR_WEIGHT trials) and per position (POSITION_DECAY, shrunk toward the overall rate by
  POSITION_SHRINK pseudo-trials). A two-sided CUSUM (CHANGE_DROP, CHANGE_RISE) detects a change of
  text and keeps only FORGET of the old evidence.

Over 400 lines (a reviewed ceiling in tests/test_structure.py) because this is one state machine: the decision flow above reads and updates one shared
state, and split across modules it would be harder to follow than in one place.
"""

from __future__ import annotations

import math

import numpy as np

from .costs import BatchCost, replace_recorded
from .lookup import LookupRates

ALPHA_PRIOR = 0.7          # acceptance before any data: typical for a same-family draft
ALPHA_PRIOR_WEIGHT = 2.0   # worth two trials, so real data take over at once
ALPHA_DECAY = 0.98         # per accept/reject trial: remembers ~50 trials
POSITION_DECAY = 0.97      # per observation of that position: ~33 observations
POSITION_SHRINK = 3.0      # pseudo-trials of the overall rate mixed into each position's rate
COST_WEIGHT = 0.25         # weight of a new timing in a cost EWMA
COST_CLIP = 2.0            # one timing moves an estimate by at most this factor (GC pauses etc.)
COST_STALE = 32            # a batch size unmeasured for this many steps: its new timing counts half
VERIFY_PRIOR_SLOPE = 0.1   # t_verify(b) ~ 1 + 0.1 (b - 1) until two batch sizes are measured
VERIFY_FLOOR = 0.5         # no batch is predicted to verify in less than this share of the cheapest timing
START_K = 4                # the first two steps draft a moderate k to measure t_draft and alpha
PROBE_K = 2                # while plain, probe with at least this many drafts...
PROBE_OVERHEAD = 0.005     # ...as often as keeps the expected loss to ~0.5% of plain throughput,
PROBE_OPTIMISM = 2.0       # (judged optimistically while estimates rest on few trials)
PROBE_MIN, PROBE_MAX = 4, 48   # but every 4 to 48 plain steps,
RESUME_OVERHEAD = 0.02     # plus as many as keep a costly resume (draft catch-up) to ~2%;
HOPELESS = 0.9             # when even full acceptance would reach < 90% of plain speed,
HOPELESS_EVERY = 1024      # no text can make drafting pay: probe only to notice a cost change
CHANGE_DROP = 7.0          # CUSUM thresholds (log-likelihood ratios) for "the text changed":
CHANGE_RISE = 5.0          # a false drop alarm stalls good speculation, a false rise costs a probe
FORGET = 0.15              # on an alarm old trials keep only this weight
REFRESH_PLAIN = 64         # re-measure t_verify(1) after this many steps without a plain step
EXPLORE_EVERY = 32         # now and then try best k -1 / +1 to keep the neighbours' costs fresh
HOLD_PLAIN = 8             # once plain wins, skip re-deciding for this many steps (fast models:
                           # deciding costs ~0.1 ms, 1-2% of a plain step)
WARM_ALPHA_WEIGHT = 16.0   # a warm start's alpha is worth this many trials: a third of the EWMA memory
WARM_POSITION_WEIGHT = 3.0  # ...and its rate at each draft position this many
WARM_TRUST = 64            # steps a warm start's verify costs are believed without being re-timed

_FULL_POSITION = 1 / (1 - POSITION_DECAY) + POSITION_SHRINK   # weights of a saturated EWMA
_FULL_ALPHA = 1 / (1 - ALPHA_DECAY)


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per step with k drafts and per-token acceptance alpha (bonus included)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _ewma(old: float | None, new: float, weight: float) -> float:
    if old is None:
        return new
    new = min(max(new, old / COST_CLIP), old * COST_CLIP)
    return (1.0 - weight) * old + weight * new


def _weights(counts) -> np.ndarray:
    """A timing's weight in a line fit: grows with how often it was taken, up to 16 times."""
    return np.sqrt(np.minimum(counts, 16))


def _line(xs: np.ndarray, ys: np.ndarray, counts) -> tuple[float, float]:
    """(base, slope) of the weighted least-squares line; never a negative slope: more tokens
    never cost less."""
    slope, base = np.polyfit(xs, ys, 1, w=_weights(counts))
    return float(base), max(float(slope), 0.0)


def _cusum(total: float, hits: np.ndarray, p: np.ndarray, q: np.ndarray) -> float:
    """CUSUM recursion over Bernoulli trials: evidence for rate q against rate p."""
    for x in np.where(hits, np.log(q / p), np.log((1 - q) / (1 - p))).tolist():
        total = max(0.0, total + x)
    return total


class KController:
    """Chooses the draft length per step and learns acceptance and cost statistics."""

    def __init__(self, k_max: int = 12, fixed_k: int | None = None, *,
                 draft_cost_free: bool = False) -> None:
        if k_max < 0 or (fixed_k is not None and fixed_k < 0):
            raise ValueError("k_max and fixed_k must be >= 0")
        self.k_max = max(k_max, fixed_k or 0)   # a fixed k above k_max still gets statistics
        self.fixed_k = fixed_k
        self.draft_cost_free = draft_cost_free
        # Acceptance as discounted Beta counts (s = weighted hits, w = weighted trials): an EWMA
        # whose start-up bias is replaced by the prior. Per position likewise, from zero.
        self._acc_s, self._acc_w = ALPHA_PRIOR * ALPHA_PRIOR_WEIGHT, ALPHA_PRIOR_WEIGHT
        self._pos_s, self._pos_w = np.zeros(self.k_max), np.zeros(self.k_max)
        self._trials = 0
        self._cusum_low = self._cusum_high = 0.0   # change detection, see _detect_change
        self._verify: dict[int, float] = {}        # batch size b -> EWMA seconds
        self._prior: set[int] = set()              # sizes known only from a warm start
        self._level_from: int | None = None        # the size whose first timing set their level
        self._timed: dict[int, tuple[int, int]] = {}   # b -> (step of last timing, timings)
        self._curve: np.ndarray | None = None      # verify_cost(1..k_max+1), refitted lazily
        self._draft: float | None = None           # seconds per drafted token (EWMA)
        self._draft_prior = False                  # _draft is a warm start's, not timed here
        self._draft_by_n: dict[int, float] = {}    # n drafted -> EWMA seconds of that drafting
        self._draft_count: dict[int, int] = {}     # n -> how often timed here
        self._draft_line: np.ndarray | None = None  # (base, slope), refitted lazily
        self._resume: float | None = None          # seconds a drafter paid to catch up after plain steps
        self._steps = self._draft_steps = self._spec_steps = 0
        self._since_plain = 0      # steps since t_verify(1) was last measured
        self._since_probe = 0      # plain steps since the last probe
        self._probe_every = PROBE_MIN
        self._probing = False
        self._streak = 0           # probes in a row fully accepted against the odds
        self._hold = 0             # plain steps left before plain-vs-speculation is re-decided
        self._in_sync = False      # this step's drafter would draft without catching up first
        self.last_k: int | None = None
        # Learned here, used by prompt lookup and `auto` (see hybrid.py): acceptance per kind of
        # lookup match, and the draft model's decode cost by tokens read (its catch-up price).
        self.lookup = LookupRates()
        self.first_decode = BatchCost()

    # ---- choosing -------------------------------------------------------------------------
    def choose(self, limit: int | None = None, in_sync: bool = False) -> int:
        """k for the next step, 0 <= k <= min(k_max, limit). `in_sync`: the drafter has seen the
        text up to now (a new prompt or turn, just after drafting), so a probe now would not pay
        for a catch-up."""
        cap = self.k_max if limit is None else max(0, min(self.k_max, limit))
        self._in_sync = in_sync
        self._probing = False
        if self.fixed_k is not None:
            k = min(self.fixed_k, cap)
        elif cap == 0:
            k = 0                       # nothing to draft: a plain step, not a decision
        elif self._draft_steps < 2:     # measure t_draft, alpha and one verify size first;
            k = min(START_K, cap)       # twice, as a first timing is often cold
        elif self.plain_due():
            k = 0                       # plain cost unknown or stale (the context grows, the
                                        # machine's speed drifts; a warm start's is from then)
        elif self._hold > 0:
            self._hold -= 1
            self._since_probe += 1
            k = 0
        else:
            k = int(np.argmax(self._throughput(cap)))   # ties go to the cheaper k
            if k == 0:
                k = self._maybe_probe(cap)
                if k == 0:  # never hold past the step where the next probe is due
                    self._hold = max(0, min(HOLD_PLAIN, self._probe_every - self._since_probe - 1))
            else:
                self._since_probe = self._streak = 0
                self._spec_steps += 1
                # Neighbours of the optimum are re-measured now and then; a once-noisy timing
                # would otherwise keep a better k from ever being tried again.
                if self._spec_steps % EXPLORE_EVERY == 0 and k > 1:
                    k -= 1
                elif self._spec_steps % EXPLORE_EVERY == EXPLORE_EVERY // 2 and k < cap:
                    k += 1
        self.last_k = k
        return k

    def plain_due(self) -> bool:
        """A plain step is needed now to time t_verify(1): never timed here, or stale."""
        return 1 not in self._verify or 1 in self._prior or self._since_plain >= REFRESH_PLAIN

    def starting(self) -> bool:
        """Still in the start-up that times the draft model (rule 2 above)."""
        return self.fixed_k is None and self._draft_steps < 2

    def estimates(self, k_top: int) -> tuple[np.ndarray, np.ndarray]:
        """(expected tokens, seconds) of one draft-model step for k = 0..k_top, as `choose` sees them."""
        return self._estimates(k_top)

    def verify_curve(self, top: int) -> np.ndarray:
        """Predicted seconds to verify b = 1..top tokens (needs one timing)."""
        return self._fitted()[:top] if top <= self.k_max + 1 else self._fit_curve(top)

    def draft_seconds(self, k_top: int) -> np.ndarray:
        """Predicted seconds of drafting k = 0..k_top tokens with the draft model."""
        return self._draft_seconds(k_top)

    def _maybe_probe(self, cap: int) -> int:
        """While plain, now and then speculate (k = 2..4) so that a change is noticed.

        A probe lasts seconds(k) / seconds(0) plain steps and yields tokens(k): it loses the
        difference, so probes spaced loss / PROBE_OVERHEAD apart cost ~0.5%: frequent near
        break-even, where the decision is least sure, rare in a hopeless stretch. The estimate
        is optimistic while it rests on few trials (start, after an alarm). Each probe in a row
        fully accepted against the estimate's odds halves the interval and makes the next probe
        one longer: the estimate lags a change, the streak does not. When drafting costs so much
        that even full acceptance would lose, no change of text can help: probes become very rare."""
        tokens, seconds = self._estimates(cap, optimism=PROBE_OPTIMISM)
        full = np.arange(1, cap + 2)   # tokens per step if every draft were accepted
        if np.max(full[1:] / seconds[1:]) < HOPELESS * full[0] / seconds[0]:
            self._probe_every = HOPELESS_EVERY
            self._since_probe += 1
            if self._since_probe < HOPELESS_EVERY:
                return 0
            self._since_probe, self._probing = 0, True
            return min(PROBE_K, cap)
        best = 1 + int(np.argmax(tokens[1:] / seconds[1:]))
        k = min(max(best, PROBE_K + self._streak), START_K, cap)
        loss = seconds[k] / seconds[0] - tokens[k]
        every = int(np.clip(round(loss / PROBE_OVERHEAD), PROBE_MIN, PROBE_MAX))
        # A draft model that sat out plain steps must first re-read what it missed; that price
        # does not shrink with rarer probes, so it alone sets a floor on their spacing.
        if not self._in_sync:  # a drafter in step with the text probes without a catch-up
            every += round((self._resume or 0.0) / seconds[0] / RESUME_OVERHEAD)
        self._probe_every = max(every >> self._streak, PROBE_MIN)
        self._since_probe += 1
        if self._since_probe < self._probe_every:
            return 0
        self._since_probe, self._probing = 0, True
        return k

    def _rates(self, n: int, optimism: float = 0.0) -> np.ndarray:
        """Acceptance at positions 1..n, each shrunk toward the overall rate where data are thin;
        optimism adds that many standard errors beyond those of a full EWMA memory."""
        alpha = self._acc_s / self._acc_w
        weight = np.append(self._pos_w + POSITION_SHRINK, self._acc_w)
        rates = np.append((self._pos_s + POSITION_SHRINK * alpha) / weight[:-1], alpha)
        if optimism:
            full = np.append(np.full(self.k_max, _FULL_POSITION), _FULL_ALPHA)
            excess = np.maximum(1 / np.sqrt(weight) - 1 / np.sqrt(full), 0.0)
            rates = np.minimum(rates + optimism * np.sqrt(rates * (1 - rates)) * excess, 1.0)
        return np.concatenate((rates[:n], np.full(max(0, n - self.k_max), rates[-1])))

    def _estimates(self, k_top: int, optimism: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Expected tokens and seconds of one step for k = 0..k_top."""
        tokens = 1.0 + np.concatenate(([0.0], np.cumsum(np.cumprod(self._rates(k_top, optimism)))))
        return tokens, self._draft_seconds(k_top) + self._fitted()[:k_top + 1]

    def _draft_seconds(self, k_top: int) -> np.ndarray:
        """Seconds of drafting k = 0..k_top tokens: base + slope·k for k >= 1.

        A drafting step has a fixed part: a draft whose tokens were all accepted must first read
        its last token and the target's bonus token, two rows in one decode, which on a CPU costs
        about two single-token decodes. Priced per token, that part would make long drafts look
        dearer than they are. Once two draft lengths are timed a line is fitted (weighted like
        the verify curve), its base held between 0 and two tokens' worth."""
        ks = np.arange(k_top + 1, dtype=float)
        if self._draft is None:  # nothing timed yet: lookup is ~free; a model guessed at a plain step
            return ks * (0.0 if self.draft_cost_free else self._fitted()[0])
        if len(self._draft_by_n) < 2:
            return ks * self._draft
        if self._draft_line is None:
            ns = np.array(sorted(self._draft_by_n), dtype=float)
            ts = np.array([self._draft_by_n[int(n)] for n in ns])
            counts = [self._draft_count.get(int(n), 1) for n in ns]
            base, slope = _line(ns, ts, counts)
            if slope == 0.0:
                slope, base = float(np.average(ts / ns, weights=_weights(counts))), 0.0
            base = min(max(float(base), 0.0), 2 * slope)
            self._draft_line = np.array([base, slope])
        base, slope = self._draft_line
        out = base + slope * ks
        out[0] = 0.0
        return out

    def _throughput(self, k_top: int) -> np.ndarray:
        """Estimated tokens per second for k = 0..k_top."""
        tokens, seconds = self._estimates(k_top)
        return tokens / seconds

    # ---- learning -------------------------------------------------------------------------
    def observe(self, k: int, n_drafted: int, n_accepted: int, t_draft: float,
                t_verify: float, t_resume: float = 0.0) -> None:
        """Record one step; the verify batch size was n_drafted + 1. t_resume: seconds the drafter
        spent catching up on text it missed during plain steps (not part of t_draft)."""
        if not 0 <= n_accepted <= n_drafted <= max(k, 0):
            raise ValueError(f"need 0 <= n_accepted <= n_drafted <= k, got "
                             f"k={k} n_drafted={n_drafted} n_accepted={n_accepted}")
        self.observe_verify(n_drafted + 1, t_verify)
        if n_drafted == 0:
            return  # a plain step (or a drafter with nothing to offer) says nothing about alpha
        self.observe_draft(n_drafted, n_accepted, t_draft, t_resume)

    def observe_verify(self, b: int, t_verify: float) -> None:
        """Record one target pass over b tokens (every step, whoever drafted)."""
        self._steps += 1
        if self._steps == WARM_TRUST and self._prior - {1}:
            self._forget_unconfirmed()
        if np.isfinite(t_verify) and t_verify > 0:
            # The first timing of a size is often cold (seen: +10..40%): a faster second replaces
            # it. Costs drift as the context grows, most for a size timed long ago (t_verify(1)
            # while speculating), so a stale size's new timing counts half.
            last, n = self._timed.get(b, (self._steps, 0))
            if b in self._prior:
                self._rescale_record(replace_recorded(self._verify, b, t_verify, self._prior - {b}))
                self._level_from, n = b, 0
            elif n == 1 and t_verify < self._verify[b]:
                if b == self._level_from:   # a cold first timing had set the record's level
                    self._rescale_record(t_verify / self._verify[b], self._prior)
                self._verify[b] = t_verify
            else:
                weight = 0.5 if self._steps - last >= COST_STALE else COST_WEIGHT
                self._verify[b] = _ewma(self._verify.get(b), t_verify, weight)
            self._timed[b] = (self._steps, n + 1)
            self._prior.discard(b)
            self._curve = None
        self._since_plain = 0 if b == 1 else self._since_plain + 1

    def _rescale_record(self, ratio: float, sizes: set[int] = frozenset()) -> None:
        """Today's speed sets the level of recorded, untimed verify `sizes` and the draft cost."""
        for b in sizes:
            self._verify[b] *= ratio
        if self._draft_prior:
            self._draft *= ratio
            self._draft_by_n = {n: t * ratio for n, t in self._draft_by_n.items()}
            self._draft_line = None

    def _forget_unconfirmed(self) -> None:
        """Drop the recorded batch sizes no step has re-timed. A record written while the machine
        was busy can price every batch too high; believed for ever, it keeps the controller plain,
        so those sizes are never timed again (prompt lookup has no probes, and the model's become
        hopeless-rare): a bench stayed 100% plain that way. Forgotten, the curve rests on what was
        measured here, with the prior's mild slope beyond it, and drafting gets tried."""
        for b in self._prior - {1}:
            del self._verify[b]
        self._prior &= {1}
        self._curve = None

    def observe_draft(self, n_drafted: int, n_accepted: int, t_draft: float, t_resume: float = 0.0) -> None:
        """Record what the draft model proposed and what of it was accepted."""
        self._draft_steps += 1
        if np.isfinite(t_resume) and t_resume > 0:
            self._resume = _ewma(self._resume, t_resume, COST_WEIGHT)
        if np.isfinite(t_draft) and t_draft >= 0:
            if self._draft_prior:
                self._draft_by_n.setdefault(n_drafted, self._draft * n_drafted)
                replace_recorded(self._draft_by_n, n_drafted, t_draft, set(self._draft_by_n) - {n_drafted})
                self._draft, self._draft_prior = t_draft / n_drafted, False
            else:
                self._draft = _ewma(self._draft, t_draft / n_drafted, COST_WEIGHT)
                self._draft_by_n[n_drafted] = _ewma(self._draft_by_n.get(n_drafted), t_draft, COST_WEIGHT)
            self._draft_count[n_drafted] = self._draft_count.get(n_drafted, 0) + 1
            self._draft_line = None
        if self._probing:
            against_odds = np.prod(self._rates(n_drafted)) < 0.5 and n_accepted == n_drafted
            self._streak = self._streak + 1 if against_odds else 0
        # Trials: positions 1..n_accepted accepted, then one rejection unless all were accepted;
        # later positions were never tested (acceptance there is conditional on reaching them).
        hits = np.arange(min(n_accepted + 1, n_drafted)) < n_accepted
        self._detect_change(hits)
        for i, hit in enumerate(hits.tolist()):
            self._acc_s = ALPHA_DECAY * self._acc_s + hit
            self._acc_w = ALPHA_DECAY * self._acc_w + 1.0
            if i < self.k_max:
                self._pos_s[i] = POSITION_DECAY * self._pos_s[i] + hit
                self._pos_w[i] = POSITION_DECAY * self._pos_w[i] + 1.0
        self._trials += len(hits)

    def _detect_change(self, hits: np.ndarray) -> None:
        """Two-sided CUSUM on the trials; on an alarm, old trials lose most of their weight.

        The long memory that keeps k steady would take dozens of steps to notice a change of
        text: k = 10 drafts failing at position 1 after acceptance collapses, or rare probes
        against a long low-acceptance history. Each side sums the log-likelihood ratio of
        "acceptance halved" (p/2) or "rejection halved" ((1+p)/2) against the estimate p."""
        p = np.clip(self._rates(len(hits)), 0.01, 0.99)
        low = np.minimum(p, 0.95)    # one rejection where p ~ 1 is no collapse yet
        self._cusum_low = _cusum(self._cusum_low, hits, low, low / 2)
        self._cusum_high = _cusum(self._cusum_high, hits, p, (1 + p) / 2)
        if self._cusum_low >= CHANGE_DROP or self._cusum_high >= CHANGE_RISE:
            self._acc_s, self._acc_w = FORGET * self._acc_s, FORGET * self._acc_w
            self._pos_s *= FORGET
            self._pos_w *= FORGET
            self._cusum_low = self._cusum_high = 0.0

    # ---- reading --------------------------------------------------------------------------
    @property
    def alpha(self) -> float | None:
        """EWMA acceptance rate (prior-smoothed), None before any drafted token was verified."""
        return self._acc_s / self._acc_w if self._trials else None

    def acceptance_by_position(self) -> list[float | None]:
        """EWMA acceptance at positions 1..k_max given the earlier ones were accepted."""
        return [float(s / w) if w > 0 else None for s, w in zip(self._pos_s, self._pos_w)]

    def verify_cost(self, b: int) -> float | None:
        """Seconds to verify a batch of b tokens: measured EWMA, interpolated or extrapolated."""
        if not self._verify or b < 1:
            return None
        curve = self._fitted() if b <= self.k_max + 1 else self._fit_curve(b)
        return float(curve[b - 1])

    def _fitted(self) -> np.ndarray:
        if self._curve is None:
            self._curve = self._fit_curve(self.k_max + 1)
        return self._curve

    def _fit_curve(self, top: int) -> np.ndarray:
        """t_verify(1..top): a fitted line for batches once three sizes are timed; before that
        exact at measured sizes, linear between, a linear fit beyond."""
        sizes = sorted(self._verify)
        if sum(1 for x in sizes if x >= 2 and x not in self._prior) >= 3:
            # Enough measured here: a warm start's other sizes may come from a machine state that
            # has changed, and the line fit would keep them forever (large sizes are seldom tried).
            sizes = [x for x in sizes if x == 1 or x not in self._prior]
        bs = np.array(sizes, dtype=float)
        ts = np.array([self._verify[int(x)] for x in bs])
        # Every decode reads all the weights whatever its size, so no batch costs much less than
        # the cheapest one timed; a line fitted to steep costs (a CPU's) extrapolates below zero
        # at b = 1 when that size is unmeasured, and a cost <= 0 would make tokens/s infinite or
        # negative. Half the cheapest timing is the floor (as the sparse branch's bound below its
        # smallest size): every prediction stays positive and finite.
        return np.maximum(self._curve_through(bs, ts, top), VERIFY_FLOOR * ts.min())

    def _curve_through(self, bs: np.ndarray, ts: np.ndarray, top: int) -> np.ndarray:
        b = np.arange(1, top + 1)
        if len(bs) == 1:  # the prior shape 1 + 0.1 (b - 1), through the one measured point
            slope = VERIFY_PRIOR_SLOPE
            return ts[0] * (1 + slope * (b - 1)) / (1 + slope * (bs[0] - 1))
        batched = bs >= 2
        if batched.sum() >= 3:
            # Per-size averages are noisy (one busy moment skews a size for many steps) and a
            # noisy curve makes the argmax over k jump. A batch of b > 1 tokens costs about
            # a + c·b on CPUs and GPUs alike (c ≈ 0 on a GPU), so fit that line, weighting sizes
            # by how often they were timed; a single token runs other kernels and keeps its own.
            counts = [self._timed.get(int(x), (0, 1))[1] for x in bs[batched]]
            base, slope = _line(bs[batched], ts[batched], counts)
            if slope == 0.0:
                base = float(np.average(ts[batched], weights=_weights(counts)))
            line = base + slope * b
            first = ts[0] if bs[0] == 1 else min(line[0], line[1])
            return np.where(b == 1, first, np.maximum(line, first))
        # Never a negative slope beyond the data: more tokens never cost less.
        slope = max(float(np.polyfit(bs, ts, 1)[0]), 0.0)
        curve = np.where(b > bs[-1], ts[-1] + slope * (b - bs[-1]), np.interp(b, bs, ts))
        return np.where(b < bs[0], np.maximum(ts[0] - slope * (bs[0] - b), VERIFY_FLOOR * ts[0]), curve)

    @property
    def draft_cost(self) -> float | None:
        """Seconds per drafted token, None before the first draft."""
        return self._draft

    def expected_speedup(self, k: int) -> float | None:
        """E(k) * t_verify(1) / (k * t_draft + t_verify(k + 1)), None before any timing."""
        if not self._verify or not 0 <= k <= self.k_max:
            return None
        thr = self._throughput(k)
        return float(thr[k] / thr[0])

    # ---- warm start ---------------------------------------------------------------------
    def learned(self) -> dict:
        """What a later run on the same pair and machine can start from (`warm_start`)."""
        return {
            "verify": {str(b): t for b, t in sorted(self._verify.items())},
            "draft_cost": self._draft,
            "draft_by_n": {str(n): t for n, t in sorted(self._draft_by_n.items())},
            "resume_cost": self._resume,
            "alpha": self.alpha,
            "by_position": self.acceptance_by_position(),
            "trials": self._trials,
        }

    def warm_start(self, verify: dict[int, float] | None = None, draft_cost: float | None = None,
                   resume_cost: float | None = None, alpha: float | None = None,
                   by_position: list[float | None] | None = None,
                   draft_by_n: dict[int, float] | None = None) -> None:
        """Start from what an earlier run measured instead of from nothing: costs until they are
        timed here (`costs.replace_recorded`), acceptance as a few pseudo-trials. With a draft cost
        and an alpha the start-up drafting steps are skipped: after one plain step, which times the
        plain cost now, the controller drafts the k those predict, or stays plain."""
        def usable(t) -> bool:  # a damaged record (inf, NaN, a string) must not reach the fits
            return isinstance(t, (int, float)) and math.isfinite(t) and t >= 0

        for b, t in (verify or {}).items():
            if b >= 1 and usable(t) and t > 0:
                self._verify[b] = t
                self._prior.add(b)
        self._curve = None
        if usable(draft_cost):
            self._draft, self._draft_prior = draft_cost, True
            self._draft_by_n = {n: t for n, t in (draft_by_n or {}).items() if n >= 1 and usable(t)}
            self._draft_line = None
        if usable(resume_cost):
            self._resume = resume_cost
        if not (usable(alpha) and alpha <= 1):
            alpha = None
        if alpha is not None:
            self._acc_s, self._acc_w = alpha * WARM_ALPHA_WEIGHT, WARM_ALPHA_WEIGHT
            for i, rate in enumerate((by_position or [])[: self.k_max]):
                if usable(rate) and rate <= 1:
                    self._pos_s[i], self._pos_w[i] = rate * WARM_POSITION_WEIGHT, WARM_POSITION_WEIGHT
        if alpha is not None and (usable(draft_cost) or self.draft_cost_free) and 1 in self._verify:
            self._draft_steps = max(self._draft_steps, 2)

    def snapshot(self) -> dict:
        """JSON-serialisable summary for logs, the bench and the TUI."""
        costs = bool(self._verify)
        thr = self._throughput(self.k_max) if costs else None
        return {
            "mode": "fixed" if self.fixed_k is not None else "adaptive",
            "k_max": self.k_max,
            "last_k": self.last_k,
            "steps": self._steps,
            "alpha": self.alpha,
            "acceptance_by_position": self.acceptance_by_position(),
            "draft_cost": self._draft,
            "resume_cost": self._resume,
            "verify_cost_measured": {str(b): t for b, t in sorted(self._verify.items())},
            "verify_cost_curve": self._fitted().tolist() if costs else None,
            "expected_speedup": (thr / thr[0]).tolist() if costs else None,
            "best_k": int(np.argmax(thr)) if costs else None,
            "probe_every": self._probe_every,
            "lookup_acceptance": self.lookup.snapshot() if self.lookup.trials else None,
            "draft_decode_cost": self.first_decode.snapshot() or None,
        }
