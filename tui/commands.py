"""Slash commands (/continue, /reset, /export, /copy, /help), copying, and the saved conversations
as the chat shows them.

`Commands` is a part of ChatApp kept apart so that the app module stays about the screen and the
generation. Reading or writing the store always happens in a thread worker (`tui.saving`); what
comes back is a message handled here, on the UI thread.
"""

from __future__ import annotations

import re

from rich.text import Text
from textual import work
from textual.widgets import Static

from localspec.chats.conversation import short_title
from localspec.chats.export import stats_line

from .conversations import ConversationList, Deleted
from .messages import Notice, Opened, PromptHistory
from .prompt import TYPING_KEYS, ChatInput
from .reply import ReplyView
from .saving import write_export
from .widgets import MessageRow, speaker

COMMANDS = (
    ("/continue", "go on with the last reply from where it ended (a cap, Esc, a full context)"),
    ("/reset", "start a new conversation (this one stays saved)"),
    ("/export md|json PATH", "write this conversation to a file"),
    ("/copy [code]", "copy the last reply [its last code block]"),
    ("/help", "this list"),
)
NAMES = tuple(usage.split()[0] for usage, _ in COMMANDS)
# A text whose first word is "/name" is a command, known or not (a mistyped one is refused, never
# sent); "//" at the start sends the rest from its second "/" as a message. "/usr/bin …" is no
# command: a command's name is letters, digits, "-" and "_".
COMMAND = re.compile(r"(/[A-Za-z][\w-]*)(?:\s+(.*))?", re.DOTALL)
KEY_NAMES = {"escape": "Esc", "enter": "Enter", "delete": "Delete", "up": "Up", "down": "Down"}
FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")


def key_name(keys: str) -> str:
    """A binding's keys as /help and the README write them: "ctrl+r" → "Ctrl+R", "escape" → "Esc"."""
    return "/".join("+".join(KEY_NAMES.get(part, part.capitalize()) for part in key.split("+"))
                    for key in keys.split(","))


def help_text(bindings, typing_keys) -> str:
    """/help, made from the bindings themselves so that it cannot drift from them: every binding's
    keys and what it does (its tooltip, else its footer label), and the commands.
    `typing_keys`: ((keys, what they do), ...) the message box handles itself (tui.prompt)."""
    keys = [(key_name(b.key), b.tooltip or b.description) for b in bindings]
    keys += [(key_name(",".join(k)), does) for k, does in typing_keys]
    commands = [f"{usage} {does}" for usage, does in COMMANDS] + ["//text sends /text as a message"]
    return "keys: " + " · ".join(f"{k} {does}" for k, does in keys) + "\ncommands: " + " · ".join(commands)


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
    """(command, arguments) for a text shaped as a command (first word "/name"), known or not;
    None for a message."""
    m = COMMAND.fullmatch(text.strip())
    if m is None:
        return None
    head, rest = m.group(1), m.group(2) or ""
    if head == "/export":
        fmt, _, path = rest.strip().partition(" ")
        return head, [a for a in (fmt, path.strip()) if a]
    return head, rest.split()


def as_message(text: str) -> str:
    """What a text that is no command sends: "//…" sends "/…"."""
    return text[1:] if text.startswith("//") else text


def answered(history: list[dict]) -> list[dict]:
    """The history without user messages left unanswered (a crash before the reply began, or a
    failed turn): some chat templates refuse two user messages in a row."""
    return [m for i, m in enumerate(history)
            if m["role"] != "user" or (i + 1 < len(history) and history[i + 1]["role"] == "assistant")]


def reply_note(stats, partial: bool) -> str:
    """The line under a reply, one form live and resumed: its numbers (`stats_line`), and
    "partial" for a reply unfinished other than by Esc (a crash: no numbers, or a failure)."""
    stats = stats if isinstance(stats, dict) else None   # a hand-edited file may hold anything
    note = stats_line(stats)
    if partial and (stats or {}).get("finish") != "stopped":
        note = f"{note} · partial" if note else "partial: cut off before it finished"
    return note


class Commands:
    """Mixed into ChatApp (which has saver, chat, busy, view_mode, reply_view, last_reply, BINDINGS,
    add_notice, add_row, start_generating, ...)."""

    # ---- slash commands ----------------------------------------------------------------------
    def run_command(self, text: str) -> bool:
        """Run `text` if it is a command; whether it was one (a message otherwise)."""
        parsed = parse(text)
        if parsed is None:
            return False
        name, args = parsed
        if name not in NAMES:
            self.add_notice(f"unknown command {name} (not sent); the commands are {', '.join(NAMES)}; "
                            f"//text sends /text as a message", "warning")
        elif name == "/reset":
            self.reset_conversation()
        elif name == "/continue":
            self.continue_reply()
        elif name == "/help":
            self.add_notice(help_text([*ChatInput.BINDINGS, *self.BINDINGS], TYPING_KEYS))
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

    def continue_reply(self) -> None:
        """/continue: the last reply goes on from its end, in its own view and stored message."""
        if self.busy:
            self.add_notice("a reply is still running; Esc stops it, then /continue", "warning")
        elif self.last_reply is None or not self.chat.history or self.chat.history[-1]["role"] != "assistant":
            self.add_notice("nothing to continue: /continue goes on with the last reply, and there is none", "warning")
        else:
            self.reply_view = self.last_reply
            self.reply_view.continuing()   # not the last part's numbers under a growing reply
            self.start_generating(None)

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
        self.saver.opened(conv)
        self.query_one("#conversation").remove_children()
        self.last_reply = None
        for m in conv.messages:
            if m.role == "user":
                self.add_row(MessageRow("you", Static(Text(m.content)), user=True))
                self.last_reply = None
            else:
                # labelled by the model that wrote it, as it was live (`speaker`)
                stats = m.stats if isinstance(m.stats, dict) else {}
                self.last_reply = ReplyView(self.view_mode, m.content, reply_note(m.stats, m.partial))
                self.add_row(MessageRow(speaker(stats.get("target") or conv.settings.get("target")), self.last_reply))
        self.add_notice(f"conversation {conv.id} · {len(conv.messages)} messages · "
                        f"{short_title(conv.title) or '(untitled)'} — new messages continue it")
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
