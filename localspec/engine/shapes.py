"""Decode sizes that stay put, so that a GPU backend's graphs replay.

llama.cpp's CUDA backend records a decode's kernels as a CUDA graph and replays it, which takes
most of the launch overhead off a few-millisecond pass, but only while consecutive decodes of a
context have the same shapes: a decode whose row count differs from the last one runs without a
graph, and the one after it records one anew (`ggml_backend_cuda_graph_compute`; one graph per
context). Speculation changes the row count every step (k + 1 verify rows as k adapts, one-row
drafts between catch-ups of one or two), so without help it gets no replays at all, and a verify
of any size costs ~1.6-2.6x a replayed step (measured on an H200).

With stable shapes a model pads each small decode that wants logits to the size it has been using
(`Shapes.rows`): the extra rows repeat the last token at the following positions, every row asks
for logits so the output's shape is fixed too, and the padding's cache cells are removed at once.
The real rows attend to what they would unpadded: a row attends only to positions up to its own,
and the padding comes after every real row. Their values may still differ in the last bits, as
llama.cpp's kernels round differently at another batch size (~1e-4 seen), so greedy output equals
plain decoding up to counted near-ties, as at any batch size. The size grows at once to fit a larger request that wants
every row's logits (a verify, a tree, a draft token) and shrinks only after SHRINK_AFTER requests
in a row would have fitted half of it, so that a steady stream of decodes keeps one shape. A long
read that wants only its last logits (a draft model catching up on many tokens) is decoded as it
is, once, without moving the size.
"""

from __future__ import annotations

TOP = 64            # decodes of more rows (prompts) are never padded
GROW_ANY = 4        # a request up to this size moves the size even when it wants only its last row
SHRINK_AFTER = 8    # requests in a row that would fit half the size before it halves: larger keeps
                    # a shape through a stretch of short decodes, smaller pads less on a CPU


def bucket(n: int) -> int:
    """The padded size of n rows: the power of two at or above it."""
    return 1 << max(n - 1, 0).bit_length()


class Shapes:
    """One context's decode size (see the module)."""

    def __init__(self) -> None:
        self.size = 1
        self._small = 0   # requests in a row that would have fitted half the size
        self.padded = 0   # rows the model added so far (for the records)

    def rows(self, n: int, all_logits: bool) -> int:
        """The rows to decode for a request of n rows (n itself when it is not padded)."""
        if n > TOP:
            return n
        if n > self.size:
            if not all_logits and n > GROW_ANY:
                return n
            self.size, self._small = bucket(n), 0
        elif 2 * n <= self.size:
            self._small += 1
            if self._small >= SHRINK_AFTER:
                self.size, self._small = bucket(n), 0
        else:
            self._small = 0
        return self.size
