"""Streaming in layers: decoder steps → detokenised, timed chunks (with stop strings) → text.

Stop strings. The text shown is everything before the first occurrence of any stop string; the
tokens kept are those whose text starts before it (the token in which the stop string begins is
kept, every later one is dropped: from the output, its counts and the target's cache). A token's
text starts where the text decoded before it ends, so a token that completes no UTF-8 character
yet belongs to the character it starts.
"""

from __future__ import annotations

import codecs
import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import Iterator, Sequence

from .decoder import Step, generate_steps


@dataclass(frozen=True)
class Chunk:
    """One step's worth of output as text."""

    text: str
    """Text that became final this step (may be empty while a multi-byte char or stop string is pending)."""
    step: Step
    """The decoder step (one target pass) behind it, as the decoder reported it: what the pass
    produced, for statistics per pass."""
    tokens: tuple[int, ...]
    """The tokens released now: a token whose text could still begin a stop string is held back
    to a later chunk (or dropped when the stop string completes), so the chunks' tokens add up to
    the output."""
    pieces: tuple[tuple[str, str], ...]
    """Per released token: (its text, who proposed it: "model" or "lookup" for an accepted draft
    token, "target" for the target's own) — for colouring. Joined over all chunks they give the
    text shown (the token a stop string begins in is cut at it)."""
    elapsed: float
    """Seconds since generation started (prefill included)."""
    stopped: bool = False
    """A stop string ended the text in this chunk (the decoder's finish says "stop" for that and
    for the end of text alike)."""


class TextStream:
    """Incremental detokeniser: bytes → UTF-8 text, holding back what could start a stop string,
    and the tokens that made it (see the module's rule). `push` is the decoder's stop hook."""

    def __init__(self, piece, stop: Sequence[str] = ()):
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._shown = 0        # characters released so far
        self._pending = ""     # text decoded after them
        self._held: list[tuple[int, int, str]] = []   # (token, where its text starts, its text)
        self._text = ""        # released since the last `take`
        self._tokens: list[tuple[int, str]] = []
        self.stopped = False

    def push(self, tokens: Sequence[int]) -> int | None:
        """Decode `tokens`. None, or when a stop string completed: how many of them to keep
        (negative: that many tokens of earlier pushes, still held, are dropped too)."""
        at = self._shown + len(self._pending)
        for t in tokens:
            text = self._decoder.decode(self._piece(t))
            self._held.append((t, at, text))
            self._pending += text
            at += len(text)
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            self.stopped = True
            stop_at = self._shown + min(hits)
            kept = bisect_left([start for _, start, _ in self._held], stop_at)
            dropped = len(self._held) - kept
            # The token the stop string begins in shows only the text before it.
            self._held = [(t, start, text[: stop_at - start]) for t, start, text in self._held[:kept]]
            self._release(min(hits))
            return len(tokens) - dropped
        hold = 0
        for s in self._stop:  # keep the longest tail that may still grow into a stop string
            for n in range(min(len(s) - 1, len(self._pending)), hold, -1):
                if s.startswith(self._pending[-n:]):
                    hold = n
                    break
        self._release(len(self._pending) - hold)
        return None

    def _release(self, chars: int) -> None:
        """Show `chars` more characters, and the held tokens whose text is all shown now. (A token
        whose text starts before the shown end is kept whatever comes, as no stop string can begin
        before that end; it waits for the rest of its text so that its piece is final too.)"""
        self._text += self._pending[:chars]
        self._pending = self._pending[chars:]
        self._shown += chars
        n = 0
        for _, start, text in self._held:
            if start >= self._shown or start + len(text) > self._shown:
                break
            n += 1
        self._tokens += [(t, text) for t, _, text in self._held[:n]]
        del self._held[:n]
        if self.stopped:
            self._pending, self._held = "", []

    def take(self, final: bool = False) -> tuple[str, list[tuple[int, str]]]:
        """The text and the (token, its text) pairs released since the last take. `final`: the
        generation ended, release everything still held. A character the last tokens began but
        never finished (--max-tokens cut it) is left out, not shown as U+FFFD: the output holds
        whole characters only, in generate, chat and serve alike."""
        if final and not self.stopped:
            self._decoder.reset()   # drops the unfinished character's bytes
            self._release(len(self._pending))
            self._tokens += [(t, text) for t, _, text in self._held]
            self._held = []
        text, tokens = self._text, self._tokens
        self._text, self._tokens = "", []
        return text, tokens


def stream_text(target, drafter, prompt, sampling, decode, controller=None, rng=None) -> Iterator[Chunk]:
    """Generate text chunk by chunk; stops at a stop string (its text is not shown)."""
    start = time.perf_counter()
    text = TextStream(target.piece, decode.stop)
    steps = generate_steps(target, drafter, prompt, sampling, decode, controller, rng, stop=text.push)
    flags: list[str] = []  # who proposed each token the stream holds (Step.kinds)
    try:
        for step in steps:
            flags += step.kinds()
            del flags[len(flags) - step.withdrawn:]
            shown, released = text.take(final=step.finish is not None)
            n = len(released)
            pieces = tuple(zip((piece for _, piece in released), flags[:n]))
            del flags[:n]
            yield Chunk(shown, step, tuple(t for t, _ in released), pieces, time.perf_counter() - start,
                        text.stopped)
            if step.finish is not None:
                return
    finally:
        steps.close()  # rewinds the target cache to the accepted text
