"""The draft model as a drafter: a small GGUF sharing the target's tokenizer, drafting
autoregressively, with a KV cache that follows the accepted text (and trees, drafting ahead).

Part of the algorithm: it reaches the model only through the engine's `Model` methods it is handed
(eval, truncate, copy_seq, ...), never by importing the engine.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from localspec.tokens import common_prefix
from . import overlap
from .constrain import NothingAllowed
from .dists import Dist
from .controller.draft_costs import USUAL_FIRST
from .drafters import Draft, _Single
from .processing import window
from .sampling import BadLogits, distribution, processed


class ModelDrafter(_Single):
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

    def __init__(self, model, target_vocab: int | None = None, lazy: bool = False):
        self.model = model
        self.target_vocab = target_vocab or model.n_vocab
        self.offset = 0  # the draft's cache holds context[offset:]
        # lazy: the prompt is read at the first proposal, not in `prepare`; a generation that
        # never drafts (one of a batch held plain) never reads it, and one that starts drafting
        # late reads at most MAX_CATCHUP tokens of it (a batch waits for every row read).
        self.lazy = lazy
        self._unread = False
        self.seqs_used: dict[int, int] = {}   # during a tree step: draft node -> its sequence
        self.tree_base = 0                    # tokens of sequence 0 before the tree's first level
        self._ahead: overlap.Ahead | None = None   # `draft_ahead`'s tokens, until the next proposal
        self.split_catchup = False   # read a catch-up apart (`start`): each step's plan sets it (`follow`)

    def prepare(self, context: Sequence[int]) -> None:
        self._ahead = None
        lacking = [i for i, t in enumerate(context) if t >= self.model.n_vocab]
        self.offset = lacking[-1] + 1 if lacking else 0  # see propose
        if self.lazy:
            self._unread = True
            return
        self.model.sync(context[self.offset:-1])

    def limit(self, context: Sequence[int], k_max: int) -> int | None:
        return None

    def lag(self, context: Sequence[int]) -> int:
        # The cache holds a prefix of context[offset:] plus at most a rejected tail (never longer
        # than one draft), so this counts what a proposal would first have to feed. Tokens drafted
        # ahead (`overlap`) lengthen that tail until the next proposal: they count as not held.
        held = self._ahead.held if self._ahead is not None else len(self.model.tokens)
        return max(len(context) - self.offset - held, 0)

    def follow(self, controller) -> None:
        """Before a step: whether `start` reads a catch-up apart, which only an adaptive k needs
        (a fixed k prices nothing, and its rows then never depend on what the controller has seen)."""
        self.split_catchup = controller.fixed_k is None and not controller.first_decode.lined()

    def start(self, context) -> tuple[np.ndarray | None, int, float, tuple[int, float]]:
        """Bring the draft's cache up to `context` (but its last token) and read the last token:
        (the logits row after the context, or None when nothing can be drafted now; tokens read;
        seconds of that first decode; the catch-up read apart, `Draft.catchup`). Only sequence 0
        is kept.

        While the controller cannot yet tell a first decode's catch-up from its drafting (its line
        of first decodes rests on fewer than two sizes: `split_catchup`), a catch-up is read in a
        decode of its own, once, and the first decode reads the usual two tokens. A warm start's
        test of its record drafts once after plain steps: split by a prior, its 9-token first
        decode was counted as drafting at 2.5x a token's price, and kept the run plain."""
        m = self.model
        self._ahead = None   # the cache is rewound to the text: drafts made ahead are gone
        if self.seqs_used:
            self.settle(None)
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
            return None, 0, 0.0, (0, 0.0)
        m.truncate(keep)
        self._unread = False
        catchup = (0, 0.0)
        if self.split_catchup and len(fresh) > USUAL_FIRST:
            start = time.perf_counter()
            m.eval(fresh[:-USUAL_FIRST], logits_from=-1)   # with its row, as a first decode has
            catchup = (len(fresh) - USUAL_FIRST, time.perf_counter() - start)
            fresh = fresh[-USUAL_FIRST:]
        start = time.perf_counter()
        logits = m.eval(fresh, logits_from=-1)
        return logits[0], len(fresh), time.perf_counter() - start, catchup

    def propose(self, context, k, sampling, rng, grammar=None) -> Draft:
        m = self.model
        tokens, rows = overlap.take_ahead(self, context, k, grammar, rng)
        n_ahead, n_first, first, catchup = len(tokens), 0, 0.0, (0, 0.0)
        if n_ahead == k or (tokens and (m.is_eog(tokens[-1]) or tokens[-1] >= self.target_vocab)):
            return Draft(tokens, rows or None, source="model", n_ahead=n_ahead)
        if tokens:   # drafted ahead: the draft goes on after them
            row = m.eval([tokens[-1]], logits_from=0)[0]
        else:
            row, n_first, first, catchup = self.start(context)
            if row is None:
                return Draft([])
        host = 0.0
        states = (lambda _: grammar) if grammar is not None else None
        touched = sampling.processed or states is not None   # else each row is sampled as it comes
        for i in range(n_ahead, k):
            h = time.perf_counter()
            if touched:   # as the target's row after the same text will be
                try:
                    row = processed(row, sampling, lambda _: window(context, tokens, sampling), 0, states)
                except NothingAllowed:
                    break   # nothing the grammar allows has a finite logit here: draft no further
            x = self.pick(row, sampling, rng, rows)
            tokens.append(x)
            host += time.perf_counter() - h
            if m.is_eog(x) or x >= self.target_vocab or i == k - 1:
                break  # nothing sensible follows an end of generation or an id the target lacks
            if grammar is not None:
                grammar.accept(x)
            row = m.eval([x], logits_from=0)[0]
        # Greedy drafts are checked against the target's argmax; no distribution is needed. Ids
        # past one vocabulary's end have p = 0 or q = 0 there, which the rule handles.
        return Draft(tokens, rows or None, host, source="model", n_first=n_first, t_first=first, n_ahead=n_ahead,
                     catchup=catchup)

    def draft_ahead(self, context, draft: Draft, sampling, rng, guessing, done) -> None:
        """Draft on past `draft` while the target verifies it (`overlap.draft_ahead`): `rng` the
        drafting stream, `guessing` the stream of the guesses at the target's bonus token."""
        self._ahead = overlap.draft_ahead(self, context, draft.tokens, sampling, rng, guessing, done)

    def pick(self, row, sampling, rng, rows: list) -> int:
        """The token drafted from `row`: its argmax when greedy, else a draw from its distribution,
        which is appended to `rows` (the rule reads it)."""
        if sampling.greedy:
            return int(row.argmax())
        q = self.distribution(row, sampling)
        rows.append(q)
        return q.sample(rng)

    def distribution(self, row, sampling) -> Dist:
        try:
            return distribution(row, sampling)
        except BadLogits as e:
            e.model = f"the draft {self.model.name}"
            raise

    def settle(self, path) -> None:
        """After a tree step (tree_drafts): keep the accepted branch's cells as sequence 0 and free
        every other branch; `path` = the accepted nodes (None: keep sequence 0 as it is)."""
        best, n = 0, self.tree_base
        for depth, node in enumerate(path or ()):
            if node in self.seqs_used:
                best, n = self.seqs_used[node], self.tree_base + depth + 1
        m = self.model
        if best:
            m.copy_seq(best, 0, n)
        elif path is not None:
            m.truncate(n)   # the first-ranked branch past the accepted nodes
        for s in set(self.seqs_used.values()) - {0}:
            m.drop_seq(s)
        self.seqs_used = {}
