"""Several sequences in one context: one `llama_decode` over rows of any of them.

A `Model` made with n_seq > 1 (`ModelConfig.n_seq`) keeps n_seq sequences in its KV cache, and
`Model.seqs[s]` lists the tokens sequence s holds (`seqs[0]` is `Model.tokens`). Two uses sit on
one primitive, `decode_rows`:
- a draft tree (`eval_tree`, then `keep_path`): every node in one decode, a node shared by
  several branches carrying the sequence ids of all of them; afterwards only the accepted
  branch's cells stay;
- concurrent sequences (`eval_blocks`): a block of rows per sequence, each at its own position.

llama.cpp lets a row belong to several sequences ("coupled" sequences) only with a unified KV
cache: one pool of n_ctx cells for all sequences, where a cell held by several is stored once, so
copying a prefix to another sequence (`copy_seq`, llama_memory_seq_cp) adds the sequence to the
same cells and computes nothing. Its batch check (llama_batch_allocr::init in
src/llama-batch.cpp) refuses, with a log line and -1, rows that do not continue their sequence's
cache at the next position, and coupled sequences whose caches differ; both rules are checked here
first so that bad input is one EngineError. Positions are therefore never given: a row's position
follows from the bookkeeping (the length of its sequences plus their earlier rows in the batch).
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import numpy as np

import llama_cpp as C

from localspec.tokens import common_prefix
from . import interrupt
from .files import EngineError


class Batch:
    """A llama_batch whose arrays numpy owns, so that every field is filled by slice assignment.

    llama_batch_init allocates each token's seq_id array separately, which no numpy view can cover;
    here they are the rows of one (n, n_seq) matrix, and seq_id points at those rows.
    """

    def __init__(self, n: int, n_seq: int):
        self.tok = np.zeros(n, np.int32)
        self.pos = np.zeros(n, np.int32)
        self.nseq = np.ones(n, np.int32)
        self.sid = np.zeros((n, n_seq), np.int32)  # row i: the sequence ids of token i
        self.out = np.zeros(n, np.int8)
        # n pointers and a NULL after them, as llama_batch_init lays them out
        self._rows = np.zeros(n + 1, np.uintp)
        self._rows[:n] = self.sid.ctypes.data + np.arange(n, dtype=np.uintp) * self.sid.strides[0]
        c = self.c = C.llama_batch()
        c.token = self.tok.ctypes.data_as(ctypes.POINTER(C.llama_token))
        c.pos = self.pos.ctypes.data_as(ctypes.POINTER(C.llama_pos))
        c.n_seq_id = self.nseq.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        c.seq_id = ctypes.cast(self._rows.ctypes.data, ctypes.POINTER(ctypes.POINTER(C.llama_seq_id)))
        c.logits = self.out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))


def logit_start(n: int, logits_from: int | None) -> int:
    """The first row of a block of n whose logits are wanted: logits_from counts from the end when
    negative; None wants none (n)."""
    start = n if logits_from is None else (logits_from if logits_from >= 0 else n + logits_from)
    if not 0 <= start <= n:
        raise EngineError(f"logits_from {logits_from} is outside a block of {n} tokens")
    return start


def tree_members(parents: Sequence[int], width: int) -> np.ndarray:
    """(nodes, width) bool: node i belongs to branch j, the path from a root to the j-th leaf.

    parents[i] is node i's parent, -1 for a root (a child of the cached text); every parent comes
    before its children, so the batch holds each branch in order. A node belongs to every branch
    below it. EngineError when the order is broken or there are more leaves than `width`.
    """
    p = np.asarray(parents, dtype=np.int64).reshape(-1)
    n = len(p)
    if n == 0:
        raise EngineError("a tree needs at least one node")
    bad = np.flatnonzero((p < -1) | (p >= np.arange(n)))
    if len(bad):
        i = int(bad[0])
        raise EngineError(f"tree node {i} has parent {int(p[i])}: a parent must come before its children")
    has_child = np.zeros(n, bool)
    has_child[p[p >= 0]] = True
    leaves = np.flatnonzero(~has_child)
    if len(leaves) > width:
        raise EngineError(f"a tree of {len(leaves)} branches needs n_seq >= {len(leaves)}, this model has {width}")
    member = np.zeros((n, width), bool)
    cols = np.arange(len(leaves))
    cur = leaves
    while len(cur):  # one pass per depth: every branch climbs one node
        member[cur, cols] = True
        up = p[cur]
        cols, cur = cols[up >= 0], up[up >= 0]
    return member


class Sequences:
    """The multi-sequence side of `Model` (a mixin over Model's context, cache and batch)."""

    n_seq: int
    seqs: list[list[int]]
    tokens: list[int]   # seqs[0]
    unified: bool       # one pool of n_ctx cells for every sequence

    def _share(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Let sequence dst hold src's cells at positions [p0, p1) too (llama_memory_seq_cp)."""
        C.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def _seq_id(self, seq: int) -> int:
        if not 0 <= seq < self.n_seq:
            raise EngineError(f"sequence id {seq} is outside 0..{self.n_seq - 1} ({self.name} has n_seq {self.n_seq})")
        return int(seq)

    # -- what each sequence holds ---------------------------------------------------------------

    def copy_seq(self, src: int, dst: int, n: int | None = None) -> None:
        """Make sequence dst hold the first n tokens of src (all by default), sharing src's cells:
        nothing is computed. What dst held before is dropped."""
        src, dst = self._seq_id(src), self._seq_id(dst)
        n = len(self.seqs[src]) if n is None else n
        if not 0 <= n <= len(self.seqs[src]) or src == dst:
            raise EngineError(f"cannot copy {n} tokens of sequence {src} (it holds {len(self.seqs[src])}) to {dst}")
        self.drop_seq(dst)
        self._share(src, dst, 0, n)
        self.seqs[dst].extend(self.seqs[src][:n])

    def drop_seq(self, seq: int) -> None:
        """Empty sequence `seq`; cells no other sequence holds are freed."""
        self.truncate(0, self._seq_id(seq))

    def keep_seq(self, seq: int) -> None:
        """Keep sequence `seq` only: every other sequence is emptied and its cells freed."""
        seq = self._seq_id(seq)
        for s, held in enumerate(self.seqs):
            if s != seq and held:
                self.drop_seq(s)

    def sync(self, tokens: Sequence[int]) -> None:
        """Make sequence 0 hold exactly `tokens`, reusing the longest common prefix already there."""
        tokens = list(tokens)  # a tuple never compares equal to a list slice
        common = common_prefix(self.tokens, tokens)
        if common < len(self.tokens):
            self.truncate(common)
        self.eval(tokens[common:])

    # -- one decode over rows of several sequences ----------------------------------------------

    def decode_rows(self, tokens: Sequence[int], seqs, logits=None, pad: bool = False) -> np.ndarray | None:
        """Decode one batch of rows and append each row to its sequences; return the logits of the
        rows asked for, in row order.

        tokens: one token per row. seqs: per row, its sequence id (ints), or an (rows, n_seq) bool
        array of the sequences each row belongs to. logits: per row, whether its logits are wanted
        (None: none). The result is a (rows asked, n_vocab) float32 view into llama.cpp's buffer,
        valid until the next call on this model. At most n_batch rows (EngineError otherwise). On
        failure every cache and `seqs` are as they were. pad: with stable shapes (engine/shapes.py)
        the batch may get rows of sequence 0 after its own, removed from the cache at once.
        """
        arr = np.asarray(tokens, dtype=np.int32).reshape(-1)
        m = len(arr)
        if m == 0:
            return None
        if m > self.n_batch:
            raise EngineError(f"a batch of {m} rows is over n_batch {self.n_batch} ({self.name})")
        member = self._members(seqs, m)
        want = np.zeros(m, bool) if logits is None else np.asarray(logits, dtype=bool).reshape(-1)
        if len(want) != m:
            raise EngineError(f"{len(want)} logits flags for {m} rows")
        lens, seen, pos = self._place(member)
        b = self._rows
        b.tok[:m] = arr
        b.pos[:m] = pos
        b.nseq[:m] = member.sum(axis=1)
        b.sid[:m] = np.argsort(~member, axis=1, kind="stable")  # each row's sequence ids first, in order
        b.out[:m] = want
        touched = np.flatnonzero(seen[-1]).tolist()
        size, end0 = m, int(lens[0] + seen[-1][0])   # sequence 0's end after the batch
        if pad and self.shapes is not None:
            size = self.shapes.rows(m, bool(want.all()))
            # The padding must fit sequence 0's positions and, in a unified cache, the cells every
            # sequence shares (a tree's rows take cells beside sequence 0's: near the context's end
            # a padded tree overflowed them, and the decode failed).
            room = m + self.n_ctx - end0
            if self.unified:
                room = min(room, self.n_ctx - self._cells_held(member))
            if size > min(self.n_batch, room):
                size = m
        if size > m:
            self.shapes.padded += size - m
            b.tok[m:size] = arr[-1]
            b.pos[m:size] = np.arange(end0, end0 + size - m, dtype=np.int32)
            b.sid[m:size, 0] = 0   # nseq is 1 there already
            b.out[:size] = 1
        try:
            b.c.n_tokens = size
            with interrupt.deferred():
                self._check_aborts(size)
                rc = C.llama_decode(self._ctx, b.c)
                if size > m:
                    C.llama_memory_seq_rm(self._mem, 0, end0, -1)   # the padding: never part of the text
                if rc != 0:
                    for s in touched:  # drop whatever part of the batch may have landed
                        self.truncate(int(lens[s]), s, landed=True)
                    raise self._failed(rc)
        finally:
            b.nseq[:m] = 1  # `eval` fills only tokens, positions and outputs: its rows are sequence 0's
            b.sid[:m, 0] = 0
        for s in touched:
            self.seqs[s].extend(arr[member[:, s]].tolist())
        if size > m:   # every row has logits: the asked ones are among the first m
            out = self._logit_rows(size)[:m]
            return out if want.all() else out[want]
        rows = int(want.sum())
        return self._logit_rows(rows) if rows else None

    def _place(self, member: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Check rows against llama.cpp's batch rules and the context, and place them: (each
        sequence's length before the batch, its rows so far at each row, each row's position)."""
        self._check_coupled(member)
        lens = np.array([len(s) for s in self.seqs])
        seen = np.cumsum(member, axis=0)  # each sequence's rows so far, this one included
        at = np.where(member, lens + seen - 1, -1)  # the row's position in each of its sequences
        pos = at.max(axis=1)
        apart = np.flatnonzero((member & (at != pos[:, None])).any(axis=1))
        if len(apart):
            i = int(apart[0])
            raise EngineError(f"row {i} belongs to sequences {np.flatnonzero(member[i]).tolist()}, which have "
                              "different rows before it in the batch")
        end = lens + seen[-1]
        if (end > self.n_ctx).any():
            s = int(np.argmax(end))
            raise EngineError(f"context full: {int(end[s])} tokens > n_ctx {self.n_ctx} in sequence {s} ({self.name})")
        return lens, seen, pos

    def _cells_held(self, member: np.ndarray) -> int:
        """The cells of a unified cache in use before a batch of rows `member`, at most: sequence
        0's, and every other sequence's whole, but for a sequence that shares a row of the batch
        with sequence 0. That one holds sequence 0's text (`_check_coupled`) in sequence 0's cells:
        `eval_tree`, the one caller that pads such rows, copies them to its branches just before."""
        shares = (member[:, :1] & member).any(axis=0)
        return len(self.seqs[0]) + sum(len(held) for s, held in enumerate(self.seqs) if s and not shares[s])

    def _check_coupled(self, member: np.ndarray) -> None:
        """Sequences that share a row must hold the same text: llama.cpp attends such a row to the
        cells of its first sequence only (the KQ mask reads seq_id[i][0])."""
        shared = member[member.sum(axis=1) > 1]
        if not len(shared):
            return
        rows, seqs = np.nonzero(shared)
        firsts = shared.argmax(axis=1)[rows]
        pairs = np.unique((firsts * self.n_seq + seqs)[seqs != firsts])  # each (first, other) once
        for first, s in zip((pairs // self.n_seq).tolist(), (pairs % self.n_seq).tolist()):
            if self.seqs[s] != self.seqs[first]:
                i = int(np.flatnonzero(member[:, first] & member[:, s])[0])
                raise EngineError(f"row {i} belongs to sequences {first} and {s}, which hold different texts "
                                  "(a row shared by sequences must follow the same text in each)")

    def _members(self, seqs, m: int) -> np.ndarray:
        """The (m, n_seq) bool array of each row's sequences, from ids or such an array."""
        given = np.asarray(seqs)
        if given.dtype == bool and given.shape == (m, self.n_seq):
            if not given.any(axis=1).all():
                raise EngineError(f"row {int(np.argmin(given.any(axis=1)))} belongs to no sequence")
            return given
        if given.ndim != 1 or len(given) != m or not np.issubdtype(given.dtype, np.integer):
            raise EngineError(f"seqs must be {m} sequence ids or a ({m}, {self.n_seq}) bool array")
        bad = np.flatnonzero((given < 0) | (given >= self.n_seq))
        if len(bad):
            self._seq_id(int(given[bad[0]]))  # raises
        return given[:, None] == np.arange(self.n_seq)

    # -- concurrent sequences -------------------------------------------------------------------

    def eval_blocks(self, blocks: Sequence[tuple[int, Sequence[int], int | None]]) -> list[np.ndarray | None]:
        """Append a block to each of several sequences in one decode: blocks are (seq, tokens,
        logits_from), logits_from as in `eval` (None: no logits). Returns each block's logit rows
        (or None), views valid until the next call on this model."""
        tokens, seqs, want, rows = [], [], [], []
        for seq, block, logits_from in blocks:
            n = len(block)
            start = logit_start(n, logits_from)
            tokens.extend(block)
            seqs.extend([self._seq_id(seq)] * n)
            want.extend([False] * start + [True] * (n - start))
            rows.append(n - start)
        out = self.decode_rows(tokens, np.array(seqs, dtype=np.int64), want)
        edges = np.cumsum([0, *rows])
        return [out[lo:hi] if hi > lo else None for lo, hi in zip(edges, edges[1:])]

    # -- draft trees ----------------------------------------------------------------------------

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Evaluate a tree of tokens after sequence 0's text in one decode; return every node's
        logits (row i: the distribution after the path from the text to node i).

        parents[i] is node i's parent, -1 for a child of the text; a parent comes before its
        children. Branch j (the path to the j-th leaf) is sequence j: sequence 0 is one of them
        and 1..branches-1 are the tree's own, whatever they held is dropped first. Each starts as a
        copy of sequence 0's cells, so the text is stored once and seen by every branch. Then call
        `keep_path` with the accepted nodes.
        """
        member = tree_members(parents, self.n_seq)
        arr = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if len(arr) != len(member):
            raise EngineError(f"{len(arr)} tokens for a tree of {len(member)} nodes")
        if len(arr) > self.n_batch:  # refused before any sequence is touched
            raise EngineError(f"a batch of {len(arr)} rows is over n_batch {self.n_batch} ({self.name})")
        text = len(self.tokens)
        branches = np.flatnonzero(member.any(axis=0)).tolist()
        for s in branches[1:]:
            self.copy_seq(0, s)
        try:
            out = self.decode_rows(arr, member, np.ones(len(arr), bool), pad=True)
        except BaseException:
            for s in branches[1:]:
                self.drop_seq(s)
            raise
        self._tree = (text, np.asarray(parents).reshape(-1), member, arr, [len(s) for s in self.seqs])
        return out

    def keep_path(self, path: Sequence[int]) -> None:
        """After `eval_tree`: keep the accepted path (node indices from a root down, possibly none)
        and free every other cell of the tree. Sequence 0 then holds the text and the path's
        tokens, and the tree's other sequences are empty."""
        tree = self._tree
        if tree is None or tree[4] != [len(s) for s in self.seqs]:
            raise EngineError("keep_path needs the tree of the last eval_tree, with the caches unchanged since")
        text, parents, member, arr, _ = tree
        path = np.asarray(path, dtype=np.int64).reshape(-1)
        d = len(path)
        inside = ((path >= 0) & (path < len(parents))).all()
        if not inside or (d and (parents[path] != np.concatenate(([-1], path[:-1]))).any()):
            raise EngineError(f"{path.tolist()} is not a path from a root of the tree")
        keep = int(np.argmax(member[path[-1]])) if d else 0  # a branch through the path's last node
        if keep == 0:
            self.truncate(text + d)
        else:
            self.truncate(text)
            self._share(keep, 0, text, text + d)
            self.tokens.extend(arr[path].tolist())
        for s in np.flatnonzero(member.any(axis=0))[1:]:
            self.drop_seq(int(s))
        self._tree = None
