"""Logit processing before sampling: logit bias, then llama.cpp's repetition penalties, applied
identically to every row that is sampled or verified (the target's verify rows, the draft's rows
along the drafted path, plain decoding's rows), each with the history that precedes it: the prompt,
the output so far, and the drafted tokens before that row. So the target's processed distribution
is the same function of the text whether a token was drafted or not, and the acceptance rule keeps
it exactly; a draft processed the same way proposes what the target would, and α stays high.

Semantics follow llama.cpp's samplers (`llama_sampler_init_logit_bias`, then
`llama_sampler_init_penalties` over the last `repeat_last_n` tokens, in float32): a token's bias is
added; a token seen c times in the window has a positive logit divided by the repeat penalty (a
non-positive one multiplied), then c × frequency + (c > 0) × presence subtracted. Only the touched
ids change; the row is copied first, since it is llama.cpp's buffer (its cost: one copy of the
vocabulary per processed row).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from localspec.config import ConfigError, SamplingConfig


def check_bias_ids(cfg: SamplingConfig, n_vocab: int) -> None:
    """A logit bias on an id the target does not have would change nothing (a mistyped ban would
    let the token through): refused in one line, whatever the command."""
    outside = [t for t, _ in cfg.logit_bias if t >= n_vocab]
    if outside:
        raise ConfigError(f"logit-bias token id {outside[0]} is outside the vocabulary ({n_vocab} ids)")


def window(history: Sequence[int], drafted: Sequence[int], cfg: SamplingConfig) -> list[int]:
    """The tokens the penalties see for a row after `history` + `drafted`: the last repeat_last_n."""
    n = cfg.repeat_last_n
    if n < 0:
        return [*history, *drafted]
    if n == 0:
        return []
    if len(drafted) >= n:
        return list(drafted[len(drafted) - n:])
    return [*history[-(n - len(drafted)):], *drafted]


def process(row: np.ndarray, seen: Sequence[int], cfg: SamplingConfig) -> np.ndarray:
    """`row` with the logit bias and the penalties over `seen` (the window) applied: a new float32
    array; `row` itself when nothing applies."""
    if not cfg.processed:
        return row
    out = np.array(row, dtype=np.float32, copy=True)
    n = len(out)
    if cfg.logit_bias:
        ids = np.array([t for t, _ in cfg.logit_bias if t < n], dtype=np.int64)
        bias = np.array([b for t, b in cfg.logit_bias if t < n], dtype=np.float32)
        np.add.at(out, ids, bias)
    if cfg.penalized and len(seen):
        ids, counts = np.unique(np.asarray(seen, dtype=np.int64), return_counts=True)
        keep = ids < n
        ids, counts = ids[keep], counts[keep].astype(np.float32)
        v = out[ids]
        if cfg.repeat_penalty != 1.0:
            r = np.float32(cfg.repeat_penalty)
            v = np.where(v <= 0, v * r, v / r).astype(np.float32)
        v = v - (counts * np.float32(cfg.frequency_penalty) + np.float32(cfg.presence_penalty))
        out[ids] = v
    return out
