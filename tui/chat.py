"""The chat behind the screen: history, settings, fitting the context, one reply at a time, and the
live numbers the speculation panel shows.

Nothing here imports Textual, so it can be reasoned about and tested without a screen. The app runs
`Chat.prepare` and `Chat.reply` in a thread worker and reads `LiveStats.view()` from a timer.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import numpy as np

from localspec import conversation, warmstart
from localspec.config import ConfigError, DecodeConfig, SamplingConfig
from localspec.controller import KController
from localspec.decoder import Step
from localspec.prefix import common_prefix
from localspec.stats import RunStats, positions_tested
from localspec.stats import served as stats_served
from localspec.stream import Chunk, stream_text

TEMPERATURES = (0.0, 0.3, 0.7, 1.0)
WINDOW = 32          # steps in the rolling α, tokens/s and sparkline
PLAIN_WEIGHT = 0.2   # weight of a new plain step in the plain-speed EWMA


class LiveStats:
    """Per-step numbers shared by the generation thread (writer) and the panel timer (reader).

    The writer does O(1) work per step under a short lock; the reader copies what it needs, so the
    panel can refresh a few times a second without ever holding up generation.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = RunStats()
        self._recent: deque[Step] = deque(maxlen=WINDOW)
        self._plain: float | None = None  # seconds per target pass without a draft (k = 0 steps)

    def add(self, step: Step) -> None:
        seconds = step.t_draft + step.t_verify + step.t_python
        with self._lock:
            self._total.add(step)
            self._recent.append(step)
            if step.n_drafted == 0 and seconds > 0:
                # A pass with no draft is plain decoding: one token for one target pass. Measured,
                # never guessed, so the panel shows "—" until such a step happened.
                old = self._plain
                self._plain = seconds if old is None else (1 - PLAIN_WEIGHT) * old + PLAIN_WEIGHT * seconds

    def view(self) -> dict:
        with self._lock:
            recent = list(self._recent)
            total = self._total
            alpha_all, drafted, accepted = total.alpha, total.n_drafted, total.n_accepted
            efficiency = total.draft_efficiency
            by_position = total.acceptance_by_position()
            plain = self._plain
            served = total.drafters()
        # α as everywhere: accepted / tested positions (localspec.stats), here over the window
        r_tested = sum(positions_tested(s.n_drafted, s.n_accepted) for s in recent)
        r_accepted = sum(s.n_accepted for s in recent)
        r_tokens = sum(len(s.tokens) for s in recent)
        r_seconds = sum(s.t_draft + s.t_verify + s.t_python for s in recent)
        tps = r_tokens / r_seconds if r_seconds > 0 else None
        plain_tps = 1.0 / plain if plain else None
        return {
            "alpha_all": alpha_all,
            "alpha_recent": r_accepted / r_tested if r_tested else None,
            "draft_efficiency": efficiency,
            "spark": [float(len(s.tokens)) for s in recent],
            "k_now": recent[-1].k if recent else None,
            "tokens_per_pass": r_tokens / len(recent) if recent else None,
            "tps": tps,
            "plain_tps": plain_tps,
            "speedup": tps / plain_tps if tps and plain_tps else None,
            "drafted": drafted,
            "accepted": accepted,
            "by_position": by_position,
            # who served the passes, e.g. "M62 L30 P8", and who served the last one
            "served": stats_served(served) if served else None,
            "source_now": (recent[-1].source or "plain") if recent else None,
        }


@dataclass(frozen=True)
class Turn:
    """A prompt ready to generate from."""

    prompt: list[int]
    dropped: int
    """Oldest messages removed from the history so that prompt + max_tokens fits n_ctx."""
    cached: int
    """Prompt tokens already in the target's KV cache (not evaluated again)."""


@dataclass(frozen=True)
class Reply:
    finish: str
    """"stop", "length", "context" (n_ctx reached) or "stopped" (the user pressed Esc)."""
    n_tokens: int
    seconds: float
    alpha: float | None
    """Accepted / tested draft positions over the reply (None when nothing was drafted)."""
    n_steps: int = 0
    """Target passes (one per chunk)."""
    drafter: str = "none"
    """The drafter the reply was generated with (settings changed meanwhile apply to the next)."""


class Chat:
    """A conversation with one loaded Session. Settings changed while a reply runs apply to the next."""

    def __init__(self, session, sampling: SamplingConfig, k: int | None = None,
                 max_tokens: int = 256, system: str | None = None, k_max: int = 12,
                 warm_start: bool = True, clock: Callable[[], float] = time.perf_counter) -> None:
        self.session = session
        self.clock = clock   # a test's scripted chat gives a fake one, so its numbers are fixed
        self.warm_start = warm_start
        self.sampling = sampling
        self.k = k
        self.k_max = max(k_max, k or 0)
        self.max_tokens = max_tokens
        self.system = system
        self.history: list[dict[str, str]] = []   # user/assistant messages; the system prompt apart
        self.drafter_kind = session.drafter_kind
        self._spec_kind = self.drafter_kind if self.drafter_kind != "none" else self.kinds[0]
        self._drafters: dict[str, object] = {}
        # One controller per drafter and temperature band (warmstart.band) for the whole session, as
        # the server keeps them: learned costs and acceptance persist across turns, a lookup's
        # statistics never pollute the draft model's, and greedy rates never mix with sampled ones
        # (each band's record is saved from its own controller).
        self._controllers: dict[tuple[str, str], KController] = {}
        self.rng = np.random.default_rng(sampling.seed)
        self.live = LiveStats()
        self.stop = threading.Event()

    # ---- settings ------------------------------------------------------------------------------
    @property
    def kinds(self) -> tuple[str, ...]:
        return (("auto", "model") if self.session.draft is not None else ()) + ("lookup", "none")

    def toggle_speculation(self) -> str:
        """none ↔ the drafter used before."""
        if self.drafter_kind == "none":
            self.drafter_kind = self._spec_kind
        else:
            self._spec_kind, self.drafter_kind = self.drafter_kind, "none"
        return self.drafter_kind

    def cycle_drafter(self) -> str:
        kinds = self.kinds
        self.drafter_kind = kinds[(kinds.index(self.drafter_kind) + 1) % len(kinds)]
        if self.drafter_kind != "none":
            self._spec_kind = self.drafter_kind
        return self.drafter_kind

    def cycle_temperature(self) -> float:
        """The next temperature of TEMPERATURES above the current one, wrapping to 0."""
        now = self.sampling.temperature
        nxt = next((t for t in TEMPERATURES if t > now + 1e-9), TEMPERATURES[0])
        self.sampling = replace(self.sampling, temperature=nxt)
        return nxt

    def reset(self) -> None:
        """Forget the conversation. The KV caches need no reset: the next prompt shares the system
        part with what they hold, and `sync` keeps exactly the common prefix."""
        self.history.clear()

    # ---- one turn ------------------------------------------------------------------------------
    def messages(self) -> list[dict[str, str]]:
        return conversation.messages(self.system, self.history)

    def prepare(self, text: str) -> Turn:
        """Add the user's message and build the prompt with the GGUF's chat template, dropping the
        oldest user/assistant pairs (never the system prompt) while prompt + max_tokens > n_ctx."""
        target = self.session.target
        self.history.append({"role": "user", "content": text})
        try:
            fitted = conversation.fit(self.system, self.history, target.chat_prompt, target.n_ctx, self.max_tokens)
        except ConfigError:
            self.history.pop()
            raise
        del self.history[:fitted.dropped]
        # The decoder syncs the cache to prompt[:-1]; this much of it is already there.
        return Turn(fitted.prompt, fitted.dropped, common_prefix(target.tokens, fitted.prompt[:-1]))

    def reply(self, turn: Turn, on_chunk: Callable[[Chunk], None]) -> Reply:
        """Generate the assistant's reply to a prepared turn; stops between target passes once
        `self.stop` is set. The text generated so far (even if stopped) joins the history."""
        kind, sampling = self.drafter_kind, self.sampling
        drafter = self._drafter(kind)
        controller = self._controller(kind, drafter, sampling.temperature)
        decode = DecodeConfig(max_tokens=self.max_tokens, k=self.k, k_max=self.k_max)
        parts: list[str] = []
        n_tokens = n_tested = n_accepted = n_steps = 0
        finish = "stop"
        start = self.clock()
        stream = self._stream(drafter, turn.prompt, sampling, decode, controller)
        try:
            for chunk in stream:
                n_steps += 1
                self.live.add(chunk.step)
                parts.append(chunk.text)
                n_tokens += len(chunk.tokens)
                n_tested += positions_tested(chunk.step.n_drafted, chunk.step.n_accepted)
                n_accepted += chunk.step.n_accepted
                on_chunk(chunk)
                if chunk.step.finish is not None:
                    finish = chunk.step.finish
                elif self.stop.is_set():
                    finish = "stopped"
                    break
        except BaseException:
            self.history.pop()   # take the turn back: the user sees the error and may send it again
            raise
        finally:
            # A generator left by `break` is only closed when collected; close it now so the
            # decoder rewinds the KV cache to the accepted text before anything else runs.
            stream.close()
        self.history.append({"role": "assistant", "content": "".join(parts)})
        if self.warm_start and drafter is not None:   # what this turn taught, for the next session
            warmstart.save(controller, self.session, kind, sampling.temperature)
        return Reply(finish, n_tokens, self.clock() - start,
                     n_accepted / n_tested if n_tested else None, n_steps, kind)

    def _stream(self, drafter, prompt, sampling, decode, controller) -> Iterator[Chunk]:
        """The chunks of one reply; a test's scripted chat replaces this (and nothing else of `reply`)."""
        return stream_text(self.session.target, drafter, prompt, sampling, decode, controller, self.rng)

    def _drafter(self, kind: str):
        if kind == "none":
            return None
        if kind not in self._drafters:
            self._drafters[kind] = self.session.make_drafter(kind)
        return self._drafters[kind]

    def _controller(self, kind: str, drafter, temperature: float) -> KController:
        key = (kind, warmstart.band(temperature))
        if key not in self._controllers:
            c = self._controllers[key] = KController(
                self.k_max, fixed_k=self.k, draft_cost_free=bool(drafter and drafter.draft_cost_free))
            if self.warm_start and drafter is not None:
                warmstart.load_into(c, self.session, kind, temperature)
        return self._controllers[key]
