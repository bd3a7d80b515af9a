"""Drafters: cheap proposers of the next few tokens, behind one small interface.

The decoder asks a drafter to `plan(context, cap, controller)` (how many tokens to draft now; 0 =
a plain step), then to `propose(context, k, ...)`, and after verification tells it with `learn`
what was accepted and what it cost; the controller keeps what is learned (costs, acceptance).
Drafters never decide what is emitted — only the acceptance rule does — so a bad draft costs speed,
never correctness. Here: the interface, prompt lookup, and what the drafters share; the draft model
is `model_drafter.ModelDrafter`, `auto.AutoDrafter` both behind one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from localspec.config import SamplingConfig
from .dists import Dist
from .lookup import NGRAM_MAX, NGramStore
from .tree import DraftTree


# A drafter at most this many tokens behind the text catches up in the first draft decode, at about
# its usual price; further behind, the catch-up is a resume cost of its own (KController prices it).
SYNC_LAG = 4


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    """Proposed continuation, possibly shorter than asked (or empty)."""
    q: list[Dist | None] | None = None
    """The distribution each token was sampled from; None for drafts that have no distribution
    (prompt lookup, greedy drafts), verified as one-hot proposals. In a mixed draft the lookup
    positions hold None (one-hot) and the model's positions their distribution."""
    t_host: float = 0.0
    """Seconds of host work (turning the draft's logits into tokens), part of the drafting time."""
    source: str = ""
    """Who drafted: "model", "lookup", or "mixed" (a lookup prefix extended by the model)."""
    n_lookup: int = 0
    """How many of `tokens`, from the front, came from prompt lookup."""
    classes: tuple[int, ...] = ()
    """The match class of each lookup token (see lookup.py), for learning their acceptance."""
    n_first: int = 0
    """Tokens the draft model read in its first decode of this draft (0: no model decode)."""
    t_first: float = 0.0
    """Seconds of that first decode: with n_first, the draft's cost of catching up."""
    catchup: tuple[int, float] = (0, 0.0)
    """(tokens, seconds) of a catch-up the draft model read in a decode of its own before that
    first decode (`ModelDrafter.start`); (0, 0.0) where the first decode read it."""
    tree: DraftTree | None = None
    """A draft tree (tree_drafts): `tokens` and `q` are then its nodes', `n_lookup` counts them all
    for lookup's trees, and `classes` are those of its first-ranked branch."""
    n_ahead: int = 0
    """How many of `tokens`, from the front, were drafted while the last step's target verified
    (`overlap`): not part of this step's drafting time."""


class Drafter(Protocol):
    name: str
    draft_cost_free: bool
    """True when proposing costs (almost) nothing, e.g. a table lookup."""

    def prepare(self, context: Sequence[int]) -> None:
        """Called once after the prompt is known, so its cost counts as prefill, not drafting."""

    def plan(self, context: Sequence[int], cap: int, controller) -> int:
        """How many tokens to draft now (0 = a plain step), at most `cap`."""

    def propose(
        self, context: Sequence[int], k: int, sampling: SamplingConfig, rng: np.random.Generator,
        grammar=None,
    ) -> Draft:
        """Up to k tokens after `context`. `grammar`: under a grammar with the draft masked, a state
        after the context (the drafter's own fork, to advance) that its rows are masked by."""

    def learn(self, controller, k: int, draft: Draft | None, n_accepted: int, t_draft: float,
              t_verify: float) -> None:
        """Told how the step went: the controller learns costs and acceptance from it."""


class _Single:
    """plan/learn for a drafter that the KController drives alone (the draft model)."""

    def plan(self, context, cap, controller) -> int:
        self.follow(controller)
        limit = self.limit(context, cap)
        in_sync = self.lag(context) <= SYNC_LAG
        return controller.choose(cap if limit is None else min(limit, cap), in_sync=in_sync)

    def learn(self, controller, k, draft, n_accepted, t_draft, t_verify) -> None:
        n = len(draft.tokens) if draft else 0
        drafting, catchup = split_draft_time(controller, draft, t_draft)
        controller.observe(k, n, n_accepted, drafting, t_verify, catchup, n_timed=n - (draft.n_ahead if draft else 0))


def split_draft_time(controller, draft: Draft | None, t_draft: float) -> tuple[float, float]:
    """(drafting proper, catch-up) seconds of a draft that took t_draft. The catch-up is what its
    first decode spent reading more than the usual one or two tokens (text the model missed: plain
    or lookup steps, a lookup prefix); the first decode's cost line is learned on the way. Split so,
    every timing of k drafted tokens measures the same thing (a usual first decode + k - 1 single
    ones), however far behind the model was; leaving the catch-up in would make drafting look
    dearer (a two-point line once priced a token at 14 ms where it costs 9, and the model was
    dropped), taking the whole first decode out would make it look cheaper. A catch-up read in a
    decode of its own (`ModelDrafter.start`, while that line is unknown) is all catch-up, and a
    point on the line: a decode of that many tokens."""
    catchup = 0.0
    if draft is not None and draft.catchup[0]:
        controller.first_decode.observe(*draft.catchup)
        catchup = draft.catchup[1]
    if draft is not None and draft.n_first:
        controller.first_decode.observe(draft.n_first, draft.t_first)
        catchup += min(controller.first_decode.extra(draft.n_first), draft.t_first)
    return t_draft - catchup, catchup


class PromptLookup:
    """Prompt-lookup drafting from an n-gram store over the text (lookup.py), which lives as
    long as the drafter: across the turns of a chat, and the requests of a server's drafter.

    The draft length is chosen from the acceptance measured for each class of match
    (`KController.lookup`) against the measured verify costs: drafting costs next to nothing, so
    a token is worth proposing when its chance of acceptance pays for its verify row.
    """

    name = "lookup"
    draft_cost_free = True

    def __init__(self, ngram_max: int = NGRAM_MAX):
        self.store = NGramStore(ngram_max)
        self._candidate: list[int] = []
        self._classes: list[int] = []

    def prepare(self, context: Sequence[int]) -> None:
        self.store.update(context)

    def limit(self, context: Sequence[int], k_max: int, controller=None) -> int:
        """Find the candidate continuation (up to k_max tokens) and return its length. With an
        adaptive `controller`, no further than its tokens could still pay: a token whose chance of
        being reached and accepted is under REACH_MIN, or under what its verify row costs against
        a plain pass (`KController.row_share`), earns less than that row, as every token after it
        does (their chances only fall): no plan that beats plain decoding drafts it. On a pass of a
        few milliseconds with steep rows (a 128k output layer on a CPU: 0.3-0.8 of a pass a row), the
        short matches of sampled text then end before their first token, and the step skips
        pricing them (~0.1 ms)."""
        self.store.update(context)
        rates, reach_min = None, REACH_MIN
        if controller is not None and controller.fixed_k is None:
            rates = controller.lookup.table(LOOKUP_OPTIMISM)
            reach_min = max(REACH_MIN, controller.row_share())
        self._candidate, self._classes = self.store.candidate(context, k_max, rates, reach_min)
        return len(self._candidate)

    def lag(self, context: Sequence[int]) -> int:
        return 0  # the store is brought up to date for free

    def candidate(self) -> tuple[list[int], list[int]]:
        """The tokens and classes found by the last `limit`."""
        return self._candidate, self._classes

    def plan(self, context, cap, controller) -> int:
        n = self.limit(context, cap, controller)
        if n == 0:
            k = 0                                # nothing to draft
        elif controller.fixed_k is not None:
            k = min(controller.fixed_k, n)
        elif controller.plain_due():
            k = 0                                # time t_verify(1) first, and now and then
        else:
            k = best_lookup(controller, self._classes)[0]
        controller.last_k = k
        return k

    def propose(self, context, k, sampling, rng, grammar=None) -> Draft:
        # lookup drafts what the text holds; the decoder verifies no further than the grammar allows
        if not self._candidate:
            self.limit(context, k)
        return Draft(self._candidate[:k], source="lookup", n_lookup=min(k, len(self._candidate)),
                     classes=tuple(self._classes[:k]))

    def learn(self, controller, k, draft, n_accepted, t_draft, t_verify) -> None:
        if draft is not None and draft.tokens:
            controller.lookup.observe(draft.classes, n_accepted)
        controller.observe(k, len(draft.tokens) if draft else 0, n_accepted, t_draft, t_verify)
        self.forget()

    def forget(self) -> None:
        """Drop the step's candidate: the next step looks up afresh from the text it brings."""
        self._candidate, self._classes = [], []


LOOKUP_OPTIMISM = 1.0
"""Standard errors added to a seldom-tried lookup class's acceptance when choosing (lookup.py)."""
REACH_MIN = 0.02
"""A lookup candidate ends before a token whose chance of being reached and accepted (the product
of its and the earlier tokens' class rates, with LOOKUP_OPTIMISM) is below this: such a token adds
under 2 % of a token to a step, less than any verify row costs."""


def lookup_expectation(controller, classes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(reach, tokens) for drafting the first m lookup tokens, m = 0..len(classes): reach[m] is
    P(all m accepted), tokens[m] the expected tokens the step yields (the target's own included)."""
    reach, tokens = _lookup_prefixes(controller, classes)
    return np.array(reach), np.array(tokens)


def _lookup_prefixes(controller, classes: Sequence[int]) -> tuple[list[float], list[float]]:
    """`lookup_expectation` as lists, in scalar arithmetic: a handful of tokens, priced on the
    steps plain decoding wins (numpy's fixed cost per call was ~0.15 ms there, cache-cold beside
    a GPU-class pass)."""
    table = controller.lookup.table(LOOKUP_OPTIMISM)
    reach, tokens = [1.0], [1.0]
    for c in classes:
        reach.append(reach[-1] * table[c])
        tokens.append(tokens[-1] + reach[-1])
    return reach, tokens


def best_lookup(controller, classes: Sequence[int], last_fit: bool = False) -> tuple[int, float]:
    """The number of lookup tokens to verify (0..len(classes)) that maximises expected tokens per
    second of target time, and that rate; `last_fit`: priced with the verify curve as last fitted
    (`VerifyCost.last_fit`, for a step held plain; not in a batch, whose curve is its share)."""
    tokens = _lookup_prefixes(controller, classes)[1]
    top = len(classes) + 1
    if last_fit and controller.batch is None:
        verify = controller.verify_costs.last_fit()[:top]
    else:
        verify = controller.verify_curve(top).tolist()
    best, k = tokens[0] / verify[0], 0
    for m in range(1, len(tokens)):   # ties go to the shorter draft
        rate = tokens[m] / verify[m]
        if rate > best:
            best, k = rate, m
    return k, best
