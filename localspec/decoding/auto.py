"""`--drafter auto`: per step, the best of prompt lookup, the draft model, both, or plain decoding.

Each step compares the expected tokens per second of target and draft time of:
- plain decoding: one token per t_verify(1);
- prompt lookup: its candidate's tokens, each accepted with the rate learned for its class of match
  (`LookupRates`), drafting nearly free, verified for t_verify(k + 1);
- the draft model, at the k its `KController` chose: acceptance per position, drafting cost, and
  the price of reading what it has not seen yet (after lookup steps), from `first_decode`;
- mixed: the first m lookup tokens extended by j model tokens. The model reads the lookup prefix
  in its first decode; it drafts on only if every lookup token is accepted, so its tokens count
  with the probability of that.
Lookup's rates learn from every step: a step served by the model or plain scores the candidate
lookup offered against what was emitted (`AutoDrafter._score_unused`).
Everything compared was measured at earlier steps; nothing of this step's target output is read
before the choice, so the choice cannot bias what is emitted. The KController still decides when
the model is tried while plain wins (its probes) and when a plain step must time t_verify(1).

In a mixed draft the acceptance rule sees q = one-hot at the lookup positions (lookup proposes
without a distribution) and the model's distribution at the model positions.

With a fixed k the split between lookup and model tokens reads only what this generation has
learned (its own record, started afresh in `prepare`), never the controller's statistics, which
outlive it (earlier requests of a server, the warm-start record). At T > 0 the text depends on
who drafted each token (acceptance depends on q), so this is what makes a seeded fixed-k
generation give the same text whatever ran before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .controller import ALPHA_PRIOR, KController
from .drafters import LOOKUP_OPTIMISM, SYNC_LAG, Draft, PromptLookup, best_lookup, lookup_expectation, split_draft_time
from .model_drafter import ModelDrafter
from localspec.tokens import common_prefix


@dataclass(frozen=True)
class Plan:
    source: str = ""   # "" (plain), "model", "lookup" or "mixed"
    k: int = 0         # tokens to draft
    m: int = 0         # of which from lookup (a prefix)


PLAIN = Plan()


def choose(controller, candidate: Sequence[int], classes: Sequence[int], lag: int, cap: int,
           record=None) -> Plan:
    """The plan for this step. `candidate`/`classes`: lookup's proposal; `lag`: tokens the draft
    model must read before drafting; `cap`: the most tokens this step may draft; `record`: whose
    acceptance statistics split a fixed k (the controller's if None)."""
    k_model = controller.choose(cap, in_sync=lag <= SYNC_LAG)
    model = Plan("model", k_model) if k_model else PLAIN
    n = min(len(candidate), cap)
    if controller.fixed_k is not None:
        # k tokens whatever: each of the first positions goes to lookup while its token is more
        # likely accepted than the model's (by what each has earned), the rest to the model.
        record = controller if record is None else record
        k = k_model
        alpha = record.alpha if record.alpha is not None else ALPHA_PRIOR
        m = 0
        for rate in record.lookup.rates(classes[:min(n, k)], optimism=LOOKUP_OPTIMISM):
            if rate < alpha:
                break
            m += 1
        if m >= k:
            return Plan("lookup", k, k) if k else PLAIN
        return Plan("mixed", k, m) if m else model
    if n == 0 or controller.plain_due() or controller.starting():
        return model
    if not k_model:
        # Plain beats the model (and no probe is due): its tokens would not pay after a lookup
        # prefix either (they cost the same and must beat lookup's higher rate), so only lookup is
        # priced against plain. Pricing every mix cost ~0.1 ms a step, 3-4 % of a GPU-class pass,
        # on each step of a stretch where plain decoding wins.
        m = best_lookup(controller, classes[:n], last_fit=True)[0]   # m > 0: it beats plain
        return Plan("lookup", m, m) if m else PLAIN
    tokens_m, seconds_m = controller.estimates(cap)
    verify = controller.verify_curve(cap + 1)          # verify[b - 1]: b tokens
    drafting = controller.draft_seconds(cap)
    catchup = controller.first_decode
    best, plan = 1.0 / verify[0], PLAIN
    if k_model:
        rate = tokens_m[k_model] / (seconds_m[k_model] + catchup.extra(lag))
        if rate > best:
            best, plan = rate, model
    m, rate = best_lookup(controller, classes[:n])
    if m and rate > best:
        best, plan = rate, Plan("lookup", m, m)
    top = min(n, cap - 1)
    if top >= 1:
        # m lookup tokens then j model tokens (m + j <= cap), all pairs at once: the model's
        # expected accepted tokens count only when all m lookup tokens were accepted.
        ms = np.arange(1, top + 1)[:, None]
        js = np.arange(1, cap)[None, :]
        fits = ms + js <= cap
        js = np.where(fits, js, 1)
        reach, gained = lookup_expectation(controller, classes[:top])
        tokens = gained[ms] + reach[ms] * (tokens_m[js] - 1.0)
        extra = catchup.extra(lag + ms)
        seconds = drafting[js] + extra + verify[np.minimum(ms + js, cap)]
        mixed = np.where(fits, tokens / seconds, -np.inf)
        m, j = np.unravel_index(int(np.argmax(mixed)), mixed.shape)
        if mixed[m, j] > best:
            best, plan = float(mixed[m, j]), Plan("mixed", int(m + j + 2), int(m + 1))
    if plan is PLAIN:
        return model   # the controller's probe: how it learns that the model pays again
    if plan is not model:
        controller.probes.defer()   # lookup served the step: the probe waits for the next one
    return plan


class AutoDrafter:
    """Prompt lookup and a draft model behind one drafter; `choose` picks per step."""

    name = "auto"
    draft_cost_free = False

    def __init__(self, model: ModelDrafter, lookup: PromptLookup | None = None):
        self.model = model
        self.lookup = lookup or PromptLookup()
        self._plan = PLAIN
        self._offered: tuple[int, list[int], list[int]] | None = None   # (at, candidate, classes)
        self._unused: tuple[int, list[int], list[int]] | None = None
        self._own: KController | None = None   # this generation's record, for a fixed k

    def prepare(self, context: Sequence[int]) -> None:
        self.model.prepare(context)
        self.lookup.prepare(context)
        # A new generation: the last one's candidate, scored now, would be a stale candidate at a
        # stale offset, and its record must not decide this one's split.
        self._plan, self._offered, self._unused, self._own = PLAIN, None, None, None

    def _records(self, controller) -> list:
        """Where the step's acceptance is learned: the controller, and this generation's record."""
        return [controller] if self._own is None else [controller, self._own]

    def lag(self, context: Sequence[int]) -> int:
        return self.model.lag(context)

    def plan(self, context, cap, controller) -> int:
        self.model.follow(controller)
        self._score_unused(context, controller)
        self.lookup.limit(context, cap, controller)
        candidate, classes = self.lookup.candidate()
        self._offered = (len(context), candidate, classes)
        if controller.fixed_k is not None and self._own is None:
            self._own = KController(controller.k_max, fixed_k=controller.fixed_k)
        self._plan = choose(controller, candidate, classes, self.model.lag(context), cap, self._own)
        return self._plan.k

    def propose(self, context, k, sampling, rng, grammar=None) -> Draft:
        plan = self._plan
        if plan.source == "lookup":
            return self.lookup.propose(context, k, sampling, rng)
        if plan.source == "model" or plan.m == 0:
            return self.model.propose(context, k, sampling, rng, grammar=grammar)
        prefix = self.lookup.propose(context, plan.m, sampling, rng)
        if grammar is not None:   # the model's part follows the prefix: its mask too
            for t in prefix.tokens:
                if not grammar.allowed([t])[0]:
                    return prefix   # verified no further than the forbidden token anyway
                if self.model.model.is_eog(t):
                    return prefix   # the text ends there (the grammar allowed it): nothing follows
                grammar.accept(t)
        rest = self.model.propose([*context, *prefix.tokens], k - plan.m, sampling, rng, grammar=grammar)
        q = None if rest.q is None else [None] * plan.m + list(rest.q)
        return Draft([*prefix.tokens, *rest.tokens], q, rest.t_host, "mixed",
                     plan.m, prefix.classes, rest.n_first, rest.t_first, catchup=rest.catchup)

    def draft_ahead(self, context, draft, sampling, rng, guessing, done) -> None:
        """A model-only draft goes on while the target verifies it (`overlap`)."""
        self.model.draft_ahead(context, draft, sampling, rng, guessing, done)

    def _score_unused(self, context, controller) -> None:
        """Score lookup's candidate of the last step, if the step did not use it, against what the
        step emitted. A proposal x is accepted with probability p(x), and the emitted token is x
        with the same probability whoever drafted (the output has the target's law), so this is
        an unbiased trial of lookup's classes, and free: without it lookup's rates learn only on
        the steps it wins, and stay stale where the model serves."""
        if self._unused is None:
            return
        at, candidate, classes = self._unused
        self._unused = None
        emitted = context[at:at + len(candidate)]
        n = common_prefix(candidate, emitted)
        for record in self._records(controller):
            record.lookup.observe(classes[:len(emitted)], n)

    def learn(self, controller, k, draft, n_accepted, t_draft, t_verify) -> None:
        n = len(draft.tokens) if draft else 0
        controller.observe_verify(n + 1, t_verify)
        self.lookup.forget()
        if not (draft and draft.n_lookup) and self._offered and self._offered[1]:
            self._unused = self._offered
        if draft is None or n == 0:
            return
        drafting, catchup = split_draft_time(controller, draft, t_draft)
        m = draft.n_lookup
        for record in self._records(controller):
            if m:
                record.lookup.observe(draft.classes, min(n_accepted, m))
            if n > m and n_accepted >= m:   # the model's tokens were reached: they were tested
                # after a lookup prefix the catch-up is mostly reading it, which `choose` prices per
                # plan: only a model-only draft's catch-up is a resume after plain steps
                record.observe_draft(n - m, n_accepted - m, drafting, catchup if m == 0 else 0.0,
                                     n_timed=n - m - draft.n_ahead)
