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
    """The models are loaded; `session` is a localspec.session.Session."""

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
    n_tokens: int
    seconds: float
    alpha: float | None
    """Accepted / tested draft positions over the reply (localspec.stats); None without drafts."""
    n_steps: int = 0
    """Target passes."""


@dataclass
class ReplyFailed(Message):
    """Generation raised; `error` is one line for the user. The turn was taken back."""

    turn: int
    error: str


@dataclass
class Notice(Message):
    """A line for the conversation: kind "info" or "warning"."""

    text: str
    kind: str = "info"


@dataclass
class Opened(Message):
    """A stored conversation, read by a worker, to show and continue (a localspec.history.Conversation)."""

    conversation: Any


@dataclass
class PromptHistory(Message):
    """User messages of recent stored conversations, oldest first, for Up/Down in the prompt."""

    prompts: list
