"""A conversation as the model sees it: the system prompt, then the user/assistant history, cut
from the oldest end until the prompt and the reply fit the context.

Pure: the chat template comes in as a function (`Model.chat_prompt`), so the terminal chat, a
server and the tests share one rule for what is dropped without loading a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .config import ConfigError

Render = Callable[[list[dict]], list[int]]
"""Messages -> prompt tokens through the GGUF's chat template (`Model.chat_prompt`)."""


@dataclass(frozen=True)
class Fitted:
    """A history cut to fit the context, and its prompt."""

    prompt: list[int]
    """Prompt tokens of the system prompt + the kept history."""
    dropped: int
    """Oldest history messages left out (always even: a user message and its reply go together)."""


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
    if len(prompt) >= n_ctx - 1:
        raise ConfigError(f"message too long: the prompt is {len(prompt)} tokens and n_ctx is "
                          f"{n_ctx}; shorten it or restart with a larger --n-ctx")
    return Fitted(prompt, dropped)
