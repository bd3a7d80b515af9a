"""The speculative decoding loop: draft → verify in one batch → accept → roll back.

`generate_steps` yields one `Step` per target pass. Plain decoding is the same loop with k = 0, so
both paths share every line that could make them differ.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from .acceptance import accept_greedy, accept_sampled
from localspec.config import DecodeConfig, SamplingConfig
from .controller import KController
from .drafters import Drafter
from .sampling import Argmax, BadLogits, Rows


@dataclass(frozen=True)
class Step:
    """What one target pass produced."""

    tokens: tuple[int, ...]
    """Tokens emitted this step, in order (end-of-generation tokens, and what a stop string cuts,
    are not emitted)."""
    from_draft: tuple[bool, ...]
    """Per emitted token: True for an accepted draft token, False for the target's own token."""
    k: int
    """Draft length chosen for this step (0 = plain decoding)."""
    n_drafted: int
    """Tokens the drafter actually proposed (≤ k)."""
    n_accepted: int
    """Drafted tokens the target accepted."""
    t_draft: float
    """Seconds spent drafting (the draft model's decodes and its host work, choosing k)."""
    t_verify: float
    """Seconds spent in the target's batched evaluation."""
    t_python: float
    """Target-side host seconds: everything after the verify decode (processing the verified rows,
    acceptance, bookkeeping, control)."""
    t_draft_host: float = 0.0
    """Draft-side host seconds, part of t_draft: turning each drafted row into a token."""
    finish: str | None = None
    """None while generating; "stop" (end-of-generation token or stop string), "length" (max
    tokens) or "context" (n_ctx reached) on the last step."""
    withdrawn: int = 0
    """Tokens of earlier steps that a stop string took back (on the last step only): the stop
    string began in text they made. `stream_text` holds such tokens back, so it never shows them."""
    source: str = ""
    """Who drafted this step: "" (plain), "model", "lookup" or "mixed" (lookup, then the model)."""
    n_lookup: int = 0
    """Accepted tokens (the first ones of `tokens`) that prompt lookup proposed; the other
    accepted draft tokens came from the draft model."""

    def kinds(self) -> tuple[str, ...]:
        """Per emitted token: "lookup" or "model" (an accepted draft token), "target" otherwise."""
        model = "model" if self.source in ("model", "mixed") else "lookup"
        return tuple("target" if not d else "lookup" if i < self.n_lookup else model
                     for i, d in enumerate(self.from_draft))


StopHook = Callable[[list[int]], "int | None"]
"""Told each step's tokens (in order, once each); answers None, or — when a stop string has
completed — how many of them to keep (negative: also drop that many tokens of earlier steps)."""


def generate_steps(
    target,
    drafter: Drafter | None,
    prompt: Sequence[int],
    sampling: SamplingConfig,
    decode: DecodeConfig,
    controller: KController | None = None,
    rng: np.random.Generator | None = None,
    stop: StopHook | None = None,
) -> Iterator[Step]:
    """Generate from `prompt` with `target`, speculating with `drafter` (None = plain decoding).

    The target's KV cache holds every token but the last of the text so far; each step feeds that
    last token plus the draft in one batch. Closing the generator early leaves the cache consistent.
    `stop` (see `StopHook`) ends generation at a stop string: what it cuts is neither yielded nor
    left in the cache, and the finish is "stop" even when the same step reached max_tokens.
    """
    if not prompt:
        raise ValueError("empty prompt")
    if rng is None:
        rng = np.random.default_rng(sampling.seed)
    # Drafting draws from a stream of its own: what a drafter consumes (a draft model samples its
    # tokens, lookup draws nothing) never shifts the acceptance draws, which stay `rng`'s. Seeded
    # by one draw of `rng` (Generator.spawn would do, but needs numpy >= 1.25; 1.24 is allowed).
    drafting = np.random.default_rng(rng.integers(1 << 63))
    if controller is None:
        controller = KController(
            decode.k_max, fixed_k=decode.k, draft_cost_free=bool(drafter and drafter.draft_cost_free)
        )
    context = list(prompt)
    produced = 0
    target.sync(context[:-1])
    if drafter is not None:
        drafter.prepare(context)
    try:
        while True:
            t0 = time.perf_counter()
            room = min(decode.max_tokens - produced, target.n_ctx - len(context)) - 1
            k = 0
            if drafter is not None and room > 0:
                k = drafter.plan(context, min(max(decode.k_max, decode.k or 0), room), controller)
            draft = drafter.propose(context, k, sampling, drafting) if k > 0 else None
            drafted = draft.tokens if draft else []
            t1 = time.perf_counter()
            # A padded draft vocabulary can propose an id the target lacks: verify the part before
            # it; the rule then rejects that id (p = 0) using the last row.
            n_valid = len(drafted)
            if drafted and max(drafted) >= target.n_vocab:
                n_valid = next(i for i, t in enumerate(drafted) if t >= target.n_vocab)
            logits = target.eval([context[-1], *drafted[:n_valid]], logits_from=0)
            t2 = time.perf_counter()
            if sampling.greedy:
                n_acc, nxt = accept_greedy(drafted, Argmax(logits))
            else:
                n_acc, nxt = accept_sampled(drafted, Rows(logits, sampling), draft.q if draft else None, rng)
            emitted = [*drafted[:n_acc], nxt]
            from_draft = [True] * n_acc + [False]
            finish = None
            for i, tok in enumerate(emitted):
                if target.is_eog(tok):
                    emitted, from_draft, finish = emitted[:i], from_draft[:i], "stop"
                    break
            if finish is None and produced + len(emitted) >= decode.max_tokens:
                cut = decode.max_tokens - produced
                emitted, from_draft, finish = emitted[:cut], from_draft[:cut], "length"
            withdrawn = 0
            if stop is not None and (keep := stop(emitted)) is not None:
                # A stop string completed (it wins over "length"): keep what makes the text before
                # it, which may end in an earlier step (keep < 0 takes back that many tokens).
                keep, withdrawn = max(keep, 0), max(-keep, 0)
                emitted, from_draft, finish = emitted[:keep], from_draft[:keep], "stop"
            context.extend(emitted)
            del context[len(context) - withdrawn:]
            produced += len(emitted) - withdrawn
            if finish is None and len(context) >= target.n_ctx:
                finish = "context"
            target.truncate(len(context) - 1)
            # The price of verifying b tokens includes turning their b rows into the decision.
            if drafter is not None:
                drafter.learn(controller, k, draft, n_acc, t1 - t0, time.perf_counter() - t1)
            else:
                controller.observe(0, 0, 0, t1 - t0, time.perf_counter() - t1)
            t3 = time.perf_counter()
            yield Step(
                tokens=tuple(emitted),
                from_draft=tuple(from_draft),
                source=draft.source if draft else "",
                n_lookup=min(draft.n_lookup, n_acc) if draft else 0,
                k=k,
                n_drafted=len(drafted),
                n_accepted=n_acc,
                t_draft=t1 - t0,
                t_verify=t2 - t1,
                t_python=t3 - t2,
                t_draft_host=draft.t_host if draft else 0.0,
                finish=finish,
                withdrawn=withdrawn,
            )
            if finish is not None:
                return
    except BadLogits as e:
        e.model = e.model or f"the target {target.name}"
        raise
    finally:
        # Whatever happened (early close, error mid-step), leave only the accepted text's prefix.
        if len(target.tokens) > len(context) - 1:
            target.truncate(len(context) - 1)
