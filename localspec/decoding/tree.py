"""Draft trees and their exact verification rule: several candidate continuations in one batch.

A tree's nodes are draft tokens; node i's parent is `parents[i]` (-1: a child of the text, whose
last token the target reads as the root of the batch). Children of one node are that node's
*siblings*, proposed one after another (rank 0 first). A chain is the tree with one branch.

The rule: recursive rejection sampling over the siblings.
At a node reached with the target's distribution p, let its children x_1..x_m be proposed so that
x_i is a draw from a known distribution Q_i, which may depend on x_1..x_{i-1} (never on the coins
below). Start with r = p; for i = 1..m:
- accept x_i with probability min(1, r(x_i) / Q_i(x_i)), and descend into x_i's subtree;
- on rejection, r <- norm(max(0, r - Q_i)) and try x_{i+1}.
If all m are rejected, emit a draw from r (a leaf: r = p, the bonus token).

The Q_i the drafters use:
- a draft model at T > 0 draws siblings from q *without replacement*: Q_i = q with x_1..x_{i-1}
  removed, renormalised (Jeon et al. 2024, "recursive rejection sampling": q is updated as well
  as p, so a rejected token is never proposed again);
- distinct deterministic proposals (prompt lookup's rival continuations, the draft model's top
  tokens at T = 0) are Q_i = one-hot(x_i): accept with r(x_i), on rejection r <- r without x_i;
- i.i.d. siblings from q (SpecInfer's multi-step speculative sampling) are Q_i = q; the rule
  above covers them too, though a repeated rejected token is then wasted.

Derivation (why the emitted token has law p). Claim: from any node with starting residual r and
any proposal scheme as above, the token the procedure finally takes at this depth is distributed
as r, whatever happened before. By induction on the number m of siblings left. m = 0: it draws
from r. m >= 1: x ~ Q and the coin is independent of everything after, so
    P(take y) = Q(y) min(1, r(y)/Q(y)) + sum_x Q(x) (1 - min(1, r(x)/Q(x))) P(rest takes y | x)
              = min(Q(y), r(y)) + beta * r'(y),   beta = sum_x max(0, Q(x) - r(x)),
where by the hypothesis the rest (m - 1 siblings, whose Q may depend on x) takes y with law
r' = max(0, r - Q) / sum max(0, r - Q), the same for every x. As sum (Q - r) = 0, the two masses
sum_x max(0, Q - r) and sum_x max(0, r - Q) are equal, so P(take y) = min(Q, r)(y) + max(0, r - Q)(y)
= r(y). With r = p at every node, each emitted token is a draw from the target's processed
distribution given the tokens before it; descending into the accepted child repeats the argument
with that child's row. The shape of the tree may depend on the drafts (q, the drawn tokens), never
on the target's rows or the coins: it is fixed before verification.

Greedy (T = 0) verification follows, at each depth, the child that equals the target's argmax:
the output is plain greedy decoding's, token for token.

The rule reads one target row per depth it descends (rows are lazy, `sampling.Rows`), and builds at
most one residual per rejected sibling, over p's support.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .dists import Dist


@dataclass(frozen=True)
class DraftTree:
    """Draft tokens in a tree, in an order where every parent comes before its children."""

    tokens: list[int]
    """Node i's token."""
    parents: list[int]
    """Node i's parent node, -1 for a child of the text (the root of the verify batch)."""
    q: list[Dist | None] | None = None
    """Per node, the distribution Q it was proposed from (given its earlier siblings); None at a
    node, or for the whole tree, means one-hot (a deterministic proposal)."""
    children: list[list[int]] = field(default_factory=list)
    """children[0] lists the root's children, children[i + 1] node i's, in proposal order."""

    def __post_init__(self) -> None:
        kids: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i} has parent {p}: a parent must come before its children")
            kids[p + 1].append(i)
        object.__setattr__(self, "children", kids)

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: Sequence[int], q: Sequence[Dist | None] | None = None) -> "DraftTree":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), None if q is None else list(q))

    def rank(self, i: int) -> int:
        """Node i's place among its siblings (0: proposed first)."""
        return self.children[self.parents[i] + 1].index(i)

    def level_sizes(self) -> list[int]:
        """Nodes at depths 1, 2, … (a parent comes before its children, so one pass suffices)."""
        d = [0] * len(self.tokens)
        sizes: list[int] = []
        for i, p in enumerate(self.parents):
            d[i] = 1 + (d[p] if p >= 0 else 0)
            if d[i] > len(sizes):
                sizes.append(0)
            sizes[d[i] - 1] += 1
        return sizes

    def depth(self) -> int:
        """Nodes on the longest branch."""
        return len(self.level_sizes())

    def leaves(self) -> int:
        """Branches: nodes without children (1 for a chain, 0 for no draft)."""
        return sum(1 for kids in self.children[1:] if not kids)

    def path_tokens(self, path: Sequence[int]) -> list[int]:
        return [self.tokens[i] for i in path]

    def is_chain(self) -> bool:
        return all(len(kids) <= 1 for kids in self.children)


def accept_tree_greedy(tree: DraftTree, argmax) -> tuple[list[int], int]:
    """Greedy verification: descend into the child equal to the target's argmax at each depth.

    `argmax[row]` is the target's argmax after the root (row 0) or after node row - 1. Returns (the
    accepted nodes from the root down, the next token: the argmax after the last of them)."""
    path: list[int] = []
    row = 0
    while True:
        best = int(argmax[row])
        nxt = next((c for c in tree.children[row] if tree.tokens[c] == best), None)
        if nxt is None:
            return path, best
        path.append(nxt)
        row = nxt + 1


def accept_tree_sampled(tree: DraftTree, p, rng) -> tuple[list[int], int]:
    """Recursive rejection sampling over each node's siblings (module docstring).

    `p[row]`: the target's processed distribution after the root (row 0) or node row - 1, read only
    for the rows the rule reaches. Returns (accepted nodes from the root down, the emitted token
    after them)."""
    q = tree.q
    path: list[int] = []
    row = 0
    while True:
        r = p[row]
        for c in tree.children[row]:
            x = tree.tokens[c]
            Q = q[c] if q is not None else None
            r_x = r.prob(x)
            q_x = Q.prob(x) if Q is not None else 1.0
            # q_x == 0 cannot happen for a token drawn from Q; accepting iff r_x > 0 keeps the rule total
            if r_x > 0.0 and (r_x >= q_x or rng.random() * q_x < r_x):
                path.append(c)
                row = c + 1
                break
            nxt = r.without(x) if Q is None else r.minus(Q)
            if nxt.total > 0.0:   # 0 only through rounding where r == Q (rejection had probability 0)
                r = nxt
        else:
            return path, r.sample(rng)


def tested_ranks(tree: DraftTree, path: Sequence[int], bonus_row_tried: bool = True) -> list[tuple[int, bool]]:
    """(sibling rank, accepted) of every proposal the rule tried in one step, in order: at each node
    on the path, the ranks before the accepted child were rejected; at the last node every child
    was rejected. Feeds acceptance by sibling rank."""
    out: list[tuple[int, bool]] = []
    row = 0
    for c in path:
        kids = tree.children[row]
        j = kids.index(c)
        out += [(i, False) for i in range(j)] + [(j, True)]
        row = c + 1
    if bonus_row_tried:
        out += [(i, False) for i in range(len(tree.children[row]))]
    return out
