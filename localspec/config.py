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

N_BATCH = 512
"""--n-batch when not given: the most tokens one llama_decode takes (llama.cpp's default)."""

MIN_BATCH = max(MAX_TREE_NODES, MAX_DRAFT) + 1
"""The smallest --n-batch: a verify batch (the largest draft tree, or -k 64, and the last token)
must fit one decode."""


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


LOGIT_LIMIT = 1e30
"""The largest penalty or bias magnitude (and 1 / the smallest repeat penalty): llama.cpp's rows are
float32 (max 3.4e38), and a penalty times a token's count in the window must stay finite there;
past it a numpy overflow turned rows to NaN and the run blamed corrupt weights."""


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
    repeat_penalty: float = 1.0
    """llama.cpp's repeat penalty on the tokens of the last `repeat_last_n`: a positive logit is
    divided by it, a negative one multiplied; 1 disables."""
    repeat_last_n: int = 64
    """How many of the latest tokens (prompt and output) the penalties look at; -1 = all, 0 = none."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token present in that window; 0 disables."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it occurs in that window; 0 disables."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to those tokens' logits before anything else; -inf bans one."""
    grammar: str = ""
    """GBNF text the output must match ('' = none): llama.cpp's grammar masks every row (draft
    and target alike) to the tokens it allows next, and the output ends only when it is complete.
    --grammar, --format json and --json-schema all become this."""
    grammar_name: str = ""
    """What the grammar came from, for the records: "json", "schema FILE", "FILE.gbnf"..."""

    def __post_init__(self) -> None:
        if not 0 <= self.temperature < float("inf"):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ConfigError(f"min-p must be in [0, 1), got {self.min_p}")
        if not 1 / LOGIT_LIMIT <= self.repeat_penalty <= LOGIT_LIMIT:
            raise ConfigError(f"repeat-penalty must be a number in [{1 / LOGIT_LIMIT:g}, {LOGIT_LIMIT:g}] (1 = off; "
                              f"logits are float32), got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise ConfigError(f"repeat-last-n must be >= -1 (-1 = all, 0 = none), got {self.repeat_last_n}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not abs(getattr(self, name)) <= LOGIT_LIMIT:
                raise ConfigError(f"{name.replace('_', '-')} must be a number between {-LOGIT_LIMIT:g} and "
                                  f"{LOGIT_LIMIT:g} (logits are float32), got {getattr(self, name)}")
        for token, bias in self.logit_bias:
            if token < 0 or not (abs(bias) <= LOGIT_LIMIT or bias == float("-inf")):
                raise ConfigError(f"logit-bias takes TOKEN=BIAS with a token id >= 0 and a bias between "
                                  f"{-LOGIT_LIMIT:g} and {LOGIT_LIMIT:g}, or -inf to ban it, got {token}={bias}")

    @property
    def greedy(self) -> bool:
        """True when decoding is deterministic argmax."""
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether the penalties change anything."""
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                            or self.frequency_penalty != 0.0)

    @property
    def processed(self) -> bool:
        """Whether rows go through the logit processing (`decoding.processing`) before sampling."""
        return self.penalized or bool(self.logit_bias)

    def record(self) -> dict:
        """The settings as the outputs record them (`generate --json`, a saved chat and its
        replies); users' tools read these keys, so they stay as they are. Penalties and logit
        bias are recorded only when they are set."""
        out = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
               "min_p": self.min_p, "seed": self.seed}
        if self.penalized:
            out.update(repeat_penalty=self.repeat_penalty, repeat_last_n=self.repeat_last_n,
                       presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty)
        if self.logit_bias:
            out["logit_bias"] = {str(t): b for t, b in self.logit_bias}
        if self.grammar:
            out["grammar"] = self.grammar_name or "gbnf"
        return out


FLASH_ATTN = ("auto", "on", "off")
"""--flash-attn: llama.cpp decides per device (auto), always, or never."""

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
"""KV cache types llama.cpp accepts (`common/arg.cpp` kv_cache_types); a quantized V cache needs
flash attention."""

SPLIT_MODES = ("none", "layer", "row", "tensor")
"""--split-mode as llama.cpp defines it: one device only, layers (and their KV) across devices,
weights split by rows, or tensor parallelism (experimental in llama.cpp)."""


@dataclass(frozen=True)
class Placement:
    """Where llama.cpp puts one model's layers, and how it stores the model's KV cache."""

    rpc: tuple[str, ...] = ()
    """llama.cpp RPC workers (HOST:PORT) whose devices take layers, ahead of local GPUs (as
    llama.cpp orders them); empty: local devices only."""
    split_mode: str = "layer"
    """How layers spread over several devices (`SPLIT_MODES`)."""
    tensor_split: tuple[float, ...] = ()
    """Proportion of the model per device, in device order (RPC workers first); empty: by free
    memory, llama.cpp's default."""
    main_gpu: int = 0
    """The device used with split mode none (and for intermediate results with row)."""
    flash_attn: str = "auto"
    """Flash attention: auto, on or off (`FLASH_ATTN`)."""
    cache_type_k: str = "f16"
    """Type of the KV cache's keys (`CACHE_TYPES`)."""
    cache_type_v: str = "f16"
    """Type of the KV cache's values (`CACHE_TYPES`); quantized needs flash attention."""
    stable_shapes: str = "auto"
    """Pad each small decode that wants logits to the size the model has been using, so that a
    GPU backend's graphs replay (engine/shapes.py): on, off, or auto (on where the model's layers
    are on a CUDA GPU). The output is the same either way."""

    def __post_init__(self) -> None:
        if self.stable_shapes not in ("auto", "on", "off"):
            raise ConfigError(f"--stable-shapes must be auto, on or off, got {self.stable_shapes!r}")
        for endpoint in self.rpc:
            host, _, port = endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"--rpc takes HOST:PORT[,HOST:PORT...], got {endpoint!r}")
        if len(set(self.rpc)) != len(self.rpc):
            raise ConfigError(f"--rpc names a worker twice: {','.join(self.rpc)}")
        if self.split_mode not in SPLIT_MODES:
            raise ConfigError(f"--split-mode must be one of {', '.join(SPLIT_MODES)}, got {self.split_mode!r}")
        if any(not 0 <= x < float("inf") for x in self.tensor_split) or \
                (self.tensor_split and sum(self.tensor_split) <= 0):
            raise ConfigError("--tensor-split takes proportions >= 0, not all 0, like 3,1 "
                              f"(got {','.join(f'{x:g}' for x in self.tensor_split)})")
        if self.main_gpu < 0:
            raise ConfigError(f"--main-gpu must be >= 0, got {self.main_gpu}")
        if self.flash_attn not in FLASH_ATTN:
            raise ConfigError(f"--flash-attn must be one of {', '.join(FLASH_ATTN)}, got {self.flash_attn!r}")
        for which in ("k", "v"):
            value = getattr(self, f"cache_type_{which}")
            if value not in CACHE_TYPES:
                raise ConfigError(f"--cache-type-{which} must be one of {', '.join(CACHE_TYPES)}, got {value!r}")
        if self.cache_type_v not in ("f32", "f16", "bf16") and self.flash_attn == "off":
            raise ConfigError(f"a {self.cache_type_v} V cache needs flash attention (--flash-attn on or auto)")

    def record(self) -> dict:
        """The settings that differ from llama.cpp's defaults (what reports and warm-start keys
        record)."""
        default = Placement()
        return {name: getattr(self, name) for name in self.__dataclass_fields__
                if getattr(self, name) != getattr(default, name)}


def parse_list(text: str | None, what: str, kind=str) -> tuple:
    """A comma-separated option value (`--rpc a:1,b:2`, `--tensor-split 3,1`) as a tuple; None
    (not given) is (). Given, it may not be empty nor hold an empty entry: `--rpc ""` ran locally
    without a word."""
    if text is None:
        return ()
    entries = [x.strip() for x in str(text).replace("/", ",").split(",")]
    if not any(entries):
        raise ConfigError(f"{what} is empty: give a comma-separated list, or leave the option out")
    if not all(entries):
        raise ConfigError(f"{what} has an empty entry: {str(text)[:200]!r}")
    try:
        return tuple(kind(x) for x in entries)
    except ValueError:
        raise ConfigError(f"{what} takes a comma-separated list, got {text!r}") from None


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
    n_batch: int = N_BATCH
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
    placement: Placement = Placement()
    """Devices (local, RPC workers), split, flash attention and KV cache types."""
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
    mask_draft: bool = True
    """Under a grammar, mask the draft model's rows too (it then proposes only what the grammar
    allows); off, only the target's rows are masked and a forbidden draft token is rejected.
    Either way the output has the constrained target's distribution; masking raises α."""
    overlap: bool | None = None
    """Let the draft model draft on while the target verifies (`decoding.overlap`): None where the
    target's layers are on RPC workers and its first decodes left a core free (`overlap.Judge`);
    False never, True always."""

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
