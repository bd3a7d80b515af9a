"""Messages the worker threads post to the app (Textual's `post_message` is thread-safe).

Workers never touch widgets; everything they report arrives here and is applied on the UI thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message


@dataclass
class LoadProgress(Message):
    """A line of loading progress (which file, fetching, making the F32 copy, ...)."""

    text: str


@dataclass
class Loaded(Message):
    """The models are loaded; `session` is a localspec.loading.session.Session."""

    session: Any


@dataclass
class LoadFailed(Message):
    """Loading failed; `error` is one line for the user."""

    error: str


@dataclass
class PromptReady(Message):
    """The prompt of a new turn was built; `dropped` old messages were cut to fit n_ctx."""

    turn: int
    dropped: int
    n_prompt: int
    cached: int
    base: str | None = None
    """Continuing the last reply: its text as the model sees it (tui.chat.Turn.base)."""


@dataclass
class ReplyChunk(Message):
    """Tokens one target pass added to the reply: ((text, who proposed it), ...), who being
    "model" or "lookup" (an accepted draft token) or "target"."""

    turn: int
    pieces: tuple[tuple[str, str], ...]


@dataclass
class ReplyDone(Message):
    """The reply ended: finish is "stop", "length", "context" or "stopped" (Esc)."""

    turn: int
    finish: str
    stats: dict | None
    """Its numbers as saved (tui.saving.reply_stats), which the note under it shows; None for a
    continuation that added nothing (the reply keeps its numbers)."""

    @property
    def n_tokens(self) -> int:
        return self.stats["n_tokens"] if self.stats else 0

    @property
    def alpha(self) -> float | None:
        """Accepted / tested draft positions over the reply (localspec.decoding.stats); None without drafts."""
        return self.stats["alpha"] if self.stats else None


@dataclass
class ReplyFailed(Message):
    """Generation raised; `error` is one line for the user. A new turn was taken back; a
    continuation keeps what it wrote (`continued`)."""

    turn: int
    error: str
    continued: bool = False


@dataclass
class Notice(Message):
    """A line for the conversation: kind "info" or "warning"."""

    text: str
    kind: str = "info"


@dataclass
class Opened(Message):
    """A stored conversation, read by a worker, to show and continue (a localspec.chats.store.Conversation)."""

    conversation: Any


@dataclass
class PromptHistory(Message):
    """User messages of recent stored conversations, oldest first, for Up/Down in the prompt."""

    prompts: list
