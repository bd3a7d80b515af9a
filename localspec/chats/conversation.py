"""A conversation: as it is stored (`Message`, `Conversation`, `Summary`: what `localspec.chats.store`
reads back), and as the model sees it: the system prompt, then the user/assistant history, cut
from the oldest end until the prompt and the reply fit the context.

Pure: the chat template comes in as a function (`Model.chat_prompt`), so the terminal chat, a
server and the tests share one rule for what is dropped without loading a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from localspec.config import ConfigError
from localspec.tokens import prompt_fits

TITLE_CHARS = 60
"""How much of a title a table or a list shows (`short_title`); the title itself is kept whole."""
REPLY_ROOM = 1024
"""Tokens kept free for a reply that has no cap (`reply_room`): about 750 English words, a long
answer or a page of code. Past it the reply may still run on until the context is full; older
turns are dropped only so that every reply starts with at least this much room."""


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
    """The first non-empty line of the first user message, whole (`short_title` shortens it for a list)."""
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
    """Its last message is a reply that did not finish. (The flag belongs to that reply: once the
    conversation goes on after it, or the reply is continued to its end, the conversation is not
    partial, though the stopped reply stays marked in its messages.)"""


def make_title(text: str) -> str:
    """A conversation's title: the first non-empty line of `text`, its whitespace collapsed."""
    return " ".join(next((s for s in text.splitlines() if s.strip()), "").split())


def short_title(title: str, width: int = TITLE_CHARS) -> str:
    """A title as a table or a list shows it: at most `width` characters, "…" marking a cut."""
    return title if len(title) <= width else title[: width - 1].rstrip() + "…"


class PromptTooLong(ConfigError):
    """The last message alone (with the system prompt) leaves no room for a token (`fit`)."""


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


def reply_room(n_ctx: int, max_tokens: int | None) -> int:
    """The room `fit` keeps for a reply: its cap, or with none REPLY_ROOM (half of a smaller
    context, so that a short context still holds some history)."""
    return max_tokens if max_tokens is not None else min(REPLY_ROOM, n_ctx // 2)


def fit(system: str | None, history: Sequence[dict], render: Render, n_ctx: int, max_tokens: int) -> Fitted:
    """Drop the oldest user/assistant pairs of `history` (never the system prompt, never the last
    message) while prompt + max_tokens > n_ctx (`max_tokens`: the room to keep, `reply_room`).

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
        raise PromptTooLong(f"message too long: the prompt is {len(prompt)} tokens and n_ctx is "
                            f"{n_ctx}; shorten it or restart with a larger --n-ctx")
    return Fitted(prompt, dropped)


def open_turn(render: Render, messages: Sequence[dict]) -> list[int]:
    """The prompt that continues `messages`' last one, an assistant reply: the template's rendering
    with that reply's turn left open (cut after its content, before whatever the template writes
    after it: its end-of-turn marker, the next turn's generation prompt).

    The tokens after the content are found as what two renderings, with the content followed by
    one of two marks that end in different characters, have in common with the plain one at the
    end. The token just before them differs in at least one of the two (a token ends in one
    character), so the shorter common end is exactly the template's. Only the public `render`
    is needed, and the contents stay literal as `render` keeps them."""
    *head, last = messages
    if last.get("role") != "assistant":
        raise ValueError("open_turn continues an assistant message")
    whole = render(list(messages))
    ends = []
    for mark in ("qzq", "qzx"):
        marked = render([*head, {**last, "content": last["content"] + mark}])
        if marked == whole:   # the template leaves the reply out: there is no turn to continue
            raise ConfigError("this model's chat template does not show the last reply; it cannot be continued")
        ends.append(_common_end(whole, marked))
    return whole[: len(whole) - min(ends)]


def seen_content(render: Render, messages: Sequence[dict]) -> str:
    """The last message's content as the template passes it on: without its trailing whitespace
    when the template trims it (Gemma's `| trim`), so that a continuation appended to it is what
    the model saw."""
    *head, last = messages
    content = last["content"]
    bare = content.rstrip()
    if bare != content and render([*head, {**last, "content": bare}]) == render(list(messages)):
        return bare
    return content


def _common_end(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n
