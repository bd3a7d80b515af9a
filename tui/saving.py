"""The chat's side of saved conversations (localspec.chats.store): what is stored, and when.

Every method here touches the SQLite file, so the app calls them on worker threads only: the
generation worker saves its own turn (the user's message, then the reply through a ReplyWriter),
and short thread workers list, open, delete and export. The store serialises them under its lock.
Saving never stops the chat: a store that fails turns itself off, and its one-line notice is shown
once (`take_notice`).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from localspec.chats import export
from localspec.chats.conversation import Conversation, Message, make_title
from localspec.chats.store import ReplyWriter, Store

RECENT_CONVERSATIONS = 20   # whose user messages Up/Down recall, besides this session's


def settings_of(chat) -> dict:
    """What a new conversation records: the model pair and the settings it started with."""
    session, sampling = chat.session, chat.sampling
    return {"target": str(session.target.path),
            "draft": None if session.draft is None else str(session.draft.path),
            "drafter": chat.drafter_kind, "k": "auto" if chat.k is None else chat.k,
            **sampling.record(), "max_tokens": chat.max_tokens}


def reply_stats(reply, chat, sampling, k) -> dict:
    """A finished reply's numbers, in the keys `localspec.chats.export.stats_line` reads (the rest is kept
    for JSON readers). α, tokens per target pass and `decode_tokens_per_second` are the reply's
    RunStats (localspec.decoding.stats: decode time only, as `generate` reports tokens/s);
    `tokens_per_second` counts from the start of the reply to its last token, prefill included
    (what a user waited; tools/chat_speed.py compares it with generate's)."""
    session, run = chat.session, reply.stats
    return {"n_tokens": run.n_tokens, "alpha": run.alpha, "tokens_per_pass": run.tokens_per_pass,
            "tokens_per_step": run.tokens_per_pass,   # the old name, kept one release
            "tokens_per_second": run.n_tokens / reply.seconds if reply.seconds > 0 else None,
            "decode_tokens_per_second": run.tokens_per_second,
            "seconds": round(reply.seconds, 3), "decode_seconds": round(run.seconds, 3), "finish": reply.finish,
            "n_prompt_tokens": reply.n_prompt, "cached_tokens": reply.cached,
            **({"continued": True} if reply.continued else {}),
            # steps that verified a draft tree, of all the reply's steps: only when one did
            **({"tree_steps": run.tree_steps, "n_steps": run.n_steps} if run.tree_steps else {}),
            "k": "auto" if k is None else k, "drafter": reply.drafter, **sampling.record(),
            "target": str(session.target.path),
            "draft": None if session.draft is None else str(session.draft.path)}


class Saver:
    """The open conversation in the store. `store` None: saving is off (`--no-save`)."""

    def __init__(self, store: Store | None, conv: int | None = None) -> None:
        self.store = store
        self.conv = conv
        """The stored conversation new turns go to; None until the first message (or after /reset)."""
        self.last_reply: int | None = None
        """The stored message of the reply `/continue` would extend (None: none, or not saved)."""
        self._shown: str | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.store is not None and not self.store.disabled

    def take_notice(self) -> str | None:
        """The store's notice if it has not been shown yet (each one once)."""
        notice = None if self.store is None else self.store.notice
        with self._lock:
            if notice is None or notice == self._shown:
                return None
            self._shown = notice
        return notice

    # ---- one turn (the generation worker) ----------------------------------------------------
    def add_user(self, text: str, settings: dict, system: str | None) -> int | None:
        """Store the user's message, starting the conversation on its first one."""
        if self.store is None:
            return None
        if self.conv is None:
            self.conv = self.store.new_conversation(settings, system)
        return self.store.add_message(self.conv, "user", text)

    def start_reply(self) -> ReplyWriter | None:
        writer = None if self.store is None or self.conv is None else self.store.start_reply(self.conv)
        self.last_reply = None if writer is None else writer.id
        return writer

    def continue_reply(self, text: str) -> ReplyWriter | None:
        """The last reply's message, to grow from `text` (what it holds, as the model sees it)."""
        if self.store is None or self.last_reply is None:
            return None
        return ReplyWriter(self.store, self.last_reply, text)

    def opened(self, conv: Conversation | None) -> None:
        """New turns go to `conv` (None: a new conversation), and `/continue` to its last reply."""
        saved = self.store is not None and conv is not None
        self.conv = conv.id if saved else None
        last = conv.messages[-1] if saved and conv.messages else None
        self.last_reply = last.id if last is not None and last.role == "assistant" else None

    def reply_failed(self, continued: bool, user_msg: int | None, writer: ReplyWriter | None) -> None:
        """A reply ended in an error: a continuation keeps what it wrote, as if stopped; a new turn
        is taken back."""
        if not continued:
            self.take_back(user_msg, writer)
        elif writer is not None:
            writer.finish(partial=True)

    def take_back(self, user_msg: int | None, writer: ReplyWriter | None) -> None:
        """The turn failed and the chat forgot it: so does the store."""
        self.last_reply = None
        if writer is not None:
            writer.discard()
        if self.store is not None:
            self.store.delete_message(user_msg)

    # ---- the conversation list, resuming, exporting (short workers) --------------------------
    def list(self, limit: int = 200):
        return [] if self.store is None else self.store.list_conversations(limit)

    def get(self, conv: int) -> Conversation | None:
        return None if self.store is None else self.store.get(conv)

    def delete(self, conv: int) -> bool:
        return self.store is not None and self.store.delete(conv)

    def recent_prompts(self, limit: int = RECENT_CONVERSATIONS) -> list[str]:
        """User messages of the most recent conversations, oldest first."""
        prompts: list[str] = []
        for summary in reversed(self.list(limit)):
            conv = self.get(summary.id)
            if conv is not None:
                prompts += [m.content for m in conv.messages if m.role == "user"]
        return prompts

    def conversation(self, history: list[dict], settings: dict, system: str | None) -> Conversation:
        """The open conversation as stored, or (not saved: `--no-save`, or saving failed) built
        from the chat's own history, without the numbers of its replies."""
        stored = self.get(self.conv) if self.conv is not None and self.enabled else None
        if stored is not None:
            return stored
        now = time.time()
        messages = tuple(Message(i, i, m["role"], m["content"], False, now, now, None)
                         for i, m in enumerate(history))
        first = next((m["content"] for m in history if m["role"] == "user"), "")
        return Conversation(0, make_title(first), now, now, settings, system, messages)


def write_export(conv: Conversation, fmt: str, path: str) -> str:
    """Write `conv` as Markdown or JSON; the notice line to show. Raises OSError."""
    text = export.to_json(conv) if fmt == "json" else export.to_markdown(conv)
    target = Path(path).expanduser()
    target.write_text(text, encoding="utf-8")
    return f"wrote {len(conv.messages)} messages as {'JSON' if fmt == 'json' else 'Markdown'} to {target}"
