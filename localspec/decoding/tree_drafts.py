"""Drafting trees: the draft model expands siblings level by level, prompt lookup offers the rival
continuations its store knows (tree.py has the rule that verifies them).

The draft model decodes each level of its tree in one batch: a node's first child continues its
parent's sequence of the draft's cache, each further child gets a sequence of its own that starts as
a copy of the parent's cells (copied, not computed: the cache is unified). Siblings are:
- at T = 0, the draft's top tokens (one-hot proposals: deterministic and distinct);
- at T > 0, draws from q without replacement: sibling i's proposal distribution is q with the
  earlier siblings removed (recorded per node, which the rule needs).
After verification `ModelDrafter.settle` keeps the accepted branch's cells and frees the rest.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from localspec.config import MAX_TREE_NODES, tree_leaves
from .drafters import Draft, PromptLookup, split_draft_time
from .model_drafter import ModelDrafter
from .dists import Dist
from .constrain import NothingAllowed
from .processing import window
from .sampling import processed
from .tree import DraftTree


def shape_at(shape: Sequence[int], depth: int) -> int:
    """Children per node at `depth` (0: the root's): the shape's entry, 1 past its end."""
    return shape[depth] if depth < len(shape) else 1


def model_tree(drafter: ModelDrafter, context, k: int, shape: Sequence[int], sampling, rng,
               grammar=None) -> Draft:
    """A tree of depth <= k from the draft model, branching per `shape`, each level one decode;
    under a masked grammar (`grammar`: the state after the context) each node's row is masked by
    the state on its path."""
    m = drafter.model
    row, n_first, first, catchup = drafter.start(context)
    if row is None:
        return Draft([])
    drafter.tree_base = len(m.tokens)
    tokens: list[int] = []
    parents: list[int] = []
    qs: list[Dist | None] = []
    host = 0.0
    states: dict = {}                # node -> its grammar state (masked drafts only)
    free = list(range(m.n_seq - 1, 0, -1))
    frontier = [(-1, 0, row, grammar)]   # (node, its sequence, the draft's row after it, its state)
    # The nodes must fit the target's batch (MAX_TREE_NODES) and the draft's cache cells.
    budget = min(MAX_TREE_NODES, m.n_ctx - drafter.tree_base)
    for depth in range(k):
        h = time.perf_counter()
        b = shape_at(shape, depth)
        if len(tokens) + len(frontier) * b > budget:
            b = 1
            if len(tokens) + len(frontier) > budget:
                break
        level = []
        for node, seq, row, state in frontier:
            if sampling.processed or state is not None:   # as the target's row after the same path will be
                try:
                    row = processed(row, sampling, lambda _: window(context, path_to(node, tokens, parents), sampling),
                                    0, (lambda _: state) if state is not None else None)
                except NothingAllowed:
                    continue
            for x, q in siblings(drafter, row, b, sampling, rng):
                child = None
                if state is not None and not m.is_eog(x) and x < drafter.target_vocab:
                    child = state.fork()
                    child.accept(x)
                states[len(tokens)] = child
                level.append((len(tokens), seq, x))
                tokens.append(x)
                parents.append(node)
                qs.append(q)
        host += time.perf_counter() - h
        if depth == k - 1:
            break
        # Decode the level: nodes after which drafting can go on, each in a sequence of its own.
        rows_tok, rows_seq, nodes, claimed = [], [], [], set()
        for i, seq, x in level:
            if m.is_eog(x) or x >= drafter.target_vocab:
                continue   # nothing sensible follows an end of generation or an id the target lacks
            if seq in claimed:
                if not free:
                    continue
                s = free.pop()
                m.copy_seq(seq, s, drafter.tree_base + depth)
            else:
                s = seq
                claimed.add(seq)
            rows_tok.append(x)
            rows_seq.append(s)
            nodes.append(i)
            drafter.seqs_used[i] = s
        if not nodes:
            break
        out = m.decode_rows(rows_tok, np.array(rows_seq, dtype=np.int64), np.ones(len(nodes), bool))
        frontier = [(i, s, out[j], states.get(i)) for j, (i, s) in enumerate(zip(nodes, rows_seq))]
    sampled = not sampling.greedy
    tree = DraftTree(tokens, parents, qs if sampled else None)
    return Draft(tokens, tree.q, host, source="model", n_first=n_first, t_first=first, tree=tree, catchup=catchup)


def path_to(node: int, tokens: Sequence[int], parents: Sequence[int]) -> list[int]:
    """The drafted tokens from the root down to `node` (-1: the root, none)."""
    path = []
    while node >= 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


def siblings(drafter: ModelDrafter, row: np.ndarray, b: int, sampling, rng) -> list[tuple[int, Dist | None]]:
    """Up to b distinct children from one draft row, with each one's proposal distribution."""
    if sampling.greedy:
        if b == 1:
            return [(int(row.argmax()), None)]
        top = np.argpartition(row, len(row) - b)[len(row) - b:]
        best = int(row.argmax())   # the chain's choice first, whatever the partition's order of ties
        # (a masked row's -inf ids are no siblings)
        rest = sorted((int(t) for t in top if t != best and row[t] > -np.inf), key=lambda t: -float(row[t]))
        return [(t, None) for t in [best, *rest][:b]]
    q = drafter.distribution(row, sampling)
    out = []
    while len(out) < b:
        x = q.sample(rng)
        out.append((x, q))
        q = q.without(x)      # the next sibling is drawn without replacement
        if q.total <= 0.0:
            break
    return out


def lookup_tree(lookup: PromptLookup, context, k: int, shape: Sequence[int]) -> Draft:
    """Prompt lookup's rival continuations as a tree (one-hot proposals, q = None)."""
    tokens, parents, classes = lookup.store.tree(context, k, shape, MAX_TREE_NODES)
    if not tokens:
        return Draft([])
    tree = DraftTree(tokens, parents)
    path = chain_of(tree)
    return Draft(tokens, None, source="lookup", n_lookup=len(path),
                 classes=tuple(classes[i] for i in path), tree=tree)


def chain_of(tree: DraftTree) -> list[int]:
    """The first-ranked branch: the chain the drafter would have proposed alone."""
    path, row = [], 0
    while tree.children[row]:
        c = tree.children[row][0]
        path.append(c)
        row = c + 1
    return path


# -- the decoder's side: which tree, drafting it, learning from it ------------------------------


def width_of(target, drafter) -> int:
    """The most branches this step's caches can hold."""
    width = getattr(target, "n_seq", 1)
    model = model_of(drafter)
    return min(width, model.model.n_seq) if model is not None and source_of(drafter) != "lookup" else width


def model_of(drafter) -> ModelDrafter | None:
    if isinstance(drafter, ModelDrafter):
        return drafter
    inner = getattr(drafter, "model", None)
    return inner if isinstance(inner, ModelDrafter) else None


def source_of(drafter) -> str:
    """Who drafts this step: "model", "lookup", or something that drafts chains only."""
    if isinstance(drafter, ModelDrafter):
        return "model"
    if isinstance(drafter, PromptLookup):
        return "lookup"
    plan = getattr(drafter, "_plan", None)   # AutoDrafter: its plan for this step
    return plan.source if plan is not None else ""


def fit_shape(shape: Sequence[int], width: int) -> tuple[int, ...]:
    """The shape cut down (last depths first) to at most `width` branches."""
    s = list(shape)
    while tree_leaves(s) > width:
        i = max(j for j, b in enumerate(s) if b > 1)
        s[i] -= 1
    return tuple(s)


def choose_shape(setting, controller, drafter, context, k: int, width: int) -> tuple[int, ...] | None:
    """This step's tree shape, None for a chain: the fixed shape, or `--tree auto`'s choice."""
    source = source_of(drafter)
    if setting == "off" or k < 1 or width < 2 or source not in ("model", "lookup"):
        return None
    if isinstance(setting, tuple):   # the shape asked for, unless its k controller found a chain pays more
        shape = fit_shape(setting, width)
        pays = getattr(controller, "tree_pays", None)
        return shape if tree_leaves(shape) > 1 and (pays is None or k >= len(pays) or pays[k]) else None
    if controller.starting() or controller.verify_cost(1) is None:
        return None   # nothing measured yet to compare a tree with
    if controller.probes.probing:
        return None   # a probe times the chain's drafting and acceptance, which decide plain or not
    kept = controller.trees.kept(source, width)
    if kept is not None:
        return kept[0]   # the decision of a recent step with the same k: no curve to fit
    verify = controller.verify_curve(min(k * width, MAX_TREE_NODES) + 1)
    if source == "model":
        first = controller.acceptance.rates(k)
        draft_chain = float(controller.draft_seconds(k)[k])
        row_cost = controller.first_decode.extra(3)   # one row more in a draft decode
    else:
        lookup = drafter if isinstance(drafter, PromptLookup) else drafter.lookup
        classes = lookup.candidate()[1][:k]
        if len(classes) < k:
            return None
        first = controller.lookup.rates(classes)
        draft_chain = row_cost = 0.0
    return controller.trees.choose(source, k, width, first, draft_chain, row_cost, verify)


def propose_tree(drafter, context, k: int, shape: Sequence[int], sampling, rng, grammar=None) -> Draft:
    """Draft a tree of this shape with whoever drafts this step (`grammar`: as `Drafter.propose`)."""
    source = source_of(drafter)
    model = model_of(drafter)
    if source == "model" and model is not None:
        return model_tree(model, context, k, shape, sampling, rng, grammar)
    lookup = drafter if isinstance(drafter, PromptLookup) else getattr(drafter, "lookup", None)
    if source == "lookup" and lookup is not None:
        lookup.store.update(context)
        return lookup_tree(lookup, context, k, shape)
    return drafter.propose(context, k, sampling, rng, grammar=grammar)


def learn_tree(drafter, controller, k: int, draft: Draft, path: Sequence[int], trials, t_draft: float,
               t_verify: float) -> None:
    """What a tree step teaches: sibling acceptance by rank, the first-ranked proposals' acceptance
    (as the chain's: the depths up to the first one a first-ranked child lost), and the cost of
    its rows. With a fixed --tree SHAPE every step is a tree, and the k controller, which prices
    those trees, learns their verify and draft costs; under --tree auto the chain's costs stay the
    chain's (a tree's rows and levels would skew them) and the tree chooser keeps its own verify
    timings by rows. The draft keeps the accepted branch."""
    tree = draft.tree
    fixed = controller.tree_shape is not None
    if fixed:
        controller.observe_verify(len(tree) + 1, t_verify)
    else:
        controller.trees.observe_verify(len(tree) + 1, t_verify)
    firsts = [ok for rank, ok in trials if rank == 0]
    n_acc = next((i for i, ok in enumerate(firsts) if not ok), len(firsts))
    n_tested = min(n_acc + 1, len(firsts))
    source = draft.source
    controller.trees.observe(source, trials)
    model = model_of(drafter)
    if source == "model" and model is not None:
        model.settle(path)
        if fixed:
            sizes = tree.level_sizes()
            extra = sum(n - 1 for n in sizes[:-1]) * controller.first_decode.extra(3)
            drafting, catchup = split_draft_time(controller, draft, t_draft)
            # every depth was drafted (and timed); the first proposals were tested up to n_tested
            controller.observe_draft(tree.depth(), n_acc, max(drafting - extra, 0.0), catchup)
        else:   # the tree chooser keeps the tree's costs; its first proposals are the chain's
            controller.acceptance.observe(tree.depth(), n_acc)
            controller.drafted_here = True
    elif source == "lookup":
        controller.lookup.observe(draft.classes[:n_tested], n_acc)
    lookup = drafter if isinstance(drafter, PromptLookup) else getattr(drafter, "lookup", None)
    if isinstance(lookup, PromptLookup):
        lookup.forget()   # the next step looks up afresh


def as_chain(draft: Draft) -> Draft:
    """The tree's first-ranked branch as a plain chain draft (when a tree does not fit the cache)."""
    path = chain_of(draft.tree)
    q = None if draft.q is None else [draft.q[i] for i in path]
    return Draft([draft.tokens[i] for i in path], q, draft.t_host, draft.source,
                 len(path) if draft.n_lookup else 0, draft.classes[:len(path)], draft.n_first, draft.t_first,
                 catchup=draft.catchup)
