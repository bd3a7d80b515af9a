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
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import sample


def accept_greedy(draft: Sequence[int], target_argmax: Sequence[int]) -> tuple[int, int]:
    """Greedy verification: accept while the target's argmax equals the draft token.

    `target_argmax` has len(draft) + 1 entries. Returns (number accepted, next token), where the next
    token is the target's argmax at the first mismatch (or the bonus position).
    """
    n = 0
    for x, best in zip(draft, target_argmax):
        if int(x) != int(best):
            break
        n += 1
    return n, int(target_argmax[n])


def accept_sampled(
    draft: Sequence[int],
    p: np.ndarray,
    q: np.ndarray | None,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Stochastic verification. Returns (number of draft tokens accepted, the token emitted after them).

    p: (k+1, vocab) target probabilities. q: (k, vocab) draft probabilities the draft tokens were
    sampled from, or None for drafts proposed without a distribution.
    """
    for i, x in enumerate(draft):
        x = int(x)
        # A draft vocabulary may be padded past the target's end; such ids have p = 0: reject.
        known = x < p.shape[1]
        p_x = p[i, x] if known else 0.0
        q_x = q[i, x] if q is not None and known else 1.0
        # q_x == 0 cannot happen for a token actually sampled from q; treating the ratio as infinite
        # (accept iff p_x > 0) keeps the rule total for callers that pass such drafts.
        if p_x > 0.0 and (p_x >= q_x or rng.random() * q_x < p_x):
            continue
        if q is None:
            residual = p[i].copy()
            if known:
                residual[x] = 0.0
        else:
            residual = np.maximum(p[i] - q[i], 0.0)
        if residual.sum() <= 0.0:
            # Only reachable through rounding when p == q, where rejection has probability 0.
            residual = p[i]
        return i, sample(residual, rng)
    k = len(draft)
    return k, sample(p[k], rng)
