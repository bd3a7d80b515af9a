"""Loading a target (and a draft), checking they can work together, and building drafters/prompts.

Shared by `generate`, `bench`, `chat` and `doctor` so they resolve models the same way.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from localspec import machine
from . import vocab
from localspec.config import DRAFTERS, MIN_BATCH, N_BATCH, NEEDS_DRAFT, ConfigError, ModelConfig, Placement
from localspec.tokens import prompt_fits
from localspec.decoding.drafters import Drafter, PromptLookup
from localspec.decoding.model_drafter import ModelDrafter
from localspec.decoding.auto import AutoDrafter
from localspec.engine import EngineError, Model, WorkerError, check_gguf, connect_workers, load_failure
from localspec.engine.gguf import GGUFFormatError, read_info


MAX_CTX = 2**31 - 1


@dataclass(frozen=True)
class LoadConfig:
    """Which models to load and how."""

    target: str | None = None
    """Target GGUF path; None = the embedded default (F32 SmolLM2-135M-Instruct)."""
    draft: str | None = None
    """Draft GGUF path; None = the embedded default when the drafter needs a draft model and no
    target was given, otherwise no draft model."""
    drafter: str | None = None
    """"auto", "model", "lookup" or "none"; None = "auto" when a draft is available, else "lookup"."""
    n_ctx: int = 4096
    """Context length for both models."""
    threads: int | None = None
    """CPU threads; None = fitted to the cores free once the models have loaded
    (`machine.choose_threads`)."""
    reserve_cores: int = 0
    """Cores the thread choice leaves to the caller: 1 in chat (the screen) and serve (the event
    loop), whose work would otherwise deschedule one of llama.cpp's spin-waiting threads."""
    target_gpu_layers: int = -1
    """Target layers offloaded to the GPU (-1 = all)."""
    draft_gpu_layers: int = -1
    """Draft layers offloaded to the GPU (-1 = all)."""
    n_seq: int = 1
    """Sequences of each model's KV cache: the branches a draft tree needs (`DecodeConfig.n_seq`);
    1 for chains only. Both models get it, the target also for prompt lookup's trees."""
    parallel: int = 1
    """Generations the models serve at once (`serve --parallel`, `bench --concurrency`): each gets
    n_seq sequences and n_ctx cells of one shared cache (`loading.pool`)."""
    target_placement: Placement = Placement()
    """The target's devices (RPC workers, split), flash attention and KV cache types."""
    draft_placement: Placement = Placement()
    """The draft's: local devices only (no workers), its flash attention and KV cache types."""
    n_batch: int = N_BATCH
    """Most tokens one llama_decode takes, for both models (--n-batch)."""

    def __post_init__(self) -> None:
        if self.drafter is not None and self.drafter not in DRAFTERS:
            raise ConfigError(f"unknown drafter {self.drafter!r}; choose one of {', '.join(DRAFTERS)}")
        if not 16 <= self.n_ctx <= MAX_CTX:
            # llama.cpp holds n_ctx in 32 bits: a larger value would wrap to a tiny context
            raise ConfigError(f"n-ctx must be between 16 and {MAX_CTX}, got {self.n_ctx}")
        for role in ("target", "draft"):
            if getattr(self, f"{role}_gpu_layers") < -1:
                raise ConfigError(f"--{role}-gpu-layers must be >= -1 (-1 = all), got {getattr(self, f'{role}_gpu_layers')}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        if self.reserve_cores < 0:
            raise ConfigError(f"reserve_cores must be >= 0, got {self.reserve_cores}")
        if self.n_seq < 1:
            raise ConfigError(f"n_seq must be >= 1, got {self.n_seq}")
        if self.parallel < 1:
            raise ConfigError(f"parallel must be >= 1, got {self.parallel}")
        if not MIN_BATCH <= self.n_batch <= 1 << 20:
            raise ConfigError(f"--n-batch must be between {MIN_BATCH} (a verify batch fits one decode) and "
                              f"{1 << 20}, got {self.n_batch}")
        if self.draft_placement.rpc:
            raise ConfigError("the draft runs locally: --rpc places the target only")


def resolve_files(cfg: LoadConfig, notice: Callable[[str], None] | None = None) -> LoadConfig:
    """`cfg` with the drafter chosen and both files found (the embedded default made if need be)
    and checked to be readable GGUFs: everything that can fail before a model loads."""
    from dataclasses import replace

    from . import defaults

    notice = notice or (lambda m: print(m, file=sys.stderr, flush=True))
    drafter = cfg.drafter or ("auto" if cfg.draft or not cfg.target else "lookup")
    if drafter in NEEDS_DRAFT and not cfg.draft and cfg.target:
        raise ConfigError(f"--drafter {drafter} needs --draft PATH (a GGUF sharing the target's tokenizer)")
    target, draft = defaults.default_pair(cfg.target, cfg.draft, drafter in NEEDS_DRAFT, notice)
    for path in (target, draft):
        if path is not None:
            _with_rebuild_hint(check_header, path)  # both files, before spending time loading either
    return replace(cfg, target=str(target), draft=None if draft is None else str(draft), drafter=drafter)


def check_header(path: str | Path) -> None:
    """`check_gguf`, then the whole header read and the file's length checked against its tensors:
    a file llama.cpp would refuse for its format (version 99, truncated) fails here, in the shell,
    in the words `Model` would use, before a chat screen opens or another model loads."""
    p = check_gguf(path)
    try:
        info = read_info(p)
        broken = info.truncated
    except (GGUFFormatError, OSError):
        broken = True
    if broken:
        raise EngineError(f"failed to load {p}: {load_failure(p, ())}")


def fit_threads(models, requested: int | None, reserve: int, since: machine.Sample) -> machine.Threads:
    """Give the loaded `models` (None entries skipped) the thread count for the cores other work
    left free since `since` (taken before they loaded): the one rule, `machine.choose_threads`.
    An explicit `requested` is kept; the returned choice's `warning` says when it outnumbers them."""
    plan = machine.choose_threads(requested, reserve, machine.other_now(since))
    for model in models:
        if model is not None and model.n_threads != plan.threads:
            model.set_threads(plan.threads)
    return plan


def _load(cfg: ModelConfig) -> Model:
    return _with_rebuild_hint(Model, cfg, path=cfg.path)


def _with_rebuild_hint(call, arg, path=None):
    """call(arg); a broken file that localspec made itself is one to delete, and it says so."""
    from . import defaults

    try:
        return call(arg)
    except EngineError as e:
        if defaults.in_cache(path or arg) and "not found" not in str(e) and not isinstance(e, WorkerError):
            raise EngineError(f"{e}. It is a copy localspec made: delete it and the next run makes it "
                              "again") from None
        raise


class Session:
    """A loaded target, an optional draft model, and the drafter choice."""

    def __init__(self, target: Model, draft: Model | None, drafter: str, threads: machine.Threads | None = None,
                 n_ctx: int | None = None):
        self.target = target
        self.n_ctx = n_ctx or target.n_ctx
        """The context one generation has (the target's whole context unless it is shared by
        parallel generations)."""
        self.draft = draft
        self.drafter_kind = drafter
        self.threads = threads   # how the thread count was chosen (generate --json reports it)

    @classmethod
    def load(cls, cfg: LoadConfig, notice: Callable[[str], None] | None = None) -> "Session":
        cfg = resolve_files(cfg, notice)
        target_path, draft_path, drafter = cfg.target, cfg.draft, cfg.drafter
        # Loading takes long enough to see what other work keeps busy meanwhile, at no extra wait;
        # the models load with the idle count and take the fitted one after (`_fit_threads`).
        connect_workers(cfg.target_placement.rpc)   # an unreachable worker fails here, before loading
        loading = machine.sample()
        threads = cfg.threads or machine.choose_threads(None, cfg.reserve_cores, other=0.0).threads
        # Parallel generations share one cache of n_ctx cells per generation.
        n_ctx, n_seq = cfg.n_ctx * cfg.parallel, cfg.n_seq * cfg.parallel
        # Trees need one pool of cells (coupled sequences); without them each generation's cells
        # stay apart, so that its numbers never depend on the others' (engine.slots).
        unified = cfg.n_seq > 1
        target = _load(ModelConfig(target_path, n_ctx, threads, cfg.target_gpu_layers, cfg.n_batch, n_seq=n_seq,
                                   unified=unified, placement=cfg.target_placement))
        if target.recurrent and drafter != "none":
            target.close()
            # Rejected drafts must be removed from the cache; a recurrent state cannot be rewound.
            raise ConfigError(
                f"{target_path} is a recurrent/hybrid model whose memory cannot be rolled back, which "
                "speculative decoding needs; use --drafter none"
            )
        draft = None
        if draft_path is not None:
            try:
                draft = _load(ModelConfig(draft_path, n_ctx, threads, cfg.draft_gpu_layers, cfg.n_batch, n_seq=n_seq,
                                          unified=unified, placement=cfg.draft_placement))
                vocab.check(target, draft)
            except BaseException:
                if draft is not None:
                    draft.close()
                target.close()
                raise
        plan = fit_threads((target, draft), cfg.threads, cfg.reserve_cores, loading)
        if plan.warning:
            (notice or (lambda m: print(m, file=sys.stderr, flush=True)))(f"localspec: {plan.warning}")
        return cls(target, draft, drafter, plan, n_ctx=cfg.n_ctx)

    def make_drafter(self, kind: str | None = None, draft=None) -> Drafter | None:
        """A new drafter of `kind` (default: the session's); `draft`: the draft model's part it
        drafts with (a slot of a shared draft model), default the whole draft model."""
        kind = kind or self.drafter_kind
        if kind in NEEDS_DRAFT:
            if self.draft is None:
                raise ConfigError("no draft model is loaded; pass --draft PATH")
            # a slot's draft reads the prompt when it first drafts (a batch held plain never does)
            model = ModelDrafter(draft or self.draft, self.target.n_vocab, lazy=draft is not None)
            return AutoDrafter(model) if kind == "auto" else model
        if kind == "lookup":
            return PromptLookup()
        return None

    def chat_or_raw(self, chat: bool, notice: Callable[[str], None]) -> bool:
        """Whether prompts can go through a chat template: a GGUF without one falls back to raw text."""
        if chat and self.target.chat_template is None:
            notice(f"localspec: {self.target.name} has no chat template; sending prompts as raw text")
            return False
        return chat

    def check_fits(self, tokens: list[int], what: str = "prompt") -> None:
        """A prompt must leave room in the context for at least one generated token."""
        if not prompt_fits(len(tokens), self.n_ctx):
            raise ConfigError(f"{what} is {len(tokens)} tokens, too long for n_ctx {self.n_ctx} "
                              "(raise --n-ctx)")

    def prompt_tokens(self, text: str, chat: bool, system: str | None = None, special: bool = True) -> list[int]:
        """Tokens for a one-turn prompt: through the GGUF's chat template, or raw text.

        In raw text, `special` reads special-token text (`<|im_start|>`) as those tokens, as
        llama.cpp's own tools do, so a chat format written by hand works; False keeps it literal."""
        if chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": text}
            ]
            return self.target.chat_prompt(messages)
        return self.target.tokenize(text, add_special=True, parse_special=special)

    def describe(self) -> dict:
        return {
            "target": str(self.target.path),
            "draft": str(self.draft.path) if self.draft else None,
            "drafter": self.drafter_kind,
        }

    def close(self) -> None:
        self.target.close()
        if self.draft is not None:
            self.draft.close()


def model_label(path: str | Path | None) -> str:
    return Path(path).name if path else "—"
