"""The verification rule of speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Names as in the paper: p = target distribution, q = draft distribution. Pure numpy, no model.

Given k drafted tokens x_1..x_k and the target's distributions p_1..p_{k+1} (row i is the target's
distribution for the position of x_i; row k+1 follows the last draft):
- accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
- at the first rejection emit a token drawn from norm(max(0, p_i - q_i)) and stop;
- if all k are accepted, emit a bonus token drawn from p_{k+1}.
A draft without probabilities (prompt lookup) is the case q_i = one-hot(x_i): accept with
probability p_i(x_i); on rejection draw from p_i with x_i removed. Either way every emitted token is
distributed exactly as the target alone would have produced it.

The rule reads p and q only at the drafted ids, and builds one residual, over p's support, at the
first rejection; rows are read in order, so a lazy `sampling.Rows` never processes the rows after
a rejection.
"""

from __future__ import annotations

from typing import Sequence

from .dists import Dist


def accept_greedy(draft: Sequence[int], target_argmax: Sequence[int]) -> tuple[int, int]:
    """Greedy verification: accept while the target's argmax equals the draft token.

    `target_argmax` has len(draft) + 1 entries (read in order, up to the first mismatch). Returns
    (number accepted, next token): the target's argmax at the first mismatch or the bonus position.
    """
    n = 0
    for x in draft:
        best = int(target_argmax[n])
        if int(x) != best:
            return n, best
        n += 1
    return n, int(target_argmax[n])


def accept_sampled(
    draft: Sequence[int],
    p: Sequence[Dist],
    q: Sequence[Dist | None] | None,
    rng,
) -> tuple[int, int]:
    """Stochastic verification. Returns (number of draft tokens accepted, the token emitted after them).

    p: k+1 target distributions (read in order, up to the first rejection). q: the k distributions
    the draft tokens were sampled from, or None for drafts proposed without a distribution; in a
    mixed draft single entries are None (those tokens were proposed one-hot, by prompt lookup).
    """
    for i, x in enumerate(draft):
        x = int(x)
        p_i = p[i]
        # An id past the target's vocabulary (a padded draft vocabulary) has p = 0: rejected.
        p_x = p_i.prob(x)
        q_i = q[i] if q is not None else None   # None: proposed without a distribution (one-hot)
        q_x = q_i.prob(x) if q_i is not None else 1.0
        # q_x == 0 cannot happen for a token actually sampled from q; treating the ratio as infinite
        # (accept iff p_x > 0) keeps the rule total for callers that pass such drafts.
        if p_x > 0.0 and (p_x >= q_x or rng.random() * q_x < p_x):
            continue
        residual = p_i.without(x) if q_i is None else p_i.minus(q_i)
        if residual.total <= 0.0:
            # Only reachable through rounding when p == q, where rejection has probability 0.
            residual = p_i
        return i, residual.sample(rng)
    k = len(draft)
    return k, p[k].sample(rng)
