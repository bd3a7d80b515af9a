"""Generation slots: N concurrent generations over one loaded pair (`serve --parallel N`,
`bench --concurrency`).

The session's models are loaded with N times the context and N times the sequences
(`LoadConfig.parallel`); slot i owns sequences i·W .. i·W + W − 1 of each (W: the branches a draft
tree needs, 1 for chains) and a context of the session's n_ctx, so a request has the same room as
it would alone. All slots' decodes go through one `Batcher` (engine.slots), and their controllers
share one `BatchCosts`, fed by the batcher's timings of the target's decodes.

A slot keeps what its cache holds after its generation ends: the next request goes to the free slot
whose cached text shares the longest prefix with its prompt (a chat resending its history lands
where its history is), ties to the slot used longest ago.
"""

from __future__ import annotations

import itertools
import threading
from contextlib import contextmanager
from typing import Iterator

from localspec.decoding.controller.batch import BatchCosts, SlotShare
from localspec.engine.slots import Batcher, Slot
from localspec.tokens import common_prefix


class SlotPool:
    """The slots of a session loaded with `parallel` slots of `width` sequences each."""

    def __init__(self, session, parallel: int, width: int = 1):
        target, draft = session.target, session.draft
        if parallel < 1 or target.n_seq < parallel * width:
            raise ValueError(f"{parallel} slots of width {width} need a session loaded with parallel={parallel}")
        self.session = session
        self.parallel, self.width = parallel, width
        self.n_ctx = session.n_ctx
        self.costs = BatchCosts(parallel)
        self.batcher = Batcher([draft, target], on_decode=self._timed)
        self.targets = [Slot(target, self.batcher, i, width, self.n_ctx) for i in range(parallel)]
        self.drafts = [Slot(draft, self.batcher, i, width, self.n_ctx) if draft is not None else None
                       for i in range(parallel)]
        self._lock = threading.Lock()
        self._free = list(range(parallel))
        self._used = [0] * parallel   # when each slot was last taken (a counter)
        self._clock = itertools.count(1)

    def _timed(self, model, rows: int, logit_rows: int, seconds: float) -> None:
        self.costs.observe(rows, seconds, draft=model is not self.session.target, read=rows - logit_rows)

    @property
    def busy(self) -> int:
        return self.parallel - len(self._free)

    def acquire(self, prompt) -> int | None:
        """A free slot for `prompt` (its cache's longest common prefix), or None when all are busy."""
        with self._lock:
            if not self._free:
                return None
            best = max(self._free, key=lambda i: (common_prefix(self.targets[i].tokens, prompt[:-1]), -self._used[i]))
            self._free.remove(best)
            self._used[best] = next(self._clock)
            return best

    def release(self, i: int) -> None:
        with self._lock:
            if i not in self._free:
                self._free.append(i)

    def drafter(self, i: int, kind: str | None = None):
        """A new drafter of the session's kind (or `kind`) over slot i's part of the draft model."""
        return self.session.make_drafter(kind, draft=self.drafts[i])

    def cached(self, i: int) -> list[int]:
        return self.targets[i].tokens

    def cancel_all(self) -> None:
        """Make every slot's next decode fail (Cancelled): the generations end within a step."""
        stop = threading.Event()
        stop.set()
        for view in (*self.targets, *self.drafts):
            if view is not None:
                view.abort_when = stop

    def clear(self, i: int) -> None:
        """Empty slot i's caches (nothing of an earlier request may be reused)."""
        for view in (self.targets[i], self.drafts[i]):
            if view is not None:
                view.reset()

    @contextmanager
    def generating(self, i: int, controller=None) -> Iterator[None]:
        """Run a generation in slot i from the calling thread: its decodes join the batch, and
        `controller` prices its rows as its share of the batch's."""
        with self.batcher.taking_part():
            self.costs.join(i)
            if controller is not None:
                controller.batch = SlotShare(self.costs, i)
            try:
                yield
            finally:
                self.costs.leave(i)
                if controller is not None:
                    controller.batch = None
