"""The speculative decoding loop: draft → verify in one batch → accept → roll back.

`generate_steps` yields one `Step` per target pass. Plain decoding is the same loop with k = 0, so
both paths share every line that could make them differ. Each step is the paper's phases, one
function each: `_draft` (k, and a chain or a tree), `_verify_tree` / `_verify_chain` (one target
decode, then the acceptance rule: a `Verdict`), `_emit` (the accepted tokens and the target's
next, cut at an end of generation, max_tokens or a stop string), then the loop settles the text,
the grammar state and the cache, `_learn` tells the controller, and `_report` makes the `Step`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from .acceptance import accept_greedy, accept_sampled
from .constrain import NothingAllowed, RowStates
from localspec.config import DecodeConfig, SamplingConfig
from .controller import KController
from .drafters import Drafter
from .overlap import Judge, overlapped
from .processing import check_bias_ids, window
from .sampling import Argmax, BadLogits, Rows
from .tree import DraftTree, accept_tree_greedy, accept_tree_sampled, tested_ranks
from .tree_drafts import as_chain, choose_shape, learn_tree, propose_tree, width_of


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
    n_nodes: int = 0
    """Draft tokens verified: n_drafted for a chain, every node for a tree."""
    branches: int = 1
    """Branches verified this step (1: a chain or plain; more: a draft tree)."""
    sibling_trials: tuple[tuple[int, bool], ...] = ()
    """Per proposal the rule tried, in order: (its rank among its siblings, accepted?). On a
    chain every rank is 0; a tree's later siblings are tried only after the earlier ones failed."""

    def kinds(self) -> tuple[str, ...]:
        """Per emitted token: "lookup" or "model" (an accepted draft token), "target" otherwise."""
        model = "model" if self.source in ("model", "mixed") else "lookup"
        return tuple("target" if not d else "lookup" if i < self.n_lookup else model
                     for i, d in enumerate(self.from_draft))


def tree_batch(tree: DraftTree, last: int, n_vocab: int, grammar=None, is_eog=None):
    """The target's batch for a tree: the text's last token as the root (row 0), then the nodes the
    target can read (an id past its vocabulary, from a padded draft vocabulary, or one the grammar
    forbids after its parent, has p = 0 and no children: it is left out, and the rule rejects it).
    Returns (tokens, parents, at, states): at[i + 1] is node i's row, at[0] = 0 the root's; states
    the grammar state of each row (None without a grammar)."""
    tokens, parents, at = [last], [-1], [0]
    states = RowStates(grammar, tokens, parents, is_eog) if grammar is not None else None
    for tok, parent in zip(tree.tokens, tree.parents):
        row = at[parent + 1]
        if tok < n_vocab and row >= 0 and (states is None or bool(states(row).allowed([tok])[0])):
            at.append(len(tokens))
            tokens.append(tok)
            parents.append(row)
        else:
            at.append(-1)
    return tokens, parents, at, states


class Mapped:
    """Rows of a tree's verify batch by node (row i + 1 = after node i), through `at`."""

    def __init__(self, rows, at: list[int]):
        self._rows, self._at = rows, at

    def __getitem__(self, i: int):
        return self._rows[self._at[i]]


def chain_seen(context: list[int], drafted: Sequence[int], sampling: SamplingConfig):
    """What verify row i follows, for the penalties: the text, then the first i drafted tokens."""
    return lambda i: window(context, drafted[:i], sampling)


def tree_seen(context: list[int], tokens: Sequence[int], parents: Sequence[int], sampling: SamplingConfig):
    """The same for a tree's verify rows: the text, then the nodes on the path to row i."""
    def seen(i: int) -> list[int]:
        path = []
        while i > 0:   # row 0 is the root: the text's last token, already in `context`
            path.append(tokens[i])
            i = parents[i]
        return window(context, path[::-1], sampling)
    return seen


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
    check_bias_ids(sampling, target.n_vocab)
    rng, drafting, guessing, controller = _prepare(drafter, sampling, decode, controller, rng)
    # Draft on while the target verifies, where its decode waits on other machines and leaves a core
    # free (overlap.py); a step with processing or a grammar is not overlapped (its rows need the text).
    # Never on a slot (`batched`: serve --parallel), even when asked: its Batcher makes one decode at a
    # time and counts each generation as one thread, so a verify thread would count as a generation
    # of its own, and another slot's draft decode could run while this thread reads its draft row, a
    # view into that same logits buffer. Nothing is lost: the batcher's decodes never run side by side.
    judge = None
    batched = getattr(target, "batched", False)
    if decode.overlap is None and getattr(target, "remote", False) and not batched:
        judge = Judge.of(target)   # (it times the CPUs during decodes: not where it cannot be used)
    overlap = (decode.overlap or judge is not None) and not (sampling.grammar or sampling.processed) \
        and hasattr(drafter, "draft_ahead") and not batched
    context = list(prompt)
    produced = 0
    # Under a grammar, the state after the text; each step's rows fork it (constrain.RowStates).
    grammar = target.grammar(sampling.grammar) if sampling.grammar else None
    target.sync(context[:-1])
    if drafter is not None:
        drafter.prepare(context)
    try:
        while True:
            t0 = time.perf_counter()
            k, draft, tree = _draft(target, drafter, context, produced, decode, controller, sampling, drafting, grammar)
            t1 = time.perf_counter()
            if tree is not None:
                v = _verify_tree(target, tree, context, sampling, grammar, rng)
            else:
                ahead = None
                if (overlap and draft is not None and draft.source == "model" and draft.tokens
                        and (judge is None or judge.verdict)):
                    ahead = lambda done: drafter.draft_ahead(  # noqa: E731
                        context, draft, sampling, drafting, guessing, done)
                v = _verify_chain(target, draft, context, sampling, grammar, rng, ahead, judge)
            emitted, from_draft, finish, withdrawn = _emit(target, v, produced, decode, stop)
            if grammar is not None and finish is None:
                grammar = v.states(v.last_row)   # the accepted path's state (rows read are built)
                grammar.accept(v.nxt)
            context.extend(emitted)
            del context[len(context) - withdrawn:]
            produced += len(emitted) - withdrawn
            if finish is None and len(context) >= target.n_ctx:
                finish = "context"
            target.truncate(len(context) - 1)
            _learn(drafter, controller, k, draft, tree, v, t1 - t0, time.perf_counter() - t1 - v.t_ahead)
            yield _report(k, draft, tree, v, emitted, from_draft, finish, withdrawn, t0, t1)
            if finish is not None:
                return
    except BadLogits as e:
        e.model = e.model or f"the target {target.name}"
        raise
    except NothingAllowed as e:
        raise NothingAllowed(f"the target {target.name}: {e}") from None
    finally:
        # Whatever happened (early close, error mid-step), leave only the accepted text's prefix.
        if len(target.tokens) > len(context) - 1:
            target.truncate(len(context) - 1)


# -- the phases of a step: draft, verify (a tree or a chain), emit, learn ------------------------------

def _prepare(drafter, sampling: SamplingConfig, decode: DecodeConfig, controller, rng):
    """(the acceptance rng, the drafting rng, the guesses' rng, the controller) for one generation."""
    if rng is None:
        rng = np.random.default_rng(sampling.seed)
    # Drafting draws from a stream of its own: what a drafter consumes (a draft model samples its
    # tokens, lookup draws nothing) never shifts the acceptance draws, which stay `rng`'s. Seeded
    # by one draw of `rng` (Generator.spawn would do, but needs numpy >= 1.25; 1.24 is allowed).
    # Guesses at the bonus token while drafting ahead (overlap.py) have a third: how many are drawn
    # depends on timing, and no draw the text depends on may move with it.
    seed = int(rng.integers(1 << 63))
    drafting, guessing = np.random.default_rng(seed), np.random.default_rng([seed, 1])
    if controller is None:
        controller = KController(
            decode.k_max, fixed_k=decode.k, draft_cost_free=bool(drafter and drafter.draft_cost_free)
        )
    controller.tree_shape = decode.tree_shape   # a fixed shape: the k controller prices its trees
    return rng, drafting, guessing, controller


def _draft(target, drafter, context, produced, decode, controller, sampling, drafting, grammar):
    """(k, the draft or None, its tree when it has several branches, else None)."""
    room = min(decode.max_tokens - produced, target.n_ctx - len(context)) - 1
    k = 0
    if drafter is not None and room > 0:
        k = drafter.plan(context, min(max(decode.k_max, decode.k or 0), room), controller)
    if not k:
        return 0, None, None
    shape = choose_shape(decode.tree, controller, drafter, context, k, width_of(target, drafter))
    # The draft's rows get the same mask when asked (DecodeConfig.mask_draft), from a fork.
    masked = grammar.fork() if grammar is not None and decode.mask_draft else None
    if shape:
        draft = propose_tree(drafter, context, k, shape, sampling, drafting, grammar=masked)
    else:
        draft = drafter.propose(context, k, sampling, drafting, grammar=masked)
    if draft is not None and draft.tree is not None and len(context) + len(draft.tree) > target.n_ctx:
        draft = as_chain(draft)   # the branches would not fit the cache's free cells
    tree = draft.tree if draft is not None and draft.tree is not None and not draft.tree.is_chain() else None
    return k, draft, tree


@dataclass(frozen=True)
class Verdict:
    """What verifying one draft decided."""

    drafted: list[int]
    """The draft tokens along the path the rule walked (a chain's tokens; a tree's accepted path)."""
    n_acc: int
    """How many of them were accepted."""
    nxt: int
    """The token the target adds after them (a correction, or the bonus token)."""
    last_row: int
    """The verify row that `nxt` was drawn from."""
    trials: tuple[tuple[int, bool], ...]
    """Step.sibling_trials."""
    states: object
    """Under a grammar, the rows' grammar states (constrain.RowStates), else None."""
    t_decoded: float
    """perf_counter() when the target's decode returned."""
    path: Sequence[int] = ()
    """A tree's accepted nodes (empty for a chain)."""
    t_ahead: float = 0.0
    """Seconds the draft model drafted on after the target's decode returned (`overlap`): drafting,
    not verifying."""


def _verify_tree(target, tree, context, sampling, grammar, rng) -> Verdict:
    """One decode verifies every branch; only the accepted one stays in the cache."""
    tokens, parents, at, states = tree_batch(tree, context[-1], target.n_vocab, grammar, target.is_eog)
    logits = target.eval_tree(tokens, parents)
    t_decoded = time.perf_counter()
    kept: list[int] = []   # whatever happens, the cache keeps the root and this path
    seen = tree_seen(context, tokens, parents, sampling)
    try:
        if sampling.greedy:
            path, nxt = accept_tree_greedy(tree, Mapped(Argmax(logits, sampling, seen, states), at))
        else:
            path, nxt = accept_tree_sampled(tree, Mapped(Rows(logits, sampling, seen, states), at), rng)
        kept = [0, *(at[c + 1] for c in path)]
    finally:
        target.keep_path(kept or [0])
    return Verdict(tree.path_tokens(path), len(path), nxt, kept[-1], tuple(tested_ranks(tree, path)), states,
                   t_decoded, path)


def _verify_chain(target, draft, context, sampling, grammar, rng, ahead=None, judge=None) -> Verdict:
    """The text's last token and the draft in one decode (plain decoding: the last token alone);
    `ahead(done)`: what runs while the decode does (`overlap.overlapped`); `judge`: what watches a
    decode that runs alone (`overlap.Judge`)."""
    drafted = draft.tokens if draft else []
    # A padded draft vocabulary can propose an id the target lacks: verify the part before it; the
    # rule then rejects that id (p = 0) using the last row.
    n_valid = len(drafted)
    if drafted and max(drafted) >= target.n_vocab:
        n_valid = next(i for i, t in enumerate(drafted) if t >= target.n_vocab)
    # Likewise a token the grammar forbids (an unmasked or lookup draft): p = 0 there.
    states = RowStates(grammar, [context[-1], *drafted], None, target.is_eog) if grammar is not None else None
    if states is not None:
        n_valid = next((i for i in range(n_valid) if not states.allows(i + 1)), n_valid)
    batch = [context[-1], *drafted[:n_valid]]
    run = lambda: target.eval(batch, logits_from=0)   # noqa: E731
    if ahead is not None:
        logits, t_decoded, t_ahead = overlapped(run, ahead)
    else:
        logits, t_decoded, t_ahead = judge.watch(run) if judge else run(), time.perf_counter(), 0.0
    seen = chain_seen(context, drafted, sampling)
    if sampling.greedy:
        n_acc, nxt = accept_greedy(drafted, Argmax(logits, sampling, seen, states))
    else:
        n_acc, nxt = accept_sampled(drafted, Rows(logits, sampling, seen, states), draft.q if draft else None, rng)
    trials = ((0, True),) * n_acc + (((0, False),) if n_acc < len(drafted) else ())
    return Verdict(drafted, n_acc, nxt, n_acc, trials, states, t_decoded, t_ahead=t_ahead)


def _emit(target, v: Verdict, produced: int, decode: DecodeConfig, stop: StopHook | None):
    """(emitted tokens, per token whether it was drafted, finish, tokens of earlier steps withdrawn):
    the accepted tokens and the target's next, up to an end of generation, max_tokens or a stop
    string."""
    emitted = [*v.drafted[:v.n_acc], v.nxt]
    from_draft = [True] * v.n_acc + [False]
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
        # A stop string completed (it wins over "length"): keep what makes the text before it,
        # which may end in an earlier step (keep < 0 takes back that many tokens).
        keep, withdrawn = max(keep, 0), max(-keep, 0)
        emitted, from_draft, finish = emitted[:keep], from_draft[:keep], "stop"
    return emitted, from_draft, finish, withdrawn


def _learn(drafter, controller, k, draft, tree, v: Verdict, t_draft: float, t_rest: float) -> None:
    """Tell the drafter and the controller what the step cost and won. The price of verifying b
    tokens includes turning their b rows into the decision (t_rest)."""
    if tree is not None:
        learn_tree(drafter, controller, k, draft, v.path, v.trials, t_draft, t_rest)
    elif drafter is not None:
        drafter.learn(controller, k, draft, v.n_acc, t_draft, t_rest)
    else:
        controller.observe(0, 0, 0, t_draft, t_rest)


def _report(k, draft, tree, v: Verdict, emitted, from_draft, finish, withdrawn, t0: float, t1: float) -> Step:
    return Step(
        tokens=tuple(emitted),
        from_draft=tuple(from_draft),
        source=draft.source if draft else "",
        n_lookup=min(draft.n_lookup, v.n_acc) if draft else 0,
        k=k,
        n_drafted=tree.depth() if tree is not None else len(v.drafted),
        n_accepted=v.n_acc,
        n_nodes=len(tree) if tree is not None else len(v.drafted),
        branches=tree.leaves() if tree is not None else 1,
        sibling_trials=v.trials,
        t_draft=t1 - t0 + v.t_ahead,
        t_verify=v.t_decoded - t1,
        t_python=time.perf_counter() - v.t_decoded - v.t_ahead,
        t_draft_host=draft.t_host if draft else 0.0,
        finish=finish,
        withdrawn=withdrawn,
    )
