"""Adaptive draft length: pick the k that maximises expected tokens per second.

The model. A step drafts k tokens (t_draft(k) = base + k * slope seconds) and verifies them in one
target decode of b = k + 1 tokens (t_verify(b)), yielding E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j
tokens for per-position acceptance rates a_j. k = 0 is plain decoding. Rates and costs are learned
online from the decoder's reports: on a CPU t_verify grows with b, on a GPU it is nearly flat, and
acceptance changes with the text.

How `choose` decides, in order (the constants below and in `probes` set each step):
1. A fixed -k is obeyed. Nothing to draft (a lookup without a match, the end of the budget): plain.
2. Start-up. The first two drafting steps use START_K, to time the draft and a verify size (twice,
   since a first timing is often cold); then one plain step times t_verify(1). A warm start
   (`warm_start`) skips the drafting part but still times one plain step first.
3. A plain step every REFRESH_PLAIN speculating steps keeps t_verify(1) current; the second comes
   SECOND_PLAIN steps after the first, which is often cold.
4. Otherwise k = argmax E(k) / (t_draft(k) + t_verify(k + 1)), ties to the smaller k. While
   speculating, every EXPLORE_EVERY steps the neighbours k - 1 and k + 1 are tried, so one noisy
   timing cannot keep a better k unvisited.
5. Hysteresis: once speculating (the start-up's drafts count), a draft model in step with the
   text keeps drafting (the best k > 0) while plain wins only on the estimate as it stands, not
   on one made optimistic by PROBE_OPTIMISM standard errors where acceptance rests on few trials,
   and while what drafting loses over HOLD_HORIZON steps is less than coming back would cost.
   Leaving is cheap; coming back costs a catch-up of every token missed (~0.2 of a pass each on a
   CPU) and waits for a probe, so one early rejection on a pair that pays ~1.1x kept a whole run
   plain. Drafting steps firm the estimate up; plain steps teach nothing about acceptance.
6. When plain wins, it is held until the next probe is due and affordable, at most HOLD_PLAIN
   steps (deciding costs ~0.1 ms). Now and then it probes with k = PROBE_K..START_K (`probes`):
   spaced so that the expected loss stays near PROBE_OVERHEAD of plain throughput, judged with
   PROBE_OPTIMISM standard errors while acceptance rests on few trials, plus a spacing that keeps
   a draft model's catch-up (a resume) near RESUME_OVERHEAD, waived when the drafter is in step
   with the text. A pair where even full acceptance stays below HOPELESS of plain speed is probed
   rarely (16, 32, ... HOPELESS_EVERY apart). A verdict resting on a record alone is tested
   after EXPLORE_FIRST plain steps; probes that lose stay within EXPLORE_BUDGET of the run's time.
`observe` hands each timing and count to the parts that learn from it (`costs`, `draft_costs`,
`alpha`; the package docstring lists them) and keeps the counters the rules above read.
"""

from __future__ import annotations

import math

import numpy as np

from ..lookup import LookupRates
from .alpha import Acceptance
from .costs import WARM_TRUST, VerifyCost
from .draft_costs import BatchCost, DraftCost
from .probes import EXPLORE_FIRST, PROBE_MAX, PROBE_OPTIMISM, Probes
from .trees import TreeChooser

START_K = 4                # the first two steps draft a moderate k to measure t_draft and alpha:
                           # larger times longer drafts at once, but wastes more on a bad pair
SECOND_PLAIN = 16          # the second plain timing comes this many steps after the first, which
                           # is often cold (seen: 5.0 ms against 2.5 on a GPU-class pass): beside
                           # re-timed drafting sizes a spiked t_verify(1) made speculation look
                           # paying (0.6x plain) until the next plain step; larger believes it longer
REFRESH_PLAIN = 64         # re-measure t_verify(1) after this many steps without a plain step:
                           # smaller follows a growing context sooner, at a plain step's loss
EXPLORE_EVERY = 32         # now and then try best k -1 / +1 to keep the neighbours' costs fresh:
                           # smaller recovers sooner from a noisy timing, leaves the best k more
REFUTED = 0.25            # a record whose α gave the accepted tokens of this run's first draft less
                           # than this chance is dropped: larger drops more true records (the price
                           # of each: a cold start's two measuring steps)
HOLD_HORIZON = 8           # rule 5's horizon: larger leaves a losing pair later (seen: 0.82x plain
                           # for 40 steps where a catch-up cost 0.6 ms), smaller leaves a pair
                           # paying ~1.1x on one early rejection again
HOLD_PLAIN = 32            # once plain wins, skip re-deciding for up to this many steps, and never
                           # past the next probe: between probes only the plain step's cost moves,
                           # and deciding costs ~0.1 ms, 3-4 % of a GPU-class pass; larger reacts
                           # later to a drift of that cost alone


def _usable(t) -> bool:
    """A record's number that may reach the fits: a damaged record (inf, NaN, a string) must not."""
    return isinstance(t, (int, float)) and math.isfinite(t) and t >= 0


class KController:
    """Chooses the draft length per step and learns acceptance and cost statistics."""

    def __init__(self, k_max: int = 12, fixed_k: int | None = None, *,
                 draft_cost_free: bool = False) -> None:
        if k_max < 0 or (fixed_k is not None and fixed_k < 0):
            raise ValueError("k_max and fixed_k must be >= 0")
        self.k_max = max(k_max, fixed_k or 0)   # a fixed k above k_max still gets statistics
        self.fixed_k = fixed_k
        self.draft_cost_free = draft_cost_free
        self.acceptance = Acceptance(self.k_max)
        self.verify_costs = VerifyCost(self.k_max)
        self.draft_costs = DraftCost()
        self._draft_steps = self._spec_steps = 0
        self._since_plain = 0      # steps since t_verify(1) was last measured
        self.probes = Probes()
        self._hold = 0             # plain steps left before plain-vs-speculation is re-decided
        self._speculating = False  # the last decision was to speculate (rule 5 keeps it so)
        self.warm = False          # started from a record (`warm_start`)...
        self.record_weight = 1.0   # ...worth this much (1: a steady run's, today's)
        self.drafted_here = False  # the drafter has drafted in this controller's lifetime
        self._last_verify = 0.0    # seconds of the last target pass timed (a probe's price)
        self.last_k: int | None = None
        # Learned here, used by prompt lookup and `auto` (see auto.py): acceptance per kind of
        # lookup match, and the draft model's decode cost by tokens read (its catch-up price).
        self.lookup = LookupRates()
        self.first_decode = BatchCost()
        self.trees = TreeChooser()   # `--tree auto`: sibling acceptance, tree or chain
        self.tree_shape: tuple[int, ...] | None = None   # a fixed --tree SHAPE (set by the decoder)
        self.tree_pays: np.ndarray | None = None   # with it: per k, whether its tree beats a chain
        self.batch = None
        """`batch.SlotShare` when this generation shares its decodes: its costs are its share."""

    @property
    def _verify(self) -> dict[int, float]:   # verify seconds by batch size (tests read it)
        return self.verify_costs.by_size

    # ---- choosing -------------------------------------------------------------------------
    def choose(self, limit: int | None = None, in_sync: bool = False) -> int:
        """k for the next step, 0 <= k <= min(k_max, limit). `in_sync`: the drafter has seen the
        text up to now (a new prompt or turn, just after drafting), so a probe now would not pay
        for a catch-up."""
        cap = self.k_max if limit is None else max(0, min(self.k_max, limit))
        self.probes.probing = False
        if self.fixed_k is not None:
            k = min(self.fixed_k, cap)
        elif cap == 0:
            k = 0                       # nothing to draft: a plain step, not a decision
        elif self._draft_steps < 2:     # measure t_draft, alpha and one verify size first;
            k = min(START_K, cap)       # twice, as a first timing is often cold
            self._speculating = True    # and the verdict on two drafts is held loosely (rule 5)
        elif self._hold > 0:            # (before plain_due: a held step is plain, so never due)
            self._hold -= 1
            self.probes.since += 1
            k = 0
        elif self.plain_due():
            k = 0                       # t_verify(1) unknown or stale (a longer context, a drift, a record)
        else:
            throughput = self._throughput(cap)
            k = int(np.argmax(throughput))   # ties go to the cheaper k
            if k == 0:
                tokens, seconds = self.estimates(cap, optimism=PROBE_OPTIMISM)
                if (self._speculating and in_sync and not self.draft_cost_free
                        and np.max(tokens[1:] / seconds[1:]) > tokens[0] / seconds[0]
                        and self._leaving_costs_more(cap, 1 + int(np.argmax(throughput[1:])))):
                    k = 1 + int(np.argmax(throughput[1:]))   # keep drafting: leaving is dear (rule 5)
            self._speculating = k > 0
            if k == 0:
                k = self.probes.choose(tokens, seconds, START_K, self.draft_costs.resume, in_sync,
                                       unconfirmed=self.warm and not self.drafted_here)
                if k == 0:  # never hold past the step where the next probe is due (and affordable)
                    self._hold = max(0, min(HOLD_PLAIN, self.probes.wait(float(seconds[0])) - 1))
            else:
                self.probes.since = self.probes.streak = 0
                self._spec_steps += 1
                # Neighbours of the optimum are re-measured now and then; a once-noisy timing
                # would otherwise keep a better k from ever being tried again.
                if self._spec_steps % EXPLORE_EVERY == 0 and k > 1:
                    k -= 1
                elif self._spec_steps % EXPLORE_EVERY == EXPLORE_EVERY // 2 and k < cap:
                    k += 1
        self.last_k = k
        return k

    def _leaving_costs_more(self, cap: int, k: int) -> bool:
        """Whether drafting k tokens loses less over HOLD_HORIZON steps, on the estimate as it
        stands, than coming back after a probe gap costs (the draft model's catch-up on the tokens
        it missed: `first_decode`; unknown before a first draft is timed, and then taken as dear)."""
        if self.first_decode.predict(2) is None:
            return True
        comeback = self.first_decode.extra(PROBE_MAX + 1)
        tokens, seconds = self.estimates(cap)
        loss = float(seconds[k] - tokens[k] * seconds[0])   # drafting's seconds against plain's for its tokens
        return HOLD_HORIZON * loss < comeback

    def plain_due(self) -> bool:
        """A plain step is needed now to time t_verify(1): never timed here, or stale."""
        if self.batch is not None:
            return self.batch.plain_due()
        times = self.verify_costs.times_here(1)
        return not times or self._since_plain >= (SECOND_PLAIN if times == 1 else REFRESH_PLAIN)

    def starting(self) -> bool:
        """Still in the start-up that times the draft model (rule 2 above)."""
        return self.fixed_k is None and self._draft_steps < 2

    def estimates(self, k_top: int, optimism: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(expected tokens, seconds) of one draft-model step for k = 0..k_top, as `choose` sees
        them; `optimism`: standard errors added to acceptance where it rests on few trials."""
        rates = self.acceptance.rates(k_top, optimism)
        tokens = self.acceptance.tokens(k_top, optimism)
        seconds = self._draft_seconds(k_top) + self.verify_curve(k_top + 1)
        if self.tree_shape:   # a fixed --tree SHAPE: each k drafts its tree, or a chain where that pays more
            tree_tokens, tree_seconds = self.trees.estimates(self.tree_shape, rates, self._draft_seconds(k_top),
                                                             self.first_decode.extra(3), self.verify_curve)
            self.tree_pays = tree_tokens * seconds >= tokens * tree_seconds
            return np.where(self.tree_pays, tree_tokens, tokens), np.where(self.tree_pays, tree_seconds, seconds)
        return tokens, seconds

    def _draft_seconds(self, k_top: int) -> np.ndarray:
        if self.batch is not None and not self.draft_cost_free:
            shared = self.batch.draft_seconds(k_top)   # the batch's draft decodes, shared
            if shared is not None:
                return shared
        if self.draft_costs.per_token is None:  # nothing timed: lookup is ~free, a model is guessed
            guess = 0.0 if self.draft_cost_free else self.verify_curve(1)[0]   # at a plain step
            return np.arange(k_top + 1, dtype=float) * guess
        return self.draft_costs.seconds(k_top)

    def _throughput(self, k_top: int) -> np.ndarray:
        """Estimated tokens per second for k = 0..k_top."""
        tokens, seconds = self.estimates(k_top)
        return tokens / seconds

    # ---- learning -------------------------------------------------------------------------
    def observe(self, k: int, n_drafted: int, n_accepted: int, t_draft: float,
                t_verify: float, t_resume: float = 0.0, n_timed: int | None = None) -> None:
        """Record one step; the verify batch size was n_drafted + 1. t_resume: seconds the drafter
        spent catching up on text it missed during plain steps (not part of t_draft); n_timed: the
        drafted tokens t_draft paid for (all; fewer where some were drafted during the last verify)."""
        if not 0 <= n_accepted <= n_drafted <= max(k, 0):
            raise ValueError(f"need 0 <= n_accepted <= n_drafted <= k, got "
                             f"k={k} n_drafted={n_drafted} n_accepted={n_accepted}")
        self.observe_verify(n_drafted + 1, t_verify)
        if n_drafted == 0:
            return  # a plain step (or a drafter with nothing to offer) says nothing about alpha
        self.observe_draft(n_drafted, n_accepted, t_draft, t_resume, n_timed)

    def observe_verify(self, b: int, t_verify: float) -> None:
        """Record one target pass over b tokens (every step, whoever drafted)."""
        ratio = None
        if self.batch is not None:   # the batch's decodes are timed by the batcher, not here
            self.batch.verified(b)
            self.verify_costs.untimed()
        else:
            ratio = self.verify_costs.observe(b, t_verify)
        if ratio is not None:   # today's speed sets the level of a recorded draft cost too
            self.draft_costs.rescale(ratio)
            self.first_decode.rescale(ratio)
        if self.verify_costs.trust_ends():   # the record's costs not re-timed by now are forgotten,
            for costs in (self.verify_costs, self.draft_costs, self.first_decode):   # all of them
                costs.forget_recorded()
        if self.batch is not None:
            return
        self._since_plain = 0 if b == 1 else self._since_plain + 1
        self._last_verify = t_verify
        self.probes.timed(t_verify)

    def observe_draft(self, n_drafted: int, n_accepted: int, t_draft: float, t_resume: float = 0.0,
                      n_timed: int | None = None) -> None:
        """Record what the draft model proposed (`observe`'s n_timed) and what of it was accepted."""
        timed = n_drafted if n_timed is None else n_timed
        self._draft_steps += 1
        testing = self.probes.probing and self.warm and not self.drafted_here   # the record's test
        self.drafted_here = True
        loss = None
        if self.batch is not None:
            self.batch.accepted(n_accepted)
        else:
            self.probes.timed(t_draft + t_resume)
            if self.probes.probing:   # against the plain steps its tokens would have taken
                loss = t_draft + t_resume + self._last_verify - (n_accepted + 1) * float(self.verify_curve(1)[0])
        if timed > 0:
            self.draft_costs.observe(timed, t_draft, t_resume, testing)
        if self.probes.probing:   # only then is the draft priced against the estimate
            self._learn_probe(n_drafted, n_accepted, loss, testing)
        self.acceptance.observe(n_drafted, n_accepted)

    def _learn_probe(self, n_drafted: int, n_accepted: int, loss: float | None, testing: bool) -> None:
        """A probe's outcome for the schedule; for the test of a warm start's record, its verdict."""
        rates = self.acceptance.rates(n_drafted)
        self.probes.learn(float(np.prod(rates)), n_accepted == n_drafted, loss)
        if testing and n_accepted and float(np.prod(rates[:n_accepted])) < REFUTED:
            # The record's acceptance is refuted by this run's first draft: so many accepted had
            # less than REFUTED chance under it (a "never pays" record held α 0.1 as 16 trials: two
            # probes' hits hardly moved it, and probes grew rare). Start over as a cold run does:
            # from the prior, with the start-up's drafting steps, which time the drafting afresh
            # (this draft's catch-up may have been priced by the record's first-decode line),
            # and the verify costs this run has timed, not the record's (an erratic record's sizes
            # were off by up to 5× either way, and kept half the run's steps plain). The test's
            # loss was a cold start's price, not a probe's: left in the budget, it (a cold first
            # decode, the prompt's catch-up: 2-3 plain steps) refused probes for ~60 steps.
            self.probes.forget_losses()
            self.acceptance.reset()
            self.draft_costs, self.first_decode = DraftCost(), BatchCost()
            self.verify_costs.forget_recorded()
            self._draft_steps = 0

    # ---- reading --------------------------------------------------------------------------
    @property
    def alpha(self) -> float | None:
        """EWMA acceptance rate (prior-smoothed), None before any drafted token was verified."""
        return self.acceptance.alpha

    def acceptance_by_position(self) -> list[float | None]:
        """EWMA acceptance at positions 1..k_max given the earlier ones were accepted."""
        return self.acceptance.by_position()

    @property
    def draft_cost(self) -> float | None:
        """Seconds per drafted token, None before the first draft."""
        return self.draft_costs.per_token

    def verify_curve(self, top: int) -> np.ndarray:
        """Predicted seconds to verify b = 1..top tokens (needs one timing; in a batch, its share)."""
        if self.batch is not None and self.batch.known():
            return self.batch.curve(top)
        return self.verify_costs.curve(top)

    def row_share(self) -> float:
        """What one more verify row costs at least, as a share of a plain pass (as last fitted; 0
        unknown, or in a batch): a draft token less likely reached and accepted earns less."""
        return self.verify_costs.row_share if self.batch is None else 0.0

    def costs_known(self) -> bool:
        return bool(self.verify_costs.by_size) or (self.batch is not None and self.batch.known())

    def verify_cost(self, b: int) -> float | None:
        """Seconds to verify a batch of b tokens: measured EWMA, interpolated or extrapolated."""
        if not self.costs_known() or b < 1:
            return None
        return float(self.verify_curve(b)[b - 1])

    def draft_seconds(self, k_top: int) -> np.ndarray:
        """Predicted seconds of drafting k = 0..k_top tokens with the draft model."""
        return self._draft_seconds(k_top)

    def expected_speedup(self, k: int) -> float | None:
        """E(k) * t_verify(1) / (k * t_draft + t_verify(k + 1)), None before any timing."""
        if not self.costs_known() or not 0 <= k <= self.k_max:
            return None
        thr = self._throughput(k)
        return float(thr[k] / thr[0])

    # ---- warm start ---------------------------------------------------------------------
    def learned(self) -> dict:
        """What a later run on the same pair and machine can start from (`warm_start`): the costs timed
        here (a save keeps the record's others a while: `warmstart`); in a batch not the drafting's."""
        alone, v = self.batch is None, self.verify_costs
        return {
            "verify": {str(b): t for b, t in sorted(v.by_size.items()) if v.timed_here(b)},
            "draft_cost": self.draft_costs.per_token if alone else None,
            "draft_by_n": {str(n): t for n, t in sorted(self.draft_costs.timed_here().items())} if alone else None,
            "resume_cost": self.draft_costs.resume if alone else None,
            "alpha": self.alpha,
            "by_position": self.acceptance_by_position(),
            "trials": self.acceptance.trials,
            "first_decode": {str(n): t for n, t in sorted(self.first_decode.timed_here().items())} if alone else None,
        }

    def warm_start(self, verify: dict[int, float] | None = None, draft_cost: float | None = None,
                   resume_cost: float | None = None, alpha: float | None = None,
                   by_position: list[float | None] | None = None,
                   draft_by_n: dict[int, float] | None = None, weight: float = 1.0,
                   first_decode: dict[int, float] | None = None) -> None:
        """Start from what an earlier run measured instead of from nothing: costs until they are
        timed here (`costs.replace_recorded`), acceptance as a few pseudo-trials. With a draft cost
        and an alpha the start-up drafting steps are skipped: after one plain step, which times the
        plain cost now, the controller drafts the k those predict, or stays plain; a plain verdict
        is tested within EXPLORE_FIRST steps (`probes`). `weight` (0..1): what the record is worth
        (`warmstart.weight`: a steady run's today is 1); its acceptance counts as that share of
        the pseudo-trials, and its untimed batch sizes are believed that share of WARM_TRUST steps."""
        weight = min(max(float(weight), 0.0), 1.0) if _usable(weight) else 1.0
        self.warm, self.record_weight = True, weight
        self.verify_costs.trust = max(EXPLORE_FIRST, round(WARM_TRUST * weight))
        self.verify_costs.warm_start({b: t for b, t in (verify or {}).items() if b >= 1 and _usable(t) and t > 0})
        if _usable(draft_cost):
            self.draft_costs.warm_start(draft_cost, {n: t for n, t in (draft_by_n or {}).items()
                                                     if n >= 1 and _usable(t)})
        if _usable(resume_cost):
            self.draft_costs.warm_resume(resume_cost)
        self.first_decode.warm_start({n: t for n, t in (first_decode or {}).items() if _usable(t)})
        if not (_usable(alpha) and alpha <= 1):
            alpha = None
        if alpha is not None:
            self.acceptance.warm_start(alpha, {i: rate for i, rate in enumerate((by_position or [])[: self.k_max])
                                               if _usable(rate) and rate <= 1}, weight)
        if alpha is not None and (_usable(draft_cost) or self.draft_cost_free) and 1 in self.verify_costs.by_size:
            self._draft_steps = max(self._draft_steps, 2)

    def snapshot(self) -> dict:
        """JSON-serialisable summary for logs, the bench and the TUI."""
        costs = self.costs_known()
        thr = self._throughput(self.k_max) if costs else None
        return {
            "mode": "fixed" if self.fixed_k is not None else "adaptive",
            "k_max": self.k_max,
            "last_k": self.last_k,
            "steps": self.verify_costs.steps,
            "alpha": self.alpha,
            "acceptance_by_position": self.acceptance_by_position(),
            "draft_cost": self.draft_costs.per_token,
            "resume_cost": self.draft_costs.resume,
            "verify_cost_measured": {str(b): t for b, t in sorted(self.verify_costs.by_size.items())},
            "verify_cost_curve": self.verify_curve(self.k_max + 1).tolist() if costs else None,
            "expected_speedup": (thr / thr[0]).tolist() if costs else None,
            "best_k": int(np.argmax(thr)) if costs else None,
            "probe_every": self.probes.every,
            "probes": {"made": self.probes.count, "lost_seconds": self.probes.lost, "elapsed_seconds": self.probes.elapsed},
            "record_weight": self.record_weight if self.warm else None,
            "lookup_acceptance": self.lookup.snapshot() if self.lookup.trials else None,
            "draft_decode_cost": self.first_decode.snapshot() or None,
        }
