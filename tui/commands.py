"""Slash commands, copying, and the saved conversations as the chat shows them.

`Commands` is a part of ChatApp kept apart so that the app module stays about the screen and the
generation. Reading or writing the store always happens in a thread worker (`tui.saving`); what
comes back is a message handled here, on the UI thread.
"""

from __future__ import annotations

import re

from rich.text import Text
from textual import work
from textual.widgets import Static

from localspec.export import stats_line

from .conversations import ConversationList, Deleted
from .messages import Notice, Opened, PromptHistory
from .reply import ReplyView
from .saving import write_export
from .widgets import MessageRow

HELP = ("Enter sends · Ctrl+J newline · Up/Down earlier prompts · Esc stops a reply · F5 Markdown/draft "
        "tokens · Ctrl+O saved conversations · Ctrl+R copy reply · Ctrl+G copy code · "
        "/reset · /export md|json PATH · /copy · /copy code · /help")
COMMANDS = ("/reset", "/export", "/copy", "/help")
FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")


def code_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of a Markdown text, in order; one still open at the end (a reply
    being written) counts up to the end."""
    blocks: list[str] = []
    fence: str | None = None
    lines: list[str] = []
    for line in markdown.splitlines():
        if fence is None:
            m = FENCE.fullmatch(line)
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):   # ``` with a ` after is inline code
                fence, lines = m.group(1), []
        elif (m := FENCE.fullmatch(line)) and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not m.group(2).strip():
            blocks.append("\n".join(lines))
            fence = None
        else:
            lines.append(line)
    if fence is not None:
        blocks.append("\n".join(lines))
    return blocks


def parse(text: str) -> tuple[str, list[str]] | None:
    """(command, arguments) for a known command, else None (the text is a message)."""
    head, _, rest = text.strip().partition(" ")
    if head not in COMMANDS:
        return None
    if head == "/export":
        fmt, _, path = rest.strip().partition(" ")
        return head, [a for a in (fmt, path.strip()) if a]
    return head, rest.split()


def answered(history: list[dict]) -> list[dict]:
    """The history without user messages left unanswered (a crash before the reply began, or a
    failed turn): some chat templates refuse two user messages in a row."""
    return [m for i, m in enumerate(history)
            if m["role"] != "user" or (i + 1 < len(history) and history[i + 1]["role"] == "assistant")]


def stored_note(message) -> str:
    note = stats_line(message.stats)
    if message.partial:
        note = f"{note} · partial" if note else "partial: stopped before it finished"
    return note


class Commands:
    """Mixed into ChatApp (which has saver, chat, busy, view_mode, add_notice, add_row, ...)."""

    # ---- slash commands ----------------------------------------------------------------------
    def run_command(self, text: str) -> bool:
        """Run `text` if it is a command; whether it was one (a message otherwise)."""
        parsed = parse(text)
        if parsed is None:
            if text.startswith("/") and " " not in text.strip():
                self.add_notice(f"unknown command {text.strip()}; /help lists them", "warning")
                return True
            return False
        name, args = parsed
        if name == "/reset":
            self.reset_conversation()
        elif name == "/help":
            self.add_notice(HELP)
        elif name == "/copy":
            if args not in ([], ["code"]):
                self.add_notice("usage: /copy (the last reply) or /copy code (the last code block)", "warning")
            else:
                self.copy(code=bool(args))
        elif name == "/export":
            if len(args) != 2 or args[0] not in ("md", "json"):
                self.add_notice("usage: /export md PATH or /export json PATH", "warning")
            elif self.chat is not None:
                self.export(args[0], args[1], list(self.chat.history), self.chat.system)
        return True

    # ---- copying -----------------------------------------------------------------------------
    def action_copy_reply(self) -> None:
        self.copy(code=False)

    def action_copy_code(self) -> None:
        self.copy(code=True)

    def copy(self, code: bool) -> None:
        """The last reply, or the last code block of the replies, to the clipboard (OSC 52)."""
        replies = [view.text for view in self.query(ReplyView) if view.text]
        if code:
            found = next((blocks[-1] for text in reversed(replies) if (blocks := code_blocks(text))), None)
            what, empty = "code block", "no code block in the replies yet"
        else:
            found = replies[-1] if replies else None
            what, empty = "reply", "no reply to copy yet"
        if found is None:
            self.add_notice(empty, "warning")
            return
        self.copy_to_clipboard(found)
        self.add_notice(f"copied {len(found)} characters (the last {what})")

    # ---- exporting ---------------------------------------------------------------------------
    @work(thread=True, group="store")
    def export(self, fmt: str, path: str, history: list, system: str | None) -> None:
        from .saving import settings_of

        try:
            conv = self.saver.conversation(history, settings_of(self.chat), system)
            self.post_message(Notice(write_export(conv, fmt, path)))
        except OSError as e:
            self.post_message(Notice(f"could not export to {path}: {e.strerror or e}", "warning"))

    # ---- the saved conversations -------------------------------------------------------------
    @work(thread=True, group="store")
    def load_prompt_history(self) -> None:
        self.post_message(PromptHistory(self.saver.recent_prompts()))

    def on_prompt_history(self, message: PromptHistory) -> None:
        self.prompt_box.add_older(message.prompts)   # before this session's, which are newer

    def action_conversations(self) -> None:
        if self.saver.store is None:
            self.add_notice("saving is off (--no-save): there are no saved conversations to list", "warning")
            return
        if isinstance(self.screen, ConversationList):
            return
        self.push_screen(ConversationList(self.saver, self.saver.conv), self.open_conversation)

    def open_conversation(self, conv: int | None) -> None:
        if conv is None:
            return
        if self.busy:
            self.add_notice("a reply is still running; Esc stops it, then open the conversation", "warning")
            return
        self.read_conversation(conv)

    @work(thread=True, group="store")
    def read_conversation(self, conv: int) -> None:
        found = self.saver.get(conv)
        if found is None:
            self.post_message(Notice(f"conversation {conv} is gone", "warning"))
        else:
            self.post_message(Opened(found))

    def on_opened(self, message: Opened) -> None:
        if self.busy:   # a message was sent while the conversation was being read
            self.add_notice("a reply is still running; open the conversation again when it ends", "warning")
            return
        self.show_conversation(message.conversation)

    def show_conversation(self, conv) -> None:
        """Replace what is on screen by a stored conversation, and continue it."""
        self.resume = conv
        self.saver.conv = conv.id if self.saver.store is not None else None
        self.query_one("#conversation").remove_children()
        for m in conv.messages:
            if m.role == "user":
                self.add_row(MessageRow("you", Static(Text(m.content)), user=True))
            else:
                self.add_row(MessageRow(self.assistant_label(), ReplyView(self.view_mode, m.content, stored_note(m))))
        self.add_notice(f"conversation {conv.id} · {len(conv.messages)} messages · "
                        f"{conv.title or '(untitled)'} — new messages continue it")
        if self.chat is not None:
            self.continue_conversation(conv)

    def continue_conversation(self, conv) -> None:
        # The KV cache needs nothing here: the next turn's prompt is the whole history, and its
        # prefill evaluates whatever part of it the cache does not hold yet.
        self.chat.reset()
        self.chat.history = answered(conv.history())
        self.chat.system = conv.system

    def on_deleted(self, message: Deleted) -> None:
        if isinstance(self.screen, ConversationList):
            self.screen.load()
        if not message.ok:
            self.add_notice(f"could not delete conversation {message.conv}", "warning")
        elif message.conv == self.saver.conv:
            self.reset_conversation()
            self.add_notice(f"deleted conversation {message.conv}, the one that was open")
        else:
            self.add_notice(f"deleted conversation {message.conv}")
