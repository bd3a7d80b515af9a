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

from localspec.chats import conversation
from localspec.loading.controllers import Controllers, k_max_for
from localspec.config import ConfigError, DecodeConfig, SamplingConfig
from localspec.decoding.decoder import Step
from localspec.tokens import common_prefix
from localspec.decoding.stats import RunStats
from localspec.decoding.stats import served as stats_served
from localspec.decoding.stream import Chunk, stream_text

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
            trees, steps = total.tree_steps, total.n_steps
        # The window's α, tokens per target pass and decode tokens/s as localspec.decoding.stats defines
        # them (a pass that emitted nothing, the end-of-generation one, is no pass of the output).
        window = RunStats()
        for step in recent:
            window.add(step)
        tps = window.tokens_per_second
        plain_tps = 1.0 / plain if plain else None
        return {
            "alpha_all": alpha_all,
            "alpha_recent": window.alpha,
            "draft_efficiency": efficiency,
            "spark": [float(len(s.tokens)) for s in recent],
            "k_now": recent[-1].k if recent else None,
            "tokens_per_pass": window.tokens_per_pass,
            "tps": tps,
            "plain_tps": plain_tps,
            "speedup": tps / plain_tps if tps and plain_tps else None,
            "drafted": drafted,
            "accepted": accepted,
            "by_position": by_position,
            # who served the passes, e.g. "M62 L30 P8", and who served the last one
            "served": stats_served(served) if served else None,
            "source_now": (recent[-1].source or "plain") if recent else None,
            # steps that verified a draft tree (more than one branch), of all steps; and the last one
            "tree_steps": trees,
            "n_steps": steps,
            "tree_now": bool(recent) and recent[-1].branches > 1,
        }


@dataclass(frozen=True)
class Turn:
    """A prompt ready to generate from."""

    prompt: list[int]
    dropped: int
    """Oldest messages removed from the history so that the prompt leaves the reply its room
    (`conversation.reply_room`)."""
    cached: int
    """Prompt tokens already in the target's KV cache (not evaluated again)."""
    base: str | None = None
    """Continuing the last reply (`Chat.prepare_continue`): its text as the model sees it, which
    the continuation extends. None: a new reply."""


@dataclass(frozen=True)
class Reply:
    finish: str
    """"stop", "length", "context" (n_ctx reached) or "stopped" (the user pressed Esc)."""
    stats: RunStats
    """This reply's target passes (for a continuation: the continuation's), whose numbers are
    localspec.stats' own: tokens, α, tokens per target pass, decode-only tokens/s."""
    seconds: float
    """From the start of the reply to its last token: the prompt's prefill included."""
    drafter: str = "none"
    """The drafter the reply was generated with (settings changed meanwhile apply to the next)."""
    n_prompt: int = 0
    cached: int = 0
    """Prompt tokens, and those of them the KV cache held already."""
    continued: bool = False
    """It continued the last reply (`/continue`) rather than answering a new message."""

    @property
    def n_tokens(self) -> int:
        return self.stats.n_tokens

    @property
    def n_steps(self) -> int:
        return self.stats.n_steps

    @property
    def alpha(self) -> float | None:
        return self.stats.alpha


class Chat:
    """A conversation with one loaded Session. Settings changed while a reply runs apply to the next."""

    def __init__(self, session, sampling: SamplingConfig, k: int | None = None,
                 max_tokens: int | None = None, system: str | None = None, k_max: int | None = None,
                 warm_start: bool = True, clock: Callable[[], float] = time.perf_counter,
                 tree: str | tuple[int, ...] = "off") -> None:
        self.session = session
        self.tree = tree
        """Draft trees of every reply (`DecodeConfig.tree`); the session's models hold its n_seq."""
        self.clock = clock   # a test's scripted chat gives a fake one, so its numbers are fixed
        self.sampling = sampling
        self.k = k
        self.k_max = k_max_for(k, k_max)
        self.max_tokens = max_tokens
        """A cap on each reply; None: a reply runs until the model stops or the context is full."""
        self.system = system
        self.history: list[dict[str, str]] = []   # user/assistant messages; the system prompt apart
        self.drafter_kind = session.drafter_kind
        self._spec_kind = self.drafter_kind if self.drafter_kind != "none" else self.kinds[0]
        self._drafters: dict[str, object] = {}
        # One controller per drafter and temperature band for the whole session, as the server
        # keeps them: what a turn taught carries over to the next.
        self._controllers = Controllers(session, k=k, k_max=self.k_max, warm=warm_start)
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
        oldest user/assistant pairs (never the system prompt) while the prompt leaves the reply
        less than its room (`conversation.reply_room`)."""
        self.history.append({"role": "user", "content": text})
        try:
            return self._fit(self.session.target.chat_prompt)
        except ConfigError:
            self.history.pop()
            raise

    def prepare_continue(self) -> Turn:
        """The prompt that continues the last reply: the conversation with that reply's turn left
        open (`conversation.open_turn`), so the model goes on from its last token."""
        if not self.history or self.history[-1]["role"] != "assistant":
            raise ConfigError("nothing to continue: the conversation does not end with a reply")
        render = self.session.target.chat_prompt
        last = self.history[-1]
        was, last["content"] = last["content"], conversation.seen_content(render, self.messages())
        try:
            return self._fit(lambda messages: conversation.open_turn(render, messages), base=last["content"])
        except ConfigError as e:
            last["content"] = was
            if isinstance(e, conversation.PromptTooLong):
                raise ConfigError(f"cannot continue: the reply and the message it answers fill the context "
                                  f"(n_ctx {self.session.target.n_ctx}); /reset starts over, or restart with "
                                  f"a larger --n-ctx") from None
            raise

    def _fit(self, render, base: str | None = None) -> Turn:
        target = self.session.target
        room = conversation.reply_room(target.n_ctx, self.max_tokens)
        fitted = conversation.fit(self.system, self.history, render, target.n_ctx, room)
        del self.history[:fitted.dropped]
        # The decoder syncs the cache to prompt[:-1]; this much of it is already there.
        return Turn(fitted.prompt, fitted.dropped, common_prefix(target.tokens, fitted.prompt[:-1]), base)

    def reply(self, turn: Turn, on_chunk: Callable[[Chunk], None]) -> Reply:
        """Generate the assistant's reply to a prepared turn, or the continuation of the last one;
        stops between target passes once `self.stop` is set. The text generated so far (even if
        stopped) joins the history: a new assistant message, or the continued one grows."""
        kind, sampling = self.drafter_kind, self.sampling
        drafter = self._drafter(kind)
        controller = self._controllers.get(drafter, sampling.temperature)
        # No cap: the context bounds the reply (the decoder ends it there, finish "context").
        decode = DecodeConfig(max_tokens=self.max_tokens or self.session.target.n_ctx, k=self.k, k_max=self.k_max,
                              tree=self.tree)
        parts: list[str] = []
        run = RunStats()
        finish = "stop"
        start = self.clock()
        stream = self._stream(drafter, turn.prompt, sampling, decode, controller)
        try:
            for chunk in stream:
                self.live.add(chunk.step)
                run.add(chunk.step)
                parts.append(chunk.text)
                on_chunk(chunk)
                if chunk.step.finish is not None:
                    finish = chunk.step.finish
                elif self.stop.is_set():
                    finish = "stopped"
                    break
        except BaseException:
            if turn.base is None:
                self.history.pop()   # take the turn back: the user sees the error and may send it again
            else:   # a continuation keeps what it wrote, as one stopped would
                self.history[-1]["content"] = turn.base + "".join(parts)
            raise
        finally:
            # A generator left by `break` is only closed when collected; close it now so the
            # decoder rewinds the KV cache to the accepted text before anything else runs.
            stream.close()
        if turn.base is None:
            self.history.append({"role": "assistant", "content": "".join(parts)})
        else:
            self.history[-1]["content"] = turn.base + "".join(parts)
        self._controllers.save(drafter, sampling.temperature)   # what this turn taught, for the next session
        return Reply(finish, run, self.clock() - start, kind, len(turn.prompt), turn.cached, turn.base is not None)

    def _stream(self, drafter, prompt, sampling, decode, controller) -> Iterator[Chunk]:
        """The chunks of one reply; a test's scripted chat replaces this (and nothing else of `reply`)."""
        return stream_text(self.session.target, drafter, prompt, sampling, decode, controller, self.rng)

    def _drafter(self, kind: str):
        if kind == "none":
            return None
        if kind not in self._drafters:
            self._drafters[kind] = self.session.make_drafter(kind)
        return self._drafters[kind]
