"""One controller for a batch of concurrent generations: what a generation's rows cost the batch.

When several generations share each target decode (`engine.slots`), the decode's time depends on
the rows of all of them together: a line a + c·R in the batch's total rows R on a CPU, nearly flat
on a GPU. Each generation keeps its own `KController` (its acceptance, its probes), and each asks
`BatchCosts` what its rows cost, so that the k each one chooses maximises the tokens per second
of the whole batch rather than its own:

    total rate = (E_o + E_i(k)) / (V(R_o + k + 1) + drafting),

E the expected tokens and R the rows of generation i and of the others (o, as each verified at
its last step). With V linear that optimum is the one of generation i's own rate
E_i(k) / V_i(k + 1), where V_i is its share of the batch's cost,

    V_i(b) = V(R_o + b) − V(R_o + 1) + V(n) / n,

the rows it adds at the batch's marginal price plus an equal share of a decode of n plain rows
(n generations). With one generation V_i is V itself, the single-generation rule unchanged. So the
controller's every rule (the best k, probes, lookup's and auto's choices) works unchanged on V_i,
and at high concurrency, where every row costs its full price, the measurement leads to k = 0.

What V measures: a batch step's whole cycle, from the end of one target decode to the end of the
next, less the draft model's decodes in it: the target's decode and every generation's Python
work (acceptance, drafting's host side, bookkeeping), which runs one generation at a time and
costs the batch as much as a decode's rows do (measured: pricing the decode alone chose drafts that
ran at 0.53× plain batched decoding at c = 4). The draft model's decodes are shared the same way
(the batcher decodes the draft rows of every drafting generation together): `draft` learns their
seconds by rows, and a generation drafting k tokens counts k decodes' share, D(n) / n each.

Measured, not assumed: the model leaves out what a step does not show, above all the draft
model reading text it missed (a new prompt, a catch-up after plain steps), which stops every
generation while it runs. So the batch also measures what it delivers: tokens per second of whole
steps (every decode and all Python in them) where some generation speculated, against steps where
all decoded plainly, at the same number of generations. After SPEC_WINDOW speculating steps whose
rate is below plain's, every generation decodes plainly for HOLD steps (doubled after each
failure, up to HOLD_MAX), and then speculation gets its chance again; a hold with n generations
holds with more too. On this 2-core CPU, plain
batched decoding of 4 generations runs at twice the speed of one, and the draft model's rows do
not share as well: this is what keeps speculation from costing there.

The batch's decodes are timed by the batcher (never by a generation, whose timings include its
waits for the others) and reported here while every generation waits, so these numbers are never
read and written at once.
"""

from __future__ import annotations

import time

import numpy as np

from localspec.config import MAX_TREE_NODES
from .costs import VerifyCost
from .policy import REFRESH_PLAIN


SPEC_WINDOW = 16    # speculating steps measured before speculation is judged against plain: more
                    # averages over the catch-ups that follow a hold, fewer judges sooner
CLEAR_WINDOW = 2    # ...but after this many a clear loss is judged at once: a speculating step of
CLEAR_LOSS = 0.7    # a batch is long (seen: 220 ms against 35 ms plain, at 0.5x plain's rate)
HOLD = 256          # steps of plain decoding everywhere after speculation measured slower: the
                    # window that judges it again costs a few % of plain's speed
HOLD_MAX = 4096     # the longest hold, after repeated failures
RATE_WEIGHT = 0.2   # of a plain step's rate in its EWMA


class BatchCosts:
    """Shared by the controllers of the generations that run together."""

    def __init__(self, slots: int) -> None:
        self.max_rows = slots * (MAX_TREE_NODES + 1)
        self.verify = VerifyCost(self.max_rows - 1)   # a step's seconds by target rows in the batch
        self.draft = VerifyCost(slots * (MAX_TREE_NODES + 1))   # draft decode seconds by rows
        self.rows: dict[int, int] = {}               # slot -> rows it verified at its last step
        self.decodes = 0                             # target decodes timed
        self._plain_at = -REFRESH_PLAIN              # the decode that last timed all plain rows
        self._since: float | None = None             # end of the last target decode (None: idle)
        self._drafting = 0.0                         # draft decode seconds since then
        # what steps deliver: the last step's (seconds, had a prefill), the tokens and the
        # generations reported for it since, and whether any of them speculated
        self._step: tuple[float, bool] | None = None
        self._tokens, self._reported, self._speculated = 0, 0, False
        self.plain_rate: dict[int, float] = {}       # generations -> tokens/s of plain steps (EWMA)
        self._windows: dict[int, list] = {}          # generations -> speculating steps' tokens, seconds, count
        # per number of generations: plain everywhere until this decode; the next hold's length
        self._hold_until: dict[int, int] = {}
        self._hold: dict[int, int] = {}
        self.held = 0                                # holds so far (for reports)

    # -- membership, from the slots' threads ------------------------------------------------------
    def join(self, slot: int) -> None:
        self.rows[slot] = 1

    def leave(self, slot: int) -> None:
        self.rows.pop(slot, None)
        if not self.rows:   # idle time until the next generation is no step's
            self._since = None

    @property
    def n(self) -> int:
        return max(len(self.rows), 1)

    # -- timings, from the batcher ----------------------------------------------------------------
    def observe(self, rows: int, seconds: float, draft: bool = False, read: int = 0) -> None:
        """A decode of `rows` rows (every generation's) took `seconds`: the target's, or with
        `draft` the draft model's. `read`: rows without logits (a prompt, or a draft catching up
        on text; a row with logits costs several times more: the output layer). Such a decode is
        not a step's cost by rows and is not learned from. A step whose target decode read a
        prompt is not judged either (plain decoding reads it too); the draft's reading is
        speculation's own cost and counts."""
        now = time.perf_counter()
        if draft:
            if not read:
                self.draft.observe(rows, seconds)
            self._drafting += seconds
            return
        prefill = read > 0
        whole = None if self._since is None else now - self._since
        step = seconds if whole is None else max(whole - self._drafting, seconds)
        self._since, self._drafting = now, 0.0
        self._judge()
        self._step = None if whole is None else (whole, prefill)
        if prefill:
            return
        self.decodes += 1
        self.verify.observe(rows, step)
        if rows <= len(self.rows):    # every generation verified one row: a plain step's price
            self._plain_at = self.decodes

    def emitted(self, tokens: int, speculated: bool) -> None:
        """A generation's step (the one the last target decode verified) gave `tokens` tokens."""
        self._tokens += tokens
        self._reported += 1
        self._speculated |= speculated

    def _judge(self) -> None:
        """The step that has just ended is complete: learn its rate; judge speculation."""
        step, tokens, n, speculated = self._step, self._tokens, self._reported, self._speculated
        self._tokens, self._reported, self._speculated = 0, 0, False
        if step is None or not tokens or step[1]:   # a prompt's prefill is no step's price
            return
        seconds = step[0]
        if not speculated:
            old = self.plain_rate.get(n)
            rate = tokens / seconds
            self.plain_rate[n] = rate if old is None else (1 - RATE_WEIGHT) * old + RATE_WEIGHT * rate
            return
        w = self._windows.setdefault(n, [0, 0.0, 0])
        w[0] += tokens
        w[1] += seconds
        w[2] += 1
        plain = self.plain_rate.get(n)
        if plain is None or w[2] < CLEAR_WINDOW or (w[2] < SPEC_WINDOW and w[0] / w[1] >= CLEAR_LOSS * plain):
            return
        if w[0] / w[1] < plain:
            hold = self._hold.get(n, HOLD)
            self._hold_until[n] = self.decodes + hold
            self._hold[n] = min(2 * hold, HOLD_MAX)
            self.held += 1
        else:
            self._hold[n] = HOLD
        self._windows[n] = [0, 0.0, 0]

    # -- what a generation's rows cost --------------------------------------------------------------
    def known(self) -> bool:
        return bool(self.verify.by_size)

    def plain_due(self) -> bool:
        """Plain rows everywhere now: to time V(n) (never timed, or not lately), or held there
        because speculating steps delivered less than plain ones."""
        return (not self.known() or self.decodes - self._plain_at >= REFRESH_PLAIN
                or self.held_at(len(self.rows)))

    def held_at(self, n: int) -> bool:
        """Held plain with n generations: speculation lost lately with n or fewer (more
        generations only make plain batched decoding stronger: each row of theirs is cheaper)."""
        return any(self.decodes < until for m, until in self._hold_until.items() if m <= n)

    def share(self, slot: int, top: int) -> np.ndarray:
        """V_slot(b) for b = 1..top: seconds of the batch's decode this slot's b rows account for."""
        n = self.n
        others = sum(self.rows.values()) - self.rows.get(slot, 0)   # no Python runs while summed
        curve = self.verify.curve(others + top)
        b = np.arange(1, top + 1)
        own = curve[others + b - 1] - curve[others]
        return own + curve[min(n, len(curve)) - 1] / n


class SlotShare:
    """One generation's link to the batch (`KController.batch`)."""

    def __init__(self, costs: BatchCosts, slot: int) -> None:
        self.costs, self.slot = costs, slot

    def known(self) -> bool:
        return self.costs.known()

    def curve(self, top: int) -> np.ndarray:
        return self.costs.share(self.slot, top)

    def draft_seconds(self, k_top: int) -> np.ndarray | None:
        """Seconds of drafting k = 0..k_top tokens: k shared draft decodes (None: none timed)."""
        c = self.costs
        if not c.draft.by_size:
            return None
        n = c.n
        return np.arange(k_top + 1) * float(c.draft.curve(n)[n - 1]) / n

    def verified(self, rows: int) -> None:
        self.costs.rows[self.slot] = rows
        if rows == 1:
            self.costs.emitted(1, False)

    def accepted(self, n: int) -> None:
        self.costs.emitted(n + 1, True)

    def plain_due(self) -> bool:
        return self.costs.plain_due()
