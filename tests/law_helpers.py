"""What the law tests share: the chi-square check, the wrong acceptance rules whose failing proves
that a check has teeth, and the target's own processed rows along sampled prefixes.

Every rule here takes what `localspec.decoding.acceptance.accept_sampled` takes (draft tokens, the
target's `Dist`s, the draft's `Dist`s or None, an rng), so the same rule can be patched into the
real decoder (test_exact_e2e, test_serve_sampled) or run by the acceptance harness
(test_acceptance).

Statistic: Pearson chi-square, with its critical value at alpha = 1e-4 from the Wilson-Hilferty
approximation (scipy is not installed), which is slightly conservative (too large) for small df.
Cells with expected count < 5 are pooled so the chi-square approximation holds; cells with
probability exactly 0 are not tested statistically but must have count exactly 0 (one forbidden
token is a failure however rare).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from localspec.config import SamplingConfig
from localspec.decoding.acceptance import accept_sampled
from localspec.decoding.dists import Dense, Sparse
from localspec.decoding.processing import process, window
from localspec.decoding.sampling import distribution

ALPHA = 1e-4


def chi2_critical(df: int, alpha: float = ALPHA) -> float:
    """Upper-alpha critical value of chi-square(df), Wilson-Hilferty approximation."""
    z = statistics.NormalDist().inv_cdf(1.0 - alpha)
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


@dataclass
class Check:
    ok: bool
    stat: float
    crit: float
    df: int
    forbidden: int  # draws that landed on probability-0 cells

    def __str__(self) -> str:
        return (
            f"chi2={self.stat:.1f} crit={self.crit:.1f} (df={self.df}, alpha={ALPHA}) "
            f"forbidden={self.forbidden}"
        )


def chi2_check(counts: np.ndarray, probs: np.ndarray) -> Check:
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = counts.sum()
    zero = probs == 0.0
    forbidden = int(counts[zero].sum())
    c, e = counts[~zero], n * probs[~zero] / probs[~zero].sum()
    small = e < 5.0
    if small.any():
        pooled_c, pooled_e = c[small].sum(), e[small].sum()
        c, e = c[~small], e[~small]
        if pooled_e >= 5.0 or len(c) == 0:
            c, e = np.append(c, pooled_c), np.append(e, pooled_e)
        else:  # fold a too-small pool into the largest cell
            j = int(np.argmax(e))
            c[j] += pooled_c
            e[j] += pooled_e
    df = len(c) - 1
    if df == 0:  # a single allowed cell: only the forbidden cells can fail
        return Check(forbidden == 0, 0.0, 0.0, 0, forbidden)
    stat = float(((c - e) ** 2 / e).sum())
    crit = chi2_critical(df)
    return Check(forbidden == 0 and stat <= crit, stat, crit, df, forbidden)


# -- wrong rules --------------------------------------------------------------------------------


def always_accept(draft, p, q, rng):
    """Accept every draft token, then the bonus token from p_{k+1}."""
    k = len(draft)
    return k, p[k].sample(rng)


def residual_is_p(draft, p, q, rng):
    """The right acceptance test, but a rejection resamples from p, not from max(0, p - q) (for a
    lookup draft: from p without removing the rejected token)."""
    for i, x in enumerate(draft):
        q_i = q[i] if q is not None else None
        p_x, q_x = p[i].prob(x), (q_i.prob(x) if q_i is not None else 1.0)
        if p_x > 0.0 and (p_x >= q_x or rng.random() * q_x < p_x):
            continue
        return i, p[i].sample(rng)
    return len(draft), p[len(draft)].sample(rng)


def accept_with_p(draft, p, q, rng):
    """Accept with probability p(x), ignoring q; the right residual max(0, p - q)."""
    for i, x in enumerate(draft):
        if rng.random() < p[i].prob(x):
            continue
        return i, p[i].minus(q[i]).sample(rng)
    return len(draft), p[len(draft)].sample(rng)


def renormalised_q(draft, p, q, rng):
    """The right rule, but handed each draft row cut to the target's width and renormalised (as if
    the draft's ids past the target's vocabulary had never been proposable). Takes `Dense` rows:
    their length is the vocabulary's."""
    width = len(p[0])
    return accept_sampled(draft, p, [_cut(d, width) for d in q], rng)


@functools.lru_cache(maxsize=64)   # a harness hands the same rows on every draw: cut each once
def _cut(d: Dense, width: int) -> Dense:
    return Dense(d.weights[:width].copy())


def bonus_off_by_one(draft, p, q, rng):
    """Right everywhere except the bonus token, drawn from the last draft position's row.

    The first emitted token stays exactly right; only a joint check can see this."""
    n, t = accept_sampled(draft, p, q, rng)
    if n == len(draft):
        return n, p[n - 1].sample(rng)
    return n, t


def q_misaligned(draft, p, q, rng):
    """The right rule, but a mixed draft's q not padded at its lookup positions: the model's
    distributions land on the lookup tokens (which they never proposed) and the model's tokens
    are verified one-hot. (Verifying every position one-hot would still be exact, only slower.)"""
    if q is not None:
        q = [d for d in q if d is not None] + [None] * sum(d is None for d in q)
    return accept_sampled(draft, p, q, rng)


def against_p(tree, p, rng):
    """A wrong tree rule (`localspec.decoding.tree.accept_tree_sampled`'s signature): every sibling
    tested against p itself, not the running residual (which is still built, and the last draw
    comes from it): it skips the residual update between siblings."""
    path, row = [], 0
    while True:
        base = r = p[row]
        for c in tree.children[row]:
            x = tree.tokens[c]
            Q = tree.q[c] if tree.q is not None else None
            p_x, q_x = base.prob(x), (Q.prob(x) if Q is not None else 1.0)
            if p_x > 0.0 and (p_x >= q_x or rng.random() * q_x < p_x):
                path.append(c)
                row = c + 1
                break
            nxt = r.without(x) if Q is None else r.minus(Q)
            if nxt.total > 0.0:
                r = nxt
        else:
            return path, r.sample(rng)


def no_residual_update(tree, p, rng):
    """A wrong tree rule: every sibling tested against p itself, and the residual never updated
    between siblings; after all are rejected the draw comes from p less the last one only (so an
    earlier rejected sibling can be drawn again). Stronger than `against_p` where the first
    sibling is unlikely under p (lookup's rivals on the tiny models of test_tree_decode)."""
    q = tree.q
    path, row = [], 0
    while True:
        r = p[row]
        last = None
        for c in tree.children[row]:
            x = tree.tokens[c]
            Q = q[c] if q is not None else None
            r_x, q_x = r.prob(x), (Q.prob(x) if Q is not None else 1.0)
            if r_x > 0.0 and (r_x >= q_x or rng.random() * q_x < r_x):
                path.append(c)
                row = c + 1
                break
            last = (x, Q)
        else:
            if last is None:
                return path, r.sample(rng)
            x, Q = last
            res = r.without(x) if Q is None else r.minus(Q)
            return path, (res if res.total > 0 else r).sample(rng)


def _fourth(d) -> tuple[list[int], int | None]:
    """(d's three likeliest ids, its fourth), a tie going to the lower id."""
    ids = np.flatnonzero(d.weights) if isinstance(d, Dense) else d.ids
    w = d.weights[ids] if isinstance(d, Dense) else d.weights
    order = np.lexsort((ids, -w))[:4]
    top = [int(ids[i]) for i in order]
    return top[:3], (top[3] if len(top) > 3 else None)


def _collapsed(t: int, d) -> int:
    top, fourth = _fourth(d)
    return t if t in top or fourth is None else fourth


def rest_collapsed(draft, p, q, rng):
    """Right, except that a token emitted after an accepted draft, when it is not among its row's
    three likeliest, becomes the fourth likeliest: each rank class keeps its mass (the rank
    statistic cannot see it) and every run's first token stays right (nor can the first-token
    check); only a check of later tokens themselves can."""
    n, t = accept_sampled(draft, p, q, rng)
    return n, (_collapsed(t, p[n]) if n else t)


def rest_collapsed_tree(tree, p, rng):
    """`rest_collapsed` for trees (`accept_tree_sampled`'s signature)."""
    from localspec.decoding.tree import accept_tree_sampled

    path, t = accept_tree_sampled(tree, p, rng)
    return path, (_collapsed(t, p[path[-1] + 1]) if path else t)


def dense_spy(rule, seen: list):
    """`rule`, noting the kinds of distribution it is handed (first target row, draft rows)."""
    def spy(draft, p, q, rng):
        seen.append((type(p[0]), {type(d) for d in q or ()}))
        return rule(draft, p, q, rng)
    return spy


# -- the target alone ---------------------------------------------------------------------------

CFG = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95, min_p=0.0)
"""The sampling the end-to-end laws run at (test_exact_e2e, test_serve_sampled)."""
REPEATING = ("The cat sat on the mat. The dog sat on the rug. The cat sat on the mat. The dog sat on "
             "the rug. The cat sat on the")
"""Repetitive, so prompt lookup has a match from the first step; ending mid-phrase, so the first
token is uncertain."""


class Target:
    """The target's own processed rows along sampled prefixes of one prompt.

    Each row is computed once per prefix and kept sparse (the kept ids and their probabilities,
    every end-of-generation id merged into one token, `end` = n_vocab), so many runs' rows fit in
    memory and one instance can serve every test of a module. `raw` keeps the logit rows too, for
    a caller that reads the same prefixes at several temperatures."""

    def __init__(self, model, prompt: list[int], cfg: SamplingConfig = CFG, raw: dict | None = None):
        self.model, self.prompt, self.cfg = model, list(prompt), cfg
        self.end = model.n_vocab
        self.eog = np.array([model.is_eog(t) for t in range(model.n_vocab)])
        self._rows: dict[tuple[int, ...], Sparse] = {}
        self._raw = raw

    def rows(self, tokens: list[int], n: int) -> list[Sparse]:
        """p_1..p_n after the prompt along `tokens` (`Sparse`, ids in increasing order)."""
        keys = [tuple(tokens[:i]) for i in range(n)]
        if any(key not in self._rows for key in keys):
            raw = self._raw
            if raw is not None and all(key in raw for key in keys):
                self._keep(keys, [raw[key] for key in keys])
            else:
                m = self.model
                m.sync(self.prompt[:-1])
                logits = m.eval([self.prompt[-1], *tokens[: n - 1]], logits_from=0)
                if raw is not None:  # copies: the rows are a view the next decode overwrites
                    raw.update(zip(keys, (np.array(row) for row in logits)))
                self._keep(keys, logits)
                m.truncate(len(self.prompt) - 1)
        return [self._rows[key] for key in keys]

    def _keep(self, keys, logits) -> None:
        for key, row in zip(keys, logits):
            if key not in self._rows:
                self._rows[key] = self._processed(row, key)

    def _processed(self, row: np.ndarray, key: tuple[int, ...] = ()) -> Sparse:
        # penalties and logit bias see the prompt and the prefix before this row
        row = process(row, window(self.prompt, key, self.cfg), self.cfg)
        if self.cfg.grammar:   # the whole vocabulary asked, not constrain's walk: an independent mask
            g = self.model.grammar(self.cfg.grammar)
            for t in key:
                if not g.allowed([t])[0]:   # a forbidden token before: this row is unreachable
                    return Sparse(np.array([self.end + 1]), np.ones(1))   # nothing real has p > 0
                g.accept(t)
            row = np.where(g.allowed(np.arange(len(row))), row, -np.inf).astype(np.float32)
        d = distribution(row, self.cfg)
        if isinstance(d, Dense):   # a whole vocabulary: int32 ids and float32 probabilities halve it
            ids = np.flatnonzero(d.weights).astype(np.int32)
            probs = (d.weights[ids] / float(d.weights.sum(dtype=np.float64))).astype(np.float32)
        else:
            order = np.argsort(d.ids)
            ids, probs = d.ids[order], d.weights[order] / d.weights.sum()
        end = self.eog[ids]
        if end.any():
            ids = np.append(ids[~end], self.end)
            probs = np.append(probs[~end], probs[end].sum())
        return Sparse(ids, probs)


# -- greedy identity on F32: divergences only at near-ties ------------------------------------------

NEAR_TIE = 0.01
"""A divergence is a near-tie when the plain path's two best processed logits there are this close:
llama.cpp's kernels round a row differently in a batch of another size, even on F32 (seen: 0.002)."""


def near_tie_gap(session, sampling: SamplingConfig, prompt, plain, other) -> float | None:
    """None when `other` equals `plain`; else the gap between the two best processed logits of the
    target's row (computed alone) where they part — among the tokens the grammar allows there,
    under a grammar."""
    if other == plain:
        return None
    i = next((j for j in range(min(len(plain), len(other))) if plain[j] != other[j]), min(len(plain), len(other)))
    m = session.target
    m.truncate(0)
    text = [*prompt, *plain[:i]]
    row = process(m.eval(text, logits_from=len(text) - 1)[-1], window(text, [], sampling), sampling)
    m.truncate(0)
    if sampling.grammar:
        g = m.grammar(sampling.grammar)
        for t in plain[:i]:
            g.accept(t)
        row = row[g.allowed(np.arange(len(row)))]
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])
