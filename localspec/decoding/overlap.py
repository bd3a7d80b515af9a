"""Drafting while the target verifies (PEARL's "post-verify" overlap, Liu et al. 2024).

When the target's decode waits on something other than this CPU — round trips to RPC workers, a
GPU — the draft model can go on drafting meanwhile: past its chain, its next token a guess at the
target's bonus token, then the tokens after that guess. Where the target accepts the whole chain and
its bonus token equals the guess, those tokens are the next step's draft, already made; otherwise
they are dropped (the draft's cache is rewound by the next proposal, as after any rejection).

Exactness is the acceptance rule's as ever: a token drafted ahead was sampled from the draft's
distribution after the guess, and it is used only where the text is that guess; given that text, it
is distributed as a token drafted afresh would be, and its distribution row is kept for the rule
(`ModelDrafter.draft_ahead`).

Reproducibility: how far drafting ahead gets depends on timing, so it must not move any draw the
text depends on. The guess draws from a stream of its own (the text never depends on the guess,
only whether drafts made ahead are used does). The tokens after it draw from a copy of the drafting
stream: the very draws the next proposal would make afresh, on the same rows. Where they are used,
the drafting stream moves on past their draws, as if the proposal had drawn them; where they are
not, it has not moved. Either way the next draft holds the same tokens, so a seed gives the same
text however far drafting ahead got (up to the draft's rounding: a row decoded one token at a time
may differ in its last bits from one decoded beside another token). Exact still: those draws were
made by no token the text holds, and whether they are used depends on the guess and the target's
draws only.

The target's decode runs in a thread: llama.cpp's decode lets the GIL go, so the main thread drafts
meanwhile. The thread is always joined before the step goes on, a Ctrl-C included (a decode is
short; the engine stops one at an interrupt anyway).

It pays only where drafting finds a core the target's decode leaves free. A worker on this machine
(measured: the worker's 2 threads on the 2 cores the draft uses) computes slower beside the draft,
and overlapping lost 10-35 % there; so `Judge` watches the target's first decodes, and overlaps only
where other work left a core of this process's free while they ran.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Callable, Sequence, TypeVar
from weakref import WeakKeyDictionary

from localspec import machine

T = TypeVar("T")

AHEAD_MAX = 16   # tokens a draft model drafts past its chain while the target verifies: more are
                 # seldom reached in one verify, and each may overrun it by a draft decode
JUDGED = 4       # target decodes watched before overlapping is decided: /proc/stat counts 10 ms ticks,
                 # so fewer (of ~30-100 ms each over RPC) would misjudge
FREE_CORE = 0.75   # cores other work must leave free during those decodes for the draft to use


class Judge:
    """Whether the draft finds a free core while the target decodes: from what the CPUs this process
    may use did during the target's first JUDGED decodes (`machine.usage`: other work's cores, a
    worker's on this machine among them). Where that cannot be read (no /proc/stat), it overlaps.
    One per loaded target (`of`): its generations share the verdict."""

    @staticmethod
    def of(target) -> "Judge":
        judge = _judges.get(target)
        if judge is None:
            judge = _judges[target] = Judge()
        return judge

    def __init__(self) -> None:
        self.verdict: bool | None = None
        self._other = 0.0   # core-seconds other work used during the decodes watched
        self._seconds = 0.0
        self._seen = 0

    def watch(self, decode: Callable[[], T]) -> T:
        """Run `decode` (a target decode, not overlapped), watching the CPUs until the verdict."""
        if self.verdict is not None:
            return decode()
        before = machine.sample()
        result = decode()
        used = machine.usage(before)
        if used.other_cores is None:
            self.verdict = True
        else:
            self._other += used.other_cores * used.seconds
            self._seconds += used.seconds
            self._seen += 1
            if self._seen >= JUDGED:
                self.verdict = machine.usable_cpus() - self._other / self._seconds >= FREE_CORE
        return result


def overlapped(verify: Callable[[], T], ahead: Callable[[Callable[[], bool]], None]) -> tuple[T, float, float]:
    """Run `verify` in a thread while `ahead(done)` runs here (`done()`: whether verify has
    returned). Returns (verify's result, perf_counter() when it returned, seconds `ahead` ran past
    that moment). Raises what verify raised, or what `ahead` raised, after the thread has ended."""
    box: dict = {}
    finished = threading.Event()

    def work() -> None:
        try:
            box["result"] = verify()
        except BaseException as e:   # noqa: BLE001 - handed to the caller's thread
            box["error"] = e
        finally:
            box["at"] = time.perf_counter()
            finished.set()

    thread = threading.Thread(target=work, name="localspec-verify", daemon=True)
    thread.start()
    try:
        ahead(finished.is_set)
    finally:
        _join(thread)
    if "error" in box:
        raise box["error"]
    return box["result"], box["at"], max(time.perf_counter() - box["at"], 0.0)


def _join(thread: threading.Thread) -> None:
    """Join even through a Ctrl-C (raised after): the target's cache must not be touched while its
    decode runs."""
    interrupted = False
    while True:
        try:
            thread.join()
            break
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt


class Ahead:
    """What `draft_ahead` made: `tokens` (the guess first) drafted after the text
    context[:base] + after (`after`: the chain, then the guess), their distribution rows, the
    drafting stream's state before them (`origin`) and after each token past the guess (`draws`),
    and the draft cache's length before them (`held`)."""

    __slots__ = ("base", "after", "tokens", "rows", "origin", "draws", "held")

    def __init__(self, base, after, tokens, rows, origin, draws, held):
        self.base, self.after, self.tokens, self.rows = base, after, tokens, rows
        self.origin, self.draws, self.held = origin, draws, held


def draft_ahead(drafter, context: Sequence[int], tokens: Sequence[int], sampling, rng, guessing, done):
    """For a `ModelDrafter` that just proposed the chain `tokens` after `context`, while the target
    verifies it: draft on until `done()`, a guess at the target's bonus token first (drawn from
    `guessing`), then tokens drawn from a copy of `rng`, the drafting stream (see the module), each
    sampled as `propose` samples (no processing, no grammar: the decoder overlaps only steps without
    them). Returns an `Ahead`, or None."""
    m = drafter.model
    held = len(m.tokens)
    if held != len(context) - drafter.offset + len(tokens) - 1:
        return None   # not the cache `propose` leaves (a draft cut short by a token the model lacks)
    origin = rng.bit_generator.state
    peek = copy.deepcopy(rng)
    out: list[int] = []
    rows: list = []
    draws: list[dict] = []
    x = tokens[-1]
    while not done() and len(out) <= AHEAD_MAX and len(m.tokens) + 1 < m.n_ctx:
        if m.is_eog(x) or x >= drafter.target_vocab or x >= m.n_vocab:
            break
        x = drafter.pick(m.eval([x], logits_from=0)[0], sampling, peek if out else guessing, rows)
        if out:
            draws.append(peek.bit_generator.state)
        out.append(x)
    if len(out) < 2:
        return None
    return Ahead(len(context), [*tokens, out[0]], out, rows, origin, draws, held)


def take_ahead(drafter, context: Sequence[int], k: int, grammar, rng) -> tuple[list[int], list]:
    """The tokens `draft_ahead` made after its guess (at most k, with their rows) where the text is
    the one they were drafted after (the chain all accepted, the target's bonus token the guess)
    and the drafting stream `rng` has drawn nothing since; `rng` then moves past their draws. The
    draft's cache then holds the text and all but the last of them, as after any proposal. Used
    once: whatever the answer, the run is dropped."""
    ahead, drafter._ahead = drafter._ahead, None
    if ahead is None or grammar is not None or drafter.seqs_used or k < 1:
        return [], []
    m, at, out = drafter.model, ahead.base + len(ahead.after), ahead.tokens
    if len(context) != at or list(context[ahead.base:]) != ahead.after:
        return [], []   # another text: the chain was not all accepted, or the bonus not the guess
    if len(m.tokens) != at - drafter.offset + len(out) - 2 or rng.bit_generator.state != ahead.origin:
        return [], []   # the draft's cache or the drafting stream moved since (a later proposal)
    n = min(k, len(out) - 1)
    m.truncate(at - drafter.offset + n - 1)
    rng.bit_generator.state = ahead.draws[n - 1]
    return out[1:n + 1], ahead.rows[1:n + 1]


_judges: WeakKeyDictionary = WeakKeyDictionary()
