"""Streaming in layers: decoder steps → detokenised, timed chunks (with stop strings) → text."""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

from .decoder import Step, generate_steps


@dataclass(frozen=True)
class Chunk:
    """One step's worth of output as text."""

    text: str
    """Text that became final this step (may be empty while a multi-byte char or stop string is pending)."""
    step: Step
    """The decoder step that produced it."""
    pieces: tuple[tuple[str, bool], ...]
    """Per emitted token: (its text, came from an accepted draft) — for highlighting."""
    elapsed: float
    """Seconds since generation started (prefill included)."""


class TextStream:
    """Incremental detokeniser: bytes → UTF-8 text, holding back what could start a stop string."""

    def __init__(self, piece, stop: Sequence[str] = ()):
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._pending = ""
        self.stopped = False

    def push(self, tokens: Sequence[int]) -> tuple[str, list[str]]:
        """Feed tokens; return (text safe to show now, each token's own decoded text)."""
        pieces = [self._decoder.decode(self._piece(t)) for t in tokens]
        if self.stopped:
            return "", pieces
        self._pending += "".join(pieces)
        if not self._stop:
            out, self._pending = self._pending, ""
            return out, pieces
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            self.stopped = True
            out, self._pending = self._pending[: min(hits)], ""
            return out, pieces
        hold = 0
        for s in self._stop:  # keep the longest tail that may still grow into a stop string
            for n in range(min(len(s) - 1, len(self._pending)), hold, -1):
                if s.startswith(self._pending[-n:]):
                    hold = n
                    break
        cut = len(self._pending) - hold
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out, pieces

    def flush(self) -> str:
        out = "" if self.stopped else self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return out


def stream_text(target, drafter, prompt, sampling, decode, controller=None, rng=None) -> Iterator[Chunk]:
    """Generate text chunk by chunk; stops at a stop string (its text is not shown)."""
    start = time.perf_counter()
    text = TextStream(target.piece, decode.stop)
    steps = generate_steps(target, drafter, prompt, sampling, decode, controller, rng)
    try:
        for step in steps:
            shown, pieces = text.push(step.tokens)
            if text.stopped and step.finish is None:
                step = replace(step, finish="stop")
            if step.finish is not None:
                shown += text.flush()
            yield Chunk(shown, step, tuple(zip(pieces, step.from_draft)), time.perf_counter() - start)
            if step.finish is not None:
                return
    finally:
        steps.close()  # rewinds the target cache to the accepted text

