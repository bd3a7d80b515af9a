"""A conversation: as it is stored (`Message`, `Conversation`, `Summary`: what `localspec.history`
reads back), and as the model sees it: the system prompt, then the user/assistant history, cut
from the oldest end until the prompt and the reply fit the context.

Pure: the chat template comes in as a function (`Model.chat_prompt`), so the terminal chat, a
server and the tests share one rule for what is dropped without loading a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .config import ConfigError

TITLE_CHARS = 60


@dataclass(frozen=True)
class Message:
    """One stored message."""

    id: int
    ordinal: int
    """Position in its conversation, from 0."""
    role: str
    """"user" or "assistant"."""
    content: str
    partial: bool
    """A reply that did not finish: stopped by the user, or cut off by a crash (then it holds the
    text as of its last write)."""
    created: float
    """Unix seconds."""
    updated: float
    stats: dict | None
    """What the caller recorded with an assistant reply (tokens, α, tokens/s, k, drafter, ...)."""


@dataclass(frozen=True)
class Conversation:
    """A stored conversation with its messages in order."""

    id: int
    title: str
    """The first line of the first user message, shortened."""
    created: float
    updated: float
    """When a message was last written."""
    settings: dict
    """What the caller gave `new_conversation`: model pair, sampling, drafter, k."""
    system: str | None
    messages: tuple[Message, ...]

    def history(self) -> list[dict[str, str]]:
        """[{"role", "content"}] as a chat keeps them; partial replies as the model saw them."""
        return [{"role": m.role, "content": m.content} for m in self.messages]


@dataclass(frozen=True)
class Summary:
    """A line of `Store.list_conversations`."""

    id: int
    title: str
    created: float
    updated: float
    """When a message was last written (Unix seconds)."""
    n_messages: int
    partial: bool
    """Some reply in it did not finish."""


def make_title(text: str) -> str:
    line = " ".join(next((s for s in text.splitlines() if s.strip()), "").split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


Render = Callable[[list[dict]], list[int]]
"""Messages -> prompt tokens through the GGUF's chat template (`Model.chat_prompt`)."""


@dataclass(frozen=True)
class Fitted:
    """A history cut to fit the context, and its prompt."""

    prompt: list[int]
    """Prompt tokens of the system prompt + the kept history."""
    dropped: int
    """Oldest history messages left out (always even: a user message and its reply go together)."""


def prompt_fits(n_prompt: int, n_ctx: int) -> bool:
    """The one prompt-fit rule of generate, chat and serve: a prompt fits when it leaves room in
    the context for at least one generated token (the last one is sampled, never evaluated)."""
    return n_prompt < n_ctx


def messages(system: str | None, history: Sequence[dict]) -> list[dict]:
    """The messages a chat template renders: the system prompt first (when there is one)."""
    head = [{"role": "system", "content": system}] if system else []
    return head + list(history)


def fit(system: str | None, history: Sequence[dict], render: Render, n_ctx: int, max_tokens: int) -> Fitted:
    """Drop the oldest user/assistant pairs of `history` (never the system prompt, never the last
    message) while prompt + max_tokens > n_ctx.

    Raises ConfigError when even the last message alone leaves no room for one generated token.
    `history` is not changed: the caller removes `dropped` messages from its own copy once it
    decides to go ahead, so a refused message costs the earlier turns nothing.
    """
    dropped = 0
    while True:
        kept = history[dropped:]
        prompt = render(messages(system, kept))
        # Fewer than 3 left: nothing can go without losing the message being answered.
        if len(prompt) + max_tokens <= n_ctx or len(kept) < 3:
            break
        dropped += 2   # pairs, so that roles keep alternating as chat templates require
    if not prompt_fits(len(prompt), n_ctx):
        raise ConfigError(f"message too long: the prompt is {len(prompt)} tokens and n_ctx is "
                          f"{n_ctx}; shorten it or restart with a larger --n-ctx")
    return Fitted(prompt, dropped)
