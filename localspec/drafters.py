"""Drafters: cheap proposers of the next few tokens, behind one small interface.

A drafter is asked `limit(context)` (how many tokens it could offer now; None = any number) and then
`propose(context, k, ...)`. It is told after verification how many of its tokens were accepted.
Drafters never decide what is emitted — only the acceptance rule does — so a bad draft costs speed,
never correctness.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from .config import SamplingConfig
from .prefix import common_prefix
from .dists import Dist
from .sampling import BadLogits, distribution


# A drafter at most this many tokens behind the text catches up in the first draft decode, at about
# its usual price; further behind, the catch-up is a resume cost of its own (KController prices it).
SYNC_LAG = 4


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    """Proposed continuation, possibly shorter than asked (or empty)."""
    q: list[Dist] | None = None
    """The distribution each token was sampled from; None for drafts that have no distribution
    (prompt lookup, greedy drafts), verified as one-hot proposals."""
    t_catchup: float = 0.0
    """Seconds spent bringing the drafter up to date with text it had not seen (after plain steps);
    a one-off cost that must not be mistaken for the per-token price of drafting."""
    t_host: float = 0.0
    """Seconds of host work (turning the draft's logits into tokens), part of the drafting time."""


class Drafter(Protocol):
    name: str
    draft_cost_free: bool
    """True when proposing costs (almost) nothing, e.g. a table lookup."""

    def prepare(self, context: Sequence[int]) -> None:
        """Called once after the prompt is known, so its cost counts as prefill, not drafting."""

    def limit(self, context: Sequence[int], k_max: int) -> int | None: ...

    def lag(self, context: Sequence[int]) -> int:
        """Tokens of `context` the drafter would have to read before drafting (0 = in step)."""

    def propose(
        self, context: Sequence[int], k: int, sampling: SamplingConfig, rng: np.random.Generator
    ) -> Draft: ...

    def feedback(self, n_drafted: int, n_accepted: int) -> None: ...


class ModelDrafter:
    """A small GGUF sharing the target's tokenizer, drafting autoregressively.

    Its KV cache follows the accepted text by common prefix: after a rejection only the rejected
    tail is removed and the one or two tokens it has not seen are fed, never a re-prefill.
    """

    name = "model"
    draft_cost_free = False

    # Catching up on a long stretch of plain decoding costs the draft a prefill of every token it
    # missed, so probing "is speculation paying again?" would cost a fixed share of all plain
    # decoding however rarely it is done. Past MAX_CATCHUP missed tokens the draft restarts on the
    # last WINDOW tokens of the text instead: a bounded price, and recent text is what predicts
    # the next few tokens.
    MAX_CATCHUP = 64
    WINDOW = 48

    def __init__(self, model, target_vocab: int | None = None):
        self.model = model
        self.target_vocab = target_vocab or model.n_vocab
        self.offset = 0  # the draft's cache holds context[offset:]

    def prepare(self, context: Sequence[int]) -> None:
        lacking = [i for i, t in enumerate(context) if t >= self.model.n_vocab]
        self.offset = lacking[-1] + 1 if lacking else 0  # see propose
        self.model.sync(context[self.offset:-1])

    def limit(self, context: Sequence[int], k_max: int) -> int | None:
        return None

    def lag(self, context: Sequence[int]) -> int:
        # The cache holds a prefix of context[offset:] plus at most a rejected tail (never longer
        # than one draft), so this counts what a proposal would first have to feed.
        return max(len(context) - self.offset - len(self.model.tokens), 0)

    def propose(self, context, k, sampling, rng) -> Draft:
        m = self.model
        view = context[self.offset :]
        keep = min(common_prefix(m.tokens, view), len(view) - 1)
        if len(view) - keep > self.MAX_CATCHUP:
            self.offset = max(len(context) - self.WINDOW, 0)
            view, keep = context[self.offset :], 0
        fresh = view[keep:]
        if fresh and max(fresh) >= m.n_vocab:
            # A target with a padded vocabulary emitted an id this draft lacks (llama.cpp would
            # refuse it): the draft reads on from the text after it, and drafts nothing until then.
            self.offset += keep + max(i for i, t in enumerate(fresh) if t >= m.n_vocab) + 1
            view, keep = context[self.offset:], 0
            fresh = view
        if not fresh:
            m.truncate(0)
            return Draft([])
        m.truncate(keep)
        start = time.perf_counter()
        logits = m.eval(fresh, logits_from=-1)
        # Usually 1-2 unseen tokens (the target's last token, maybe the last draft); more means it
        # sat out plain steps and had to catch up.
        catchup = time.perf_counter() - start if len(view) - keep > SYNC_LAG else 0.0
        tokens: list[int] = []
        rows: list[Dist] = []
        host = 0.0
        for i in range(k):
            h = time.perf_counter()
            if sampling.greedy:
                x = int(logits[0].argmax())
            else:
                try:
                    q = distribution(logits[0], sampling)
                except BadLogits as e:
                    e.model = f"the draft {m.name}"
                    raise
                x = q.sample(rng)
                rows.append(q)
            tokens.append(x)
            host += time.perf_counter() - h
            if m.is_eog(x) or x >= self.target_vocab or i == k - 1:
                break  # nothing sensible follows an end of generation or an id the target lacks
            logits = m.eval([x], logits_from=0)
        # Greedy drafts are checked against the target's argmax; no distribution is needed. Ids
        # past one vocabulary's end have p = 0 or q = 0 there, which the rule handles.
        return Draft(tokens, rows or None, catchup, host)

    def feedback(self, n_drafted: int, n_accepted: int) -> None:
        pass  # the cache catches up by common prefix on the next proposal


class PromptLookup:
    """Prompt-lookup drafting: find the latest earlier occurrence of the text's last n tokens
    (longest n first) and propose what followed it.

    The n-gram index is updated incrementally as tokens arrive; it maps each n-gram to the end
    position of its most recent occurrence that has a known continuation.
    """

    name = "lookup"
    draft_cost_free = True

    def __init__(self, ngram_max: int = 4, ngram_min: int = 2):
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self._index: dict[tuple[int, ...], int] = {}
        self._seen: list[int] = []
        self._candidate: list[int] = []

    def prepare(self, context: Sequence[int]) -> None:
        self._update(context)

    def _update(self, context: Sequence[int]) -> None:
        n_seen = len(self._seen)
        if len(context) < n_seen or context[:n_seen] != self._seen:
            self._index.clear()  # a different text (new conversation): start over
            self._seen = []
            n_seen = 0
        self._seen.extend(context[n_seen:])
        # n-grams ending at e are indexed once token e+1 exists; re-index the boundary position.
        for e in range(max(n_seen - 1, 0), len(context) - 1):
            for n in range(self.ngram_min, min(self.ngram_max, e + 1) + 1):
                self._index[tuple(context[e - n + 1 : e + 1])] = e

    def limit(self, context: Sequence[int], k_max: int) -> int:
        """Find the match and return how many tokens it offers: no more than the match is long,
        since a long identical run (the model copying its input) predicts a long continuation
        while a two-token coincidence predicts little. Each rejected token costs a verify row."""
        self._update(context)
        self._candidate = []
        size = len(context)
        for n in range(min(self.ngram_max, size), self.ngram_min - 1, -1):
            end = self._index.get(tuple(context[size - n :]))
            if end is not None:
                length = n
                while length < k_max and end - length >= 0 and context[end - length] == context[size - 1 - length]:
                    length += 1
                self._candidate = list(context[end + 1 : end + 1 + min(k_max, length)])
                break
        return len(self._candidate)

    def lag(self, context: Sequence[int]) -> int:
        return 0  # the index is brought up to date for free

    def propose(self, context, k, sampling, rng) -> Draft:
        if not self._candidate:
            self.limit(context, k)
        return Draft(self._candidate[:k])

    def feedback(self, n_drafted: int, n_accepted: int) -> None:
        self._candidate = []
