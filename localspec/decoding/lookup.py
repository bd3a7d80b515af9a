"""Prompt lookup: an n-gram store over all the text seen, and acceptance learned per kind of match.

The store keeps, for every n-gram (n = 1..NGRAM_MAX) of the text, how often each token followed
it and where it last did. It outlives one prompt: a new text (the next chat turn, the next request)
is appended after a boundary, so what earlier texts said still counts, as in llama.cpp's
ngram-cache. A draft is built token by token, each from the longest n-gram that ends the text
plus what was drafted so far.

When several tokens have followed that n-gram, the one whose last occurrence continues the
longest match wins (the model copying a passage copies the place it is in, not a common
continuation), and among equally long matches the one seen most often, then the latest.

Each drafted token gets a class: how long the match behind it is (bucketed) and whether its
n-gram was followed by other tokens before. `LookupRates` learns the acceptance of each class, so
the draft length comes from what such matches have earned, not from the match length alone.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

NGRAM_MAX = 4
RUN_MAX = 32               # a match is measured back at most this far
BUCKETS = (1, 2, 3, 4, 8, 16, 32)   # match lengths where a class starts
N_CLASSES = 2 * len(BUCKETS)        # x 2: the n-gram had one continuation so far, or several
CAPACITY = 1 << 20         # tokens kept; past this the store starts over with the current text
_SEP = -1                  # between texts: no n-gram spans it

# Before any trial, a class is expected to accept this often (unique continuation; several: less),
# worth PRIOR_WEIGHT trials; each trial of a class discounts its older ones by DECAY.
PRIOR_UNIQUE = (0.2, 0.3, 0.4, 0.5, 0.65, 0.8, 0.9)
PRIOR_AMBIGUOUS_FACTOR = 0.6
PRIOR_WEIGHT = 2.0
DECAY = 0.97
_FULL = 1 / (1 - DECAY)


def bucket(length: int) -> int:
    """Index of the match-length bucket `length` falls in (BUCKETS are their lower bounds)."""
    b = 0
    while b + 1 < len(BUCKETS) and length >= BUCKETS[b + 1]:
        b += 1
    return b


def class_of(length: int, ambiguous: bool) -> int:
    return 2 * bucket(length) + int(ambiguous)


def describe_class(c: int) -> str:
    lo = BUCKETS[c // 2]
    hi = BUCKETS[c // 2 + 1] - 1 if c // 2 + 1 < len(BUCKETS) else None
    span = str(lo) if hi == lo else f"{lo}-{hi}" if hi else f"{lo}+"
    return f"match {span}" + (" (several continuations)" if c % 2 else "")


class NGramStore:
    """n-gram counts over every text seen, updated incrementally as the text grows."""

    def __init__(self, ngram_max: int = NGRAM_MAX, capacity: int = CAPACITY):
        self.ngram_max = ngram_max
        self.capacity = capacity
        self.text: list[int] = []
        self._start = 0           # where the current text begins in self.text
        self._index: dict[tuple[int, ...], dict[int, list[int]]] = {}

    def update(self, context: Sequence[int]) -> None:
        """Make `context` the current text: extend it, or start a new one after a boundary."""
        seen = len(self.text) - self._start
        if not self._continues(context, seen):
            if len(self.text) + len(context) > self.capacity:
                self.text, self._index = [], {}
            elif self.text:
                self.text.append(_SEP)
            self._start, seen = len(self.text), 0
        old = len(self.text)
        self.text.extend(context[seen:])
        text, index, start = self.text, self._index, self._start
        for j in range(max(old, start + 1), len(text)):  # j: position of a token that follows n-grams
            tok = text[j]
            for n in range(1, min(self.ngram_max, j - start) + 1):
                entry = index.setdefault(tuple(text[j - n:j]), {})
                seen_at = entry.get(tok)
                if seen_at is None:
                    entry[tok] = [1, j]
                else:
                    seen_at[0] += 1
                    seen_at[1] = j

    def _continues(self, context: Sequence[int], seen: int) -> bool:
        """Whether `context` extends the current text. Called every step, so it looks at a few
        positions, not all (comparing everything would cost O(context) per step): a decode's
        context only ever grows by what was accepted, and a new text (a chat's next turn, a
        request) that shares the first, middle and last seen tokens is treated as a continuation.
        A wrong guess could only mislead drafts, which verification catches; never the output."""
        if len(context) < seen:
            return False
        text, start = self.text, self._start
        return all(text[start + i] == context[i] for i in {0, seen // 2, seen - 1} if 0 <= i < seen)

    def may_follow(self, context: Sequence[int]) -> bool:
        """Whether any n-gram ending the text was followed before: every one that was includes its
        last token as a 1-gram, so one lookup answers for all (no, on most steps of new text)."""
        return bool(context) and (context[-1],) in self._index

    def _match(self, pos: int, tail: Sequence[int], known: int) -> int:
        """How many tokens before position `pos` of the text equal the end of `tail` (at least
        `known`, which the n-gram already guarantees; at most RUN_MAX)."""
        text = self.text
        n = known
        limit = min(RUN_MAX, len(tail), pos)
        while n < limit and text[pos - 1 - n] == tail[-1 - n]:
            n += 1
        return n

    def candidate(self, context: Sequence[int], k: int, rates: Sequence[float] | None = None,
                  reach_min: float = 0.0) -> tuple[list[int], list[int]]:
        """Up to k tokens predicted to follow `context` (which must be the current text, see
        `update`), and the class of each. With `rates` (acceptance per class) the candidate stops
        before a token whose chance that it and every one before it are accepted is below
        `reach_min`: worth less than its verify row, it would never be drafted, and on text
        with short matches everywhere (sampling at a high temperature) building it cost more
        host time per step than everything else lookup does."""
        if not self.may_follow(context):
            return [], []
        tail = list(context[-RUN_MAX:])
        tokens: list[int] = []
        classes: list[int] = []
        follow, run = -1, 0      # the occurrence being copied, and the match behind it
        reach = 1.0
        for _ in range(k):
            ranked = self.ranked(tail, follow, run, 1)
            if not ranked:
                break
            if rates is not None:
                reach *= rates[ranked[0][3]]
                if reach < reach_min:
                    break
            tok, follow, run, cls = ranked[0]
            tokens.append(tok)
            classes.append(cls)
            tail.append(tok)
            if len(tail) > 2 * RUN_MAX:
                del tail[:RUN_MAX]
        return tokens, classes

    def ranked(self, tail: Sequence[int], follow: int, run: int, n: int) -> list[tuple[int, int, int, int]]:
        """The n best tokens to follow `tail`, best first, each as (token, position of the
        occurrence it copies, match length behind it, class). The longest n-gram that ends `tail`
        and was followed before ranks its continuations first; rivals beyond those come from
        shorter n-grams (what followed a shorter match). `follow`/`run`: the occurrence the draft
        copies so far and its match (-1, 0 at the start), so that copying on costs no re-measuring."""
        out: list[tuple[int, int, int, int]] = []
        seen: set[int] = set()
        for g in range(min(self.ngram_max, len(tail)), 0, -1):
            entry = self._index.get(tuple(tail[-g:]))
            if not entry:
                continue
            ambiguous = len(entry) > 1 or bool(out)
            scored = []
            for t, (count, p) in entry.items():
                if t in seen:
                    continue
                m = run + 1 if p == follow + 1 else self._match(p, tail, g)
                scored.append(((bucket(m), count, p), t, p, m))
            best = sorted(scored, reverse=True)[:n - len(out)] if n > 1 else [max(scored)] if scored else []
            for _, t, p, m in best:
                out.append((t, p, m, class_of(m, ambiguous)))
                seen.add(t)
            if len(out) >= n or n == 1:
                break
        return out

    def tree(self, context: Sequence[int], k: int, shape: Sequence[int], budget: int = 64):
        """Rival continuations as a tree of depth <= k: at depth d each node has up to shape[d]
        children (1 past the shape), the tokens that followed its n-gram, best first, each drafted
        on from the occurrence it copies. Returns (tokens, parents, classes) with parents before
        children (-1: a child of the text); at most `budget` nodes (past it, chains)."""
        tokens: list[int] = []
        parents: list[int] = []
        classes: list[int] = []
        frontier = [(-1, list(context[-RUN_MAX:]), -1, 0)]   # (node, tail, follow, run)
        for d in range(k):
            b = shape[d] if d < len(shape) else 1
            if len(tokens) + len(frontier) * b > budget:
                b = 1
                if len(tokens) + len(frontier) > budget:
                    break
            nxt = []
            for node, tail, follow, run in frontier:
                for tok, pos, length, cls in self.ranked(tail, follow, run, b):
                    nxt.append((len(tokens), [*tail[-2 * RUN_MAX + 1:], tok], pos, length))
                    tokens.append(tok)
                    parents.append(node)
                    classes.append(cls)
            if not nxt:
                break
            frontier = nxt
        return tokens, parents, classes


class LookupRates:
    """Acceptance of lookup-drafted tokens per class, as discounted Beta counts."""

    def __init__(self) -> None:
        prior = np.array([[p, p * PRIOR_AMBIGUOUS_FACTOR] for p in PRIOR_UNIQUE]).ravel()
        self._s = prior * PRIOR_WEIGHT
        self._w = np.full(N_CLASSES, PRIOR_WEIGHT)
        self.trials = 0
        self._tables: dict[float, list[float]] = {}   # every class's rate by optimism, until observe

    def table(self, optimism: float = 0.0) -> list[float]:
        """`rates` of every class, as a list: made once per optimism, then kept up to date class
        by class as trials come (every step scores lookup's candidate, and remaking all 14 rates
        with numpy there cost ~20 µs, ~1 % of a GPU-class pass)."""
        got = self._tables.get(optimism)
        if got is None:
            got = self._tables[optimism] = self.rates(range(N_CLASSES), optimism).tolist()
        return got

    def rates(self, classes: Sequence[int], optimism: float = 0.0) -> np.ndarray:
        """Acceptance per drafted token; `optimism` adds that many standard errors beyond those of
        a full memory, so a class seldom tried gets tried (or it could never prove itself)."""
        return np.array([self._rate(int(c), optimism) for c in classes], dtype=float)

    def _rate(self, c: int, optimism: float) -> float:
        """The acceptance of class c (`rates`), in scalar arithmetic: a handful of classes a call."""
        s, w = float(self._s[c]), float(self._w[c])
        r = s / w
        if optimism:
            excess = max(1 / math.sqrt(w) - 1 / math.sqrt(_FULL), 0.0)
            r = min(r + optimism * math.sqrt(max(r * (1 - r), 0.0)) * excess, 1.0)
        return r

    def observe(self, classes: Sequence[int], n_accepted: int) -> None:
        """Tokens before the first rejection were accepted, that one rejected, later ones untested."""
        touched = set()
        for i, c in enumerate(classes[: n_accepted + 1]):
            self._s[c] = DECAY * self._s[c] + (i < n_accepted)
            self._w[c] = DECAY * self._w[c] + 1.0
            self.trials += 1
            touched.add(c)
        for optimism, table in self._tables.items():
            for c in touched:
                table[c] = self._rate(c, optimism)

    def snapshot(self) -> dict:
        return {describe_class(c): round(float(self._s[c] / self._w[c]), 3) for c in range(N_CLASSES)}
