"""Concurrent generations on one context per model: `Slot`s and the `Batcher` that decodes for them.

A `Slot` is one generation's view of a shared `Model`: its own range of the model's sequences
(sequence 0 of the slot and, for draft trees, `width` - 1 more) and its own context limit, with
the interface the decoder and the drafters use on a `Model` (`eval`, `sync`, `truncate`,
`decode_rows`, `eval_tree`, `keep_path`, the vocabulary). Each generation runs in a thread of its
own, unchanged, and every decode it asks for goes to the `Batcher` instead of to llama.cpp.

The `Batcher` runs the threads in lockstep: a decode is made only when no taking-part thread is
running Python (each is waiting for rows it submitted, or has left), and it holds every waiting
request of one model, so one `llama_decode` serves all of them. The models are served in the order
given ([draft, target]): while any generation still drafts, the draft model's rows go first, so
the target's decode, once every generation waits on it, holds every generation's verify rows.
A request's rows are decoded in order; rows before its first logits row (a prefill) are split into
parts of at most `chunk` rows, so that running generations keep stepping while a long prompt is
read; the rows with logits always go in one decode.

Which rows may share a decode is set by llama.cpp's numerics, so that a generation computes the
same logits whatever else runs: with a unified cache, a decode of 64 rows or more that holds
several sequences gives them other logits than each would get alone (measured here: up to 0.8 on
the Q4_1 draft, 0.02 on the F32 target; below 64 rows, bit-identical; llama.cpp issue #24962
reports the same). So requests of up to SHARE_ROWS rows share decodes of at most SHARED_MAX rows,
and a larger request (a prompt's part, a big tree) is decoded on its own, in parts of the same
size whatever else waits: its numbers are those of the generation run alone.

Why threads and not one loop over every generation: each generation keeps its own decoder, drafter,
random streams and stop strings exactly as a single generation has them, so batching cannot change
what a generation computes, only when its decodes run. The Python work of the threads is serial
(the GIL) and decodes run with every core, so nothing runs beside a decode.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import numpy as np

from .batch import Sequences, logit_start
from .files import Cancelled, EngineError

CHUNK = 128        # prefill rows per decode: larger reads a prompt sooner, stalls the others longer
SHARE_ROWS = 32    # a request of more rows is decoded alone
SHARED_MAX = 56    # rows of a decode that several requests share: below llama.cpp's 64 (see above)


class _Request:
    """Rows one thread waits for: tokens, their (rows, n_seq) sequence flags, logits wanted."""

    __slots__ = ("model", "tokens", "member", "want", "tail", "done", "out", "error", "cancel", "finished")

    def __init__(self, model, tokens, member, want, cancel):
        self.model, self.tokens, self.member, self.want, self.cancel = model, tokens, member, want, cancel
        wanted = np.flatnonzero(want)
        self.tail = int(wanted[0]) if len(wanted) else len(tokens)  # rows from here go in one decode
        self.done = 0                 # rows decoded so far
        self.out = None               # logits of the wanted rows, once finished
        self.error: BaseException | None = None
        self.finished = False


class Batcher:
    """Decodes the rows of every taking-part thread together (see the module docstring).

    `on_decode(model, rows, logit_rows, seconds)` is told every decode made (the batch
    controller's costs)."""

    def __init__(self, models: Sequence, chunk: int = CHUNK,
                 on_decode: Callable[[object, int, int, float], None] | None = None):
        self.models = [m for m in models if m is not None]
        self.chunk = chunk
        self.on_decode = on_decode
        self.lock = threading.RLock()   # held by every decode
        self._cv = threading.Condition(self.lock)
        self._running = 0                       # taking-part threads not waiting for a decode
        self._pending: dict[int, list[_Request]] = {id(m): [] for m in self.models}
        self.decodes = 0                        # decodes made, for the statistics
        self.served = 0                         # requests those decodes completed
        self.shared = 0                         # decodes that held several requests

    @contextmanager
    def taking_part(self) -> Iterator[None]:
        """The calling thread generates: until it leaves, no decode is made while it runs Python."""
        with self._cv:
            self._running += 1
        try:
            yield
        finally:
            with self._cv:
                self._running -= 1
                self._serve_while_idle()

    @property
    def active(self) -> int:
        return self._running + sum(len(q) for q in self._pending.values())

    def submit(self, model, tokens: np.ndarray, member: np.ndarray, want: np.ndarray,
               cancel: threading.Event | None = None) -> np.ndarray | None:
        """Decode rows for the calling (taking-part) thread; return the wanted rows' logits, a view
        valid until this thread submits again."""
        req = _Request(model, tokens, member, want, cancel)
        if len(tokens) - req.tail > model.n_batch:
            raise EngineError(f"cannot return {len(tokens) - req.tail} logit rows in one batch of {model.n_batch}")
        with self._cv:
            self._pending[id(model)].append(req)
            self._running -= 1
            try:
                while not req.finished:
                    if self._running == 0:
                        self._serve_once()
                    else:
                        self._cv.wait()
            finally:
                if not req.finished:   # interrupted while waiting (KeyboardInterrupt): withdraw
                    self._pending[id(model)].remove(req)
                    self._running += 1
        if req.error is not None:
            raise req.error
        return req.out

    # -- under the lock ---------------------------------------------------------------------------

    def _serve_while_idle(self) -> None:
        while self._running == 0 and any(self._pending.values()):
            self._serve_once()

    def _serve_once(self) -> None:
        """One decode of the first model (in `models` order) with rows waiting."""
        model = next(m for m in self.models if self._pending[id(m)])
        queue = self._pending[id(model)]
        for req in [r for r in queue if r.cancel is not None and r.cancel.is_set()]:
            self._finish(queue, req, error=_cancelled(model))
        if not queue:
            return
        taken = self._compose(queue, model.n_batch)
        tokens = np.concatenate([r.tokens[lo:hi] for r, lo, hi in taken])
        member = np.concatenate([r.member[lo:hi] for r, lo, hi in taken])
        want = np.concatenate([r.want[lo:hi] for r, lo, hi in taken])
        start = time.perf_counter()
        try:
            out = model.decode_rows(tokens, member, want)
        except BaseException as e:   # every request in this decode fails with it
            for r, _, _ in taken:
                self._finish(queue, r, error=e)
            return
        self.decodes += 1
        self.shared += len(taken) > 1
        if self.on_decode is not None:
            self.on_decode(model, len(tokens), int(want.sum()), time.perf_counter() - start)
        first = 0
        for r, lo, hi in taken:
            n = int(r.want[lo:hi].sum())
            r.done = hi
            if hi == len(r.tokens):
                self._finish(queue, r, out=out[first:first + n] if n else None)
            first += n

    def _compose(self, queue: list[_Request], budget: int) -> list[tuple[_Request, int, int]]:
        """(request, first row, end row) for one decode: the first request's next part alone when
        it is large, else the small requests, in arrival order, that fit SHARED_MAX together."""
        first = queue[0]
        if len(first.tokens) - first.done > SHARE_ROWS:
            return [(first, first.done, first.done + self._part(first, budget))]
        taken, rows = [], 0
        for r in queue:
            left = len(r.tokens) - r.done
            if left > SHARE_ROWS or rows + left > min(SHARED_MAX, budget):
                continue
            taken.append((r, r.done, r.done + left))
            rows += left
        return taken

    def _part(self, r: _Request, budget: int) -> int:
        """Rows of a large request's next decode: its prefill in parts of `chunk`, then the rest
        (the rows with logits) at once."""
        before = r.tail - r.done   # rows before its logits rows
        left = len(r.tokens) - r.done
        return min(before, self.chunk) if before > 0 and left > min(self.chunk, budget) else left

    def _finish(self, queue, req: _Request, out=None, error: BaseException | None = None) -> None:
        queue.remove(req)
        req.out, req.error, req.finished = out, error, True
        self.served += error is None
        self._running += 1          # its thread runs again: no decode until it waits once more
        self._cv.notify_all()


def _cancelled(model) -> EngineError:
    return Cancelled(f"stopped between decodes ({model.name})")


class Slot(Sequences):
    """One generation's part of a shared model: sequences base .. base + width - 1 of `model`,
    seen as 0 .. width - 1, holding at most n_ctx tokens each; decodes go through `batcher`."""

    batched = True
    """Its decodes go through a `Batcher`, one decode at a time, for the taking-part threads only:
    a generation on a slot never decodes from a second thread (the decoder drafts ahead only on a
    `Model`). Set here, not passed through to the model as `remote` and the rest are."""

    def __init__(self, model, batcher: Batcher, index: int, width: int, n_ctx: int):
        if (index + 1) * width > model.n_seq:
            raise EngineError(f"slot {index} of width {width} needs n_seq >= {(index + 1) * width}, "
                              f"{model.name} has {model.n_seq}")
        self.model, self.batcher, self.index = model, batcher, index
        self.base, self.n_seq, self.n_ctx = index * width, width, min(n_ctx, model.n_ctx)
        self.seqs = model.seqs[self.base:self.base + width]   # the same lists: both see every change
        self.tokens = self.seqs[0]
        self.n_batch = model.n_batch
        self._tree = None
        self.abort_when: threading.Event | None = None
        """Set from another thread (a client gone): this slot's waiting and next decodes fail
        (`Model.abort_when`'s meaning, at the slot's next decode)."""

    def __getattr__(self, name):   # the vocabulary, chat template, metadata: the model's
        if name == "model":          # not set yet (a half-made slot): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)

    # A thread not taking part (emptying a slot before its generation) may change the cache while
    # a decode runs: the batcher's lock, which every decode holds, keeps them apart.
    def _share(self, src: int, dst: int, p0: int, p1: int) -> None:
        with self.batcher.lock:
            self.model._share(self.base + src, self.base + dst, p0, p1)

    def truncate(self, n: int, seq: int = 0) -> None:
        with self.batcher.lock:
            self.model.truncate(n, self.base + self._seq_id(seq))

    def reset(self) -> None:
        for s in range(self.n_seq):
            self.drop_seq(s)

    def eval(self, tokens: Sequence[int], logits_from: int | None = None) -> np.ndarray | None:
        """As `Model.eval`, on this slot's sequence 0."""
        n = len(tokens)
        if n == 0:
            return None
        want = np.zeros(n, bool)
        want[logit_start(n, logits_from):] = True
        return self._submit(np.asarray(tokens, dtype=np.int32), np.zeros(n, np.int64), want)

    def decode_rows(self, tokens: Sequence[int], seqs, logits=None, pad: bool = False) -> np.ndarray | None:
        """As `Sequences.decode_rows`, with this slot's sequence ids. `pad` is not for a slot: its
        rows meet other slots' in the batcher's decode, whose size no one slot decides."""
        arr = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if len(arr) == 0:
            return None
        want = np.zeros(len(arr), bool) if logits is None else np.asarray(logits, dtype=bool).reshape(-1)
        if len(want) != len(arr):
            raise EngineError(f"{len(want)} logits flags for {len(arr)} rows")
        return self._submit(arr, self._members(seqs, len(arr)), want)

    def _submit(self, arr: np.ndarray, member: np.ndarray, want: np.ndarray) -> np.ndarray | None:
        if member.ndim == 1:
            member = member[:, None] == np.arange(self.n_seq)
        self._place(member)   # this slot's rules and context, before the rows meet others'
        wide = np.zeros((len(arr), self.model.n_seq), bool)
        wide[:, self.base:self.base + self.n_seq] = member
        return self.batcher.submit(self.model, arr, wide, want, self.abort_when)
