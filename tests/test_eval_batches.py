"""Model.eval over blocks longer than n_batch: every row asked for comes back, from one decode."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.config import ModelConfig
from localspec.engine import EngineError, Model

N_BATCH = 8
# Batches of different shapes run different kernels (one token: a matrix-vector product), so the
# cache entries and the rows computed from them agree to float rounding, not bit for bit: seen
# 0.012 on logits of magnitude ~30.
ATOL = 0.05


@pytest.fixture(scope="module")
def small_batch(model_paths):
    with Model(ModelConfig(str(model_paths[0]), n_ctx=256, n_batch=N_BATCH)) as m:
        yield m


@pytest.fixture(scope="module")
def block(target):
    text = ("The lighthouse keeper climbed the stairs each evening to light the lamp for the ships "
            "that passed the rocks below, and wrote the weather in his book.")
    tokens = target.tokenize(text)
    assert len(tokens) >= 2 * N_BATCH + 4
    return tokens[: 2 * N_BATCH + 4]   # 20 tokens: three chunks of at most 8


@pytest.fixture(scope="module")
def reference(target, block):
    """Every row of the block from one decode (n_batch 512)."""
    target.reset()
    rows = np.array(target.eval(block, logits_from=0))
    target.reset()
    return rows


# logits_from 13 asks for 7 rows starting in the second chunk of [0, 8), [8, 16), [16, 20): the
# old chunking returned only the last chunk's 4 rows. 12: exactly n_batch rows.
@pytest.mark.parametrize("logits_from", [12, 13, 16, 19, -1, -5])
def test_rows_that_start_in_an_earlier_chunk_all_come_back(small_batch, block, reference, logits_from):
    small_batch.reset()
    rows = small_batch.eval(block, logits_from=logits_from)
    start = logits_from % len(block)
    assert rows.shape == (len(block) - start, small_batch.n_vocab)
    assert small_batch.tokens == block
    diff = np.abs(rows - reference[start:]).max()
    assert np.allclose(rows, reference[start:], atol=ATOL), diff


def test_appending_to_a_cache_and_no_rows(small_batch, block, reference):
    small_batch.reset()
    assert small_batch.eval(block[:11]) is None          # no rows asked: two decodes, none returned
    rows = small_batch.eval(block[11:], logits_from=2)   # 9 tokens after 11 in the cache
    assert rows.shape == (7, small_batch.n_vocab) and small_batch.tokens == block
    assert np.allclose(rows, reference[13:], atol=ATOL)


def test_more_rows_than_a_batch_are_refused_before_anything_is_decoded(small_batch, block):
    small_batch.reset()
    small_batch.eval(block[:3])
    with pytest.raises(EngineError, match="rows in one batch"):
        small_batch.eval(block[3:], logits_from=3)   # 14 rows > 8
    with pytest.raises(EngineError, match="outside"):
        small_batch.eval(block[3:], logits_from=len(block))
    assert small_batch.tokens == block[:3]
