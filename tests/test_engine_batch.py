"""Several sequences in one context (engine.batch): a draft tree in one decode, rows of several
sequences in one decode, and what each sequence's cache holds afterwards.

Every logit row is compared with the same tokens decoded alone on a fresh n_seq=1 model. Batches
of different shapes run different kernels (one row: a matrix-vector product), so the two agree to
float rounding, not bit for bit: ATOL is test_eval_batches' bound for the same reason (seen here:
0.006 for a row decoded alone against one decoded in a batch, 2e-5 between two batched rows,
0.013 for a row after a cache built in other batches; logits of magnitude ~30). The argmax must
be equal everywhere.
"""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from localspec.config import ConfigError, ModelConfig
from localspec.engine import EngineError, Model, interrupt
from localspec.engine.batch import tree_members

ATOL = 0.05
N_CTX = 256  # the least llama.cpp allocates (it pads to 256 cells): the fills below are short
N_SEQ = 8
TEXT = "The lighthouse keeper climbed the stairs each evening to light the lamp for the"


@pytest.fixture(scope="module")
def multi(model_paths):
    with Model(ModelConfig(str(model_paths[0]), n_ctx=N_CTX, n_seq=N_SEQ, n_threads=1)) as m:
        yield m


@pytest.fixture(scope="module")
def alone(model_paths):
    with Model(ModelConfig(str(model_paths[0]), n_ctx=N_CTX, n_threads=1)) as m:
        yield m


@pytest.fixture(scope="module")
def text(alone):
    return alone.tokenize(TEXT)


_seen: dict[tuple, np.ndarray] = {}


def _after(model, tokens) -> np.ndarray:
    """The logits after `tokens` on the n_seq=1 model, from a cache that holds exactly them (the
    last one decoded alone); each text is decoded once per run."""
    key = tuple(tokens)
    if key not in _seen:
        model.sync(tokens[:-1])
        _seen[key] = np.array(model.eval(tokens[-1:], logits_from=0)[0])
    return _seen[key]


def _close(a, b) -> None:
    assert a.argmax() == b.argmax() and np.abs(a - b).max() < ATOL, np.abs(a - b).max()


def _pos_max(model, seq) -> int:
    return llama_cpp.llama_memory_seq_pos_max(model._mem, seq)


def _chain(parents, i) -> list[int]:
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def _draft_tree(alone, text, shape):
    """A tree as a drafter would grow it: the pending last token of `text` at the root, then at
    each depth the target's own top `shape[d]` tokens under every node."""
    tokens, parents = [text[-1]], [-1]
    level = [0]
    for width in shape:
        below = []
        for node in level:
            seen = text[:-1] + [tokens[j] for j in _chain(parents, node)]
            for t in np.argsort(-_after(alone, seen))[:width]:
                tokens.append(int(t))
                parents.append(node)
                below.append(len(tokens) - 1)
        level = below
    return tokens, parents


@pytest.mark.parametrize("shape", [(2, 2, 2), (3, 1, 1), (4,)])
def test_a_tree_in_one_decode_gives_each_node_the_logits_of_its_chain_alone(multi, alone, text, shape):
    tokens, parents = _draft_tree(alone, text, shape)
    multi.reset()
    multi.eval(text[:-1])
    rows = np.array(multi.eval_tree(tokens, parents))
    assert rows.shape == (len(tokens), multi.n_vocab)
    for i in range(len(tokens)):
        _close(rows[i], _after(alone, text[:-1] + [tokens[j] for j in _chain(parents, i)]))
    # branch j is sequence j, and its cache holds the text and the path to the j-th leaf
    leaves = [i for i in range(len(tokens)) if i not in parents]
    for j, leaf in enumerate(leaves):
        assert multi.seqs[j] == text[:-1] + [tokens[k] for k in _chain(parents, leaf)]
    assert all(not s for s in multi.seqs[len(leaves):])


# shape 3,1,1 under the root: nodes 0 (root); 1, 2, 3 (its children); 4, 5, 6 under them; 7, 8, 9.
TREE_311 = [-1, 0, 0, 0, 1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("path", [[], [0], [0, 2], [0, 3, 6], [0, 1, 4, 7], [0, 3, 6, 9]],
                         ids=["none", "root", "middle-b1", "middle-b2", "leaf-b0", "leaf-b2"])
def test_after_keep_path_the_cache_is_the_text_and_the_path(multi, alone, text, path):
    tokens, parents = _draft_tree(alone, text, (3, 1, 1))
    assert parents == TREE_311
    multi.reset()
    multi.eval(text[:-1])
    multi.eval_tree(tokens, parents)
    multi.keep_path(path)
    kept = text[:-1] + [tokens[i] for i in path]
    assert multi.tokens == kept and all(not s for s in multi.seqs[1:])
    assert _pos_max(multi, 0) == len(kept) - 1
    assert all(_pos_max(multi, s) == -1 for s in range(1, N_SEQ))  # the other branches' cells are gone
    nxt = text[1]  # any next token: its logits read the whole cache
    _close(np.array(multi.eval([nxt], logits_from=0)[0]), _after(alone, kept + [nxt]))


def test_keep_path_frees_every_other_cell_of_the_tree(multi, alone, text):
    """The cache's n_ctx cells are shared by all sequences: after keep_path, sequence 0 alone can
    fill all of them, which a single cell left to a dropped branch would make fail."""
    tokens, parents = _draft_tree(alone, text, (3, 1, 1))
    multi.reset()
    multi.eval(text[:-1])
    multi.eval_tree(tokens, parents)
    multi.keep_path([0, 2, 5])
    multi.eval(text[:1] * (N_CTX - len(multi.tokens)))
    assert len(multi.tokens) == N_CTX
    multi.reset()


def test_a_path_that_is_not_one_is_refused(multi, alone, text):
    tokens, parents = _draft_tree(alone, text, (3, 1, 1))
    multi.reset()
    multi.eval(text[:-1])
    multi.eval_tree(tokens, parents)
    before = [list(s) for s in multi.seqs]
    for bad in ([1], [0, 4], [0, 1, 5], [0, 10]):
        with pytest.raises(EngineError, match="not a path"):
            multi.keep_path(bad)
    assert multi.seqs == before
    multi.keep_path([0])
    with pytest.raises(EngineError, match="needs the tree"):
        multi.keep_path([0])  # the tree is gone


def _texts(alone):
    return [alone.tokenize(t) for t in ("Once upon a time there was a small fox who",
                                         "def add(a, b):\n    return",
                                         "The capital of France is Paris and the capital of")]


def test_rows_of_several_sequences_in_one_decode_match_each_alone(multi, alone):
    a, b, c = _texts(alone)
    multi.reset()
    for seq, t in ((1, a), (2, b), (3, c)):
        multi.eval_blocks([(seq, t[:-4], None)])
    # seq 1: one plain row; seq 2: four verify rows; seq 3: three rows, no logits
    one, four, none = multi.eval_blocks([(1, a[-4:-3], 0), (2, b[-4:], 0), (3, c[-4:-1], None)])
    assert none is None and one.shape[0] == 1 and four.shape[0] == 4
    _close(np.array(one[0]), _after(alone, a[:-3]))
    four = np.array(four)
    for i in range(4):
        _close(four[i], _after(alone, b[:len(b) - 3 + i]))
    assert multi.seqs[1] == a[:-3] and multi.seqs[2] == b and multi.seqs[3] == c[:-1]
    assert not multi.seqs[0] and _pos_max(multi, 0) == -1
    # rejecting 3 of seq 2's rows leaves the other sequences as they were
    multi.truncate(len(b) - 3, seq=2)
    assert multi.seqs[2] == b[:-3] and _pos_max(multi, 2) == len(b) - 4
    rows = multi.decode_rows([a[-3], c[-1], b[-3]], [1, 3, 2], [True, True, True])
    rows = np.array(rows)
    _close(rows[0], _after(alone, a[:-2]))
    _close(rows[1], _after(alone, c))
    _close(rows[2], _after(alone, b[:-2]))


def test_interleaved_rows_and_a_copied_prefix(multi, alone):
    a, b, _ = _texts(alone)
    multi.reset()
    multi.eval_blocks([(1, a[:-2], None), (2, b[:-2], None)])
    rows = np.array(multi.decode_rows([a[-2], b[-2], a[-1], b[-1]], [1, 2, 1, 2], [True] * 4))
    for i, (t, k) in enumerate(((a, 2), (b, 2), (a, 1), (b, 1))):
        _close(rows[i], _after(alone, t[:len(t) - k + 1]))
    assert multi.seqs[1] == a and multi.seqs[2] == b
    # a prefix of seq 1 copied to seq 4 shares its cells and continues it exactly
    multi.copy_seq(1, 4, len(a) - 3)
    assert multi.seqs[4] == a[:-3] and _pos_max(multi, 4) == len(a) - 4
    (row,) = multi.eval_blocks([(4, a[-3:-2], 0)])
    _close(np.array(row[0]), _after(alone, a[:-2]))
    multi.drop_seq(1)
    assert not multi.seqs[1] and _pos_max(multi, 1) == -1 and _pos_max(multi, 4) == len(a) - 3
    multi.keep_seq(2)
    assert multi.seqs[2] == b and not any(multi.seqs[s] for s in (0, 1, 3, 4))
    assert [_pos_max(multi, s) for s in range(N_SEQ)] == [-1, -1, len(b) - 1] + [-1] * (N_SEQ - 3)
    _close(np.array(multi.eval_blocks([(2, b[:1], 0)])[0][0]), _after(alone, b + b[:1]))


def test_bad_batches_are_one_engine_error_each_and_change_nothing(multi, alone, text):
    multi.reset()
    multi.eval_blocks([(1, text[:5], None), (2, text[:3], None), (5, text[1:6], None)])
    before = [list(s) for s in multi.seqs]
    rows_in = lambda *sets: np.array([[s in ids for s in range(N_SEQ)] for ids in sets])  # noqa: E731
    cases = [
        (lambda: multi.decode_rows(text[:1] * (multi.n_batch + 1), [1] * (multi.n_batch + 1)), "over n_batch"),
        (lambda: multi.decode_rows(text[:1], [N_SEQ]), f"sequence id {N_SEQ} is outside"),
        (lambda: multi.eval_blocks([(-1, text[:1], 0)]), "sequence id -1 is outside"),
        (lambda: multi.truncate(0, seq=N_SEQ), "is outside"),
        (lambda: multi.copy_seq(1, N_SEQ + 3), "is outside"),
        (lambda: multi.eval_tree(text[:2], [1, -1]), "parent must come before"),
        (lambda: multi.eval_tree(text[:2], [0, -1]), "parent must come before"),  # its own parent
        (lambda: multi.eval_tree(text[:9], [-1] * 9), "needs n_seq >= 9"),
        (lambda: multi.eval_tree(text[:3], [-1, 0]), "3 tokens for a tree of 2"),
        # rows shared by sequences that hold different texts (of other lengths, of the same length)
        (lambda: multi.decode_rows(text[:1], rows_in({1, 2})), "sequences 1 and 2, which hold different texts"),
        (lambda: multi.decode_rows(text[:1], rows_in({1, 5})), "sequences 1 and 5, which hold different texts"),
        # 3 and 4 are both empty, but the shared row comes after a row of 3 alone
        (lambda: multi.decode_rows(text[:2], rows_in({3}, {3, 4})), "different rows before it"),
        (lambda: multi.eval_blocks([(1, (text * 40)[:N_CTX], None)]), "context full"),
        (lambda: multi.eval_blocks([(1, text[:2], 5)]), "outside a block"),
    ]
    for call, message in cases:
        with pytest.raises(EngineError, match=message):
            call()
        assert multi.seqs == before, message
    assert [_pos_max(multi, s) for s in range(6)] == [-1, 4, 2, -1, -1, 4]


def test_a_failed_decode_leaves_every_sequence_as_it_was(multi, alone, text, monkeypatch):
    """Two real failures: the shared cells run out (rc 1), and a Ctrl-C aborts the decode."""
    multi.reset()
    filler = (text * 40)[:N_CTX // 2 - 6]
    multi.eval_blocks([(1, filler, None)])
    multi.eval_blocks([(2, filler, None)])
    before = [list(s) for s in multi.seqs]
    with pytest.raises(EngineError, match="no room for the batch"):
        multi.eval_blocks([(1, text[:4], 0), (3, text[:10], 0)])  # 14 rows, 12 free cells
    assert multi.seqs == before and [_pos_max(multi, s) for s in (1, 2, 3)] == [len(filler) - 1] * 2 + [-1]
    real = llama_cpp.llama_decode

    def interrupted(ctx, batch):
        interrupt.request()  # the Ctrl-C lands as the decode starts
        return real(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", interrupted)
    with pytest.raises(KeyboardInterrupt):
        multi.eval_blocks([(1, text[:2], 0), (3, text[:3], 0)])
    monkeypatch.setattr(llama_cpp, "llama_decode", real)
    assert multi.seqs == before and [_pos_max(multi, s) for s in (1, 2, 3)] == [len(filler) - 1] * 2 + [-1]
    _close(np.array(multi.eval_blocks([(1, text[:1], 0)])[0][0]), _after(alone, filler + text[:1]))
    multi.reset()


def test_tree_members_puts_each_node_in_the_branches_below_it():
    # roots 0 and 1; 2, 3 under 0; 4 under 2: leaves 1, 3, 4 are branches 0, 1, 2
    member = tree_members([-1, -1, 0, 0, 2], 4)
    assert member.astype(int).tolist() == [[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 1, 0]]


def test_one_sequence_models_take_a_chain_as_a_tree_and_refuse_more(alone, text):
    alone.reset()
    alone.eval(text[:-3])
    rows = np.array(alone.eval_tree(text[-3:], [-1, 0, 1]))
    assert alone.tokens == text
    alone.truncate(len(text) - 3)
    assert np.array_equal(rows, alone.eval(text[-3:], logits_from=0))  # the same batch: the same bits
    alone.truncate(len(text) - 3)
    alone.eval_tree(text[-3:], [-1, 0, 1])
    alone.keep_path([0, 1])
    assert alone.tokens == text[:-1]
    with pytest.raises(EngineError, match="needs n_seq >= 2"):
        alone.eval_tree(text[:2], [-1, -1])
    assert alone.tokens == text[:-1]
    with pytest.raises(ConfigError, match="n_seq must be >= 1"):
        ModelConfig("x.gguf", n_seq=0)
