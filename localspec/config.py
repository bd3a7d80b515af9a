"""Frozen configuration records shared by the library, the CLI and the TUI."""

from __future__ import annotations

from dataclasses import dataclass, field


DRAFTERS = ("auto", "model", "lookup", "none")
"""How draft tokens are proposed: per step the best of prompt lookup and the draft model (auto), a
draft model, prompt lookup (n-grams of the text), or no speculation at all (plain decoding, useful
as a baseline)."""

NEEDS_DRAFT = ("auto", "model")
"""The drafters that need a draft model."""


MAX_DRAFT = 64
"""The most draft tokens one step may propose (-k): a verify batch must fit llama.cpp's batch, and
beyond a few dozen even a perfect drafter gains nothing a GPU would notice."""

MAX_BRANCHES = 8
"""The most branches (leaves) a draft tree may have: each is a sequence of both models' KV caches
(`ModelConfig.n_seq`), and past a handful the extra branches' acceptance is worth little."""

MAX_TREE_NODES = 64
"""The most nodes one draft tree may verify (the target's batch is its nodes plus the root)."""


def parse_tree(text: str) -> str | tuple[int, ...]:
    """`--tree`: "auto" (the controller chooses the tree per step), "off" (chains only), or a SHAPE:
    the branching per depth, e.g. "3,2,1,1" (3 children of the root, 2 under each, then chains).
    Depths past the shape have one child each, down to the draft length k."""
    t = str(text).strip().lower()
    if t in ("auto", "off"):
        return t
    try:
        shape = tuple(int(x) for x in t.split(","))
    except ValueError:
        raise ConfigError(f"--tree must be auto, off or a branching per depth like 3,2,1 (got {text!r})") from None
    if not shape or any(b < 1 for b in shape):
        raise ConfigError(f"--tree: every branching must be >= 1 (got {text!r})")
    if tree_leaves(shape) > MAX_BRANCHES:
        raise ConfigError(f"--tree {text}: {tree_leaves(shape)} branches, at most {MAX_BRANCHES}")
    return shape


def tree_leaves(shape: tuple[int, ...]) -> int:
    """Branches of a tree of this shape: the product of its branchings."""
    n = 1
    for b in shape:
        n *= b
    return n


class ConfigError(ValueError):
    """A user-facing configuration problem; the CLI prints it as one line and exits 2."""


@dataclass(frozen=True)
class SamplingConfig:
    """How a next-token distribution is drawn from a row of logits.

    The same processing is applied to the draft's and the target's logits, so the acceptance rule
    compares exactly the distributions that would have been sampled.
    """

    temperature: float = 0.8
    """Softmax temperature. 0 means greedy (argmax of the raw logits)."""
    top_k: int = 40
    """Keep only the k most likely tokens; 0 disables."""
    top_p: float = 0.95
    """Keep the smallest set of tokens whose probability sums to at least top_p; 1.0 disables."""
    min_p: float = 0.05
    """Drop tokens whose probability is below min_p times the top token's; 0 disables."""
    seed: int | None = None
    """Seed of the random generator used for drafting and acceptance; None draws one at random."""

    def __post_init__(self) -> None:
        if not 0 <= self.temperature < float("inf"):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ConfigError(f"min-p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        """True when decoding is deterministic argmax."""
        return self.temperature == 0

    def record(self) -> dict:
        """The settings as the outputs record them (`generate --json`, a saved chat and its
        replies); users' tools read these keys, so they stay as they are."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "min_p": self.min_p, "seed": self.seed}


@dataclass(frozen=True)
class ModelConfig:
    """Where a GGUF lives and how llama.cpp should run it."""

    path: str
    """Path to the GGUF file."""
    n_ctx: int = 4096
    """Context length (tokens) of the KV cache."""
    n_threads: int | None = None
    """CPU threads for decoding; None uses llama.cpp's choice for this machine."""
    n_gpu_layers: int = -1
    """Layers offloaded to the GPU; -1 means all (ignored by CPU-only builds)."""
    n_batch: int = 512
    """Largest number of tokens handed to one llama_decode call (prefill is chunked by it)."""
    n_seq: int = 1
    """Sequences the KV cache holds (the branches of a draft tree, concurrent requests). Above 1
    the cache is unified unless `unified` is False: its n_ctx cells are shared by all sequences,
    and a cell common to several (a shared prefix) is stored once."""
    unified: bool = True
    """With n_seq > 1: one pool of cells for all sequences (draft trees need it: a row may belong
    to several sequences only there). False: each sequence has n_ctx / n_seq cells of its own
    (llama.cpp's non-unified cache), so its attention never sums over another's cells, and its
    logits do not depend on what other sequences hold (concurrent generations without trees)."""

    def __post_init__(self) -> None:
        if self.n_seq < 1:
            raise ConfigError(f"n_seq must be >= 1, got {self.n_seq}")


@dataclass(frozen=True)
class DecodeConfig:
    """What a generation run asks for, beyond sampling."""

    max_tokens: int = 256
    """Stop after this many generated tokens."""
    k: int | None = None
    """Fixed number of draft tokens per step; None lets the adaptive controller choose."""
    k_max: int = 12
    """Upper bound for the adaptive draft length."""
    stop: tuple[str, ...] = field(default_factory=tuple)
    """Stop strings: generation ends before the first occurrence of any of them."""
    tree: str | tuple[int, ...] = "off"
    """Draft trees: "off" (one chain per step), "auto" (the controller widens the chain into a tree
    when its measured costs and sibling acceptance say it pays), or a fixed shape (`parse_tree`)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"max-tokens must be >= 1, got {self.max_tokens}")
        if self.k is not None and not 0 <= self.k <= MAX_DRAFT:
            raise ConfigError(f"draft tokens (-k) must be between 0 and {MAX_DRAFT}, got {self.k}")
        if self.k_max < 1:
            raise ConfigError(f"k-max must be >= 1, got {self.k_max}")
        object.__setattr__(self, "tree", parse_tree(self.tree) if isinstance(self.tree, str) else
                           parse_tree(",".join(map(str, self.tree))))

    @property
    def tree_shape(self) -> tuple[int, ...] | None:
        """The fixed shape, or None for "off" and "auto"."""
        return self.tree if isinstance(self.tree, tuple) else None

    @property
    def n_seq(self) -> int:
        """Sequences each model's cache needs for this run's trees (1 without trees)."""
        if self.tree == "off":
            return 1
        return MAX_BRANCHES if self.tree == "auto" else tree_leaves(self.tree)
