"""Loading a target (and a draft), checking they can work together, and building drafters/prompts.

Shared by `generate`, `bench`, `chat` and `doctor` so they resolve models the same way.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .config import DRAFTERS, ConfigError, ModelConfig
from .drafters import Drafter, ModelDrafter, PromptLookup
from .engine import Model, check_gguf


@dataclass(frozen=True)
class LoadConfig:
    """Which models to load and how."""

    target: str | None = None
    """Target GGUF path; None = the embedded default (F32 SmolLM2-135M-Instruct)."""
    draft: str | None = None
    """Draft GGUF path; None = the embedded default when the drafter is "model" and no target was
    given, otherwise no draft model."""
    drafter: str | None = None
    """"model", "lookup" or "none"; None = "model" when a draft is available, else "lookup"."""
    n_ctx: int = 4096
    """Context length for both models."""
    threads: int | None = None
    """CPU threads; None = localspec's choice for this machine."""
    target_gpu_layers: int = -1
    """Target layers offloaded to the GPU (-1 = all)."""
    draft_gpu_layers: int = -1
    """Draft layers offloaded to the GPU (-1 = all)."""

    def __post_init__(self) -> None:
        if self.drafter is not None and self.drafter not in DRAFTERS:
            raise ConfigError(f"unknown drafter {self.drafter!r}; choose one of {', '.join(DRAFTERS)}")
        if self.n_ctx < 16:
            raise ConfigError(f"n-ctx must be >= 16, got {self.n_ctx}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")


# llama.cpp's own speculative example tolerates this much: families pad their vocabularies to
# different multiples (Qwen2.5-7B has 152064 ids, Qwen2.5-0.5B 151936), with unused ids at the end.
VOCAB_SIZE_SLACK = 128


def check_vocab(target: Model, draft: Model) -> None:
    """Refuse a draft whose tokenizer differs from the target's: ids would mean different text."""
    where = f"draft {draft.path} and target {target.path}"
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_SIZE_SLACK:
        raise ConfigError(f"vocabularies differ: {where} have {draft.n_vocab} vs {target.n_vocab} tokens")
    for label in ("bos", "eos", "eot"):
        a, b = getattr(target, label), getattr(draft, label)
        if a != b:
            raise ConfigError(f"special token {label.upper()} differs: {where} use ids {b} vs {a}")
    for tok in range(min(target.n_vocab, draft.n_vocab)):
        if target.token_text(tok) != draft.token_text(tok):
            raise ConfigError(f"vocabularies differ: {where} first differ at token id {tok}")


class Session:
    """A loaded target, an optional draft model, and the drafter choice."""

    def __init__(self, target: Model, draft: Model | None, drafter: str):
        self.target = target
        self.draft = draft
        self.drafter_kind = drafter

    @classmethod
    def load(cls, cfg: LoadConfig, notice: Callable[[str], None] | None = None) -> "Session":
        from . import defaults

        notice = notice or (lambda m: print(m, file=sys.stderr, flush=True))
        drafter = cfg.drafter or ("model" if cfg.draft or not cfg.target else "lookup")
        if drafter == "model" and not cfg.draft and cfg.target:
            raise ConfigError("--drafter model needs --draft PATH (a GGUF sharing the target's tokenizer)")
        target_path, draft_path = defaults.default_pair(cfg.target, cfg.draft, drafter == "model", notice)
        for path in (target_path, draft_path):
            if path is not None:
                check_gguf(path)  # both files, before spending time loading either
        target = Model(ModelConfig(target_path, cfg.n_ctx, cfg.threads, cfg.target_gpu_layers))
        if target.recurrent and drafter != "none":
            target.close()
            # Rejected drafts must be removed from the cache; a recurrent state cannot be rewound.
            raise ConfigError(
                f"{target_path} is a recurrent/hybrid model whose memory cannot be rolled back, which "
                "speculative decoding needs; use --drafter none"
            )
        draft = None
        if draft_path is not None:
            draft = Model(ModelConfig(draft_path, cfg.n_ctx, cfg.threads, cfg.draft_gpu_layers))
            try:
                check_vocab(target, draft)
            except ConfigError:
                draft.close()
                target.close()
                raise
        return cls(target, draft, drafter)

    def make_drafter(self, kind: str | None = None) -> Drafter | None:
        kind = kind or self.drafter_kind
        if kind == "model":
            if self.draft is None:
                raise ConfigError("no draft model is loaded; pass --draft PATH")
            return ModelDrafter(self.draft, self.target.n_vocab)
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
        if len(tokens) >= self.target.n_ctx - 1:
            raise ConfigError(f"{what} is {len(tokens)} tokens, too long for n_ctx {self.target.n_ctx} "
                              "(raise --n-ctx)")

    def prompt_tokens(self, text: str, chat: bool, system: str | None = None) -> list[int]:
        """Tokens for a one-turn prompt: through the GGUF's chat template, or raw text."""
        if chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": text}
            ]
            return self.target.chat_prompt(messages)
        return self.target.tokenize(text, add_special=True)

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
