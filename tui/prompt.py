"""The message box: several lines, Enter sends, and earlier prompts come back with Up and Down.

A newline is Ctrl+J in every terminal (it sends a line feed, Enter a carriage return). Shift+Enter
and Alt+Enter insert one too where the terminal reports them apart from Enter (terminals speaking
the kitty keyboard protocol, which Textual turns on: kitty, WezTerm, foot, Ghostty, recent
Alacritty, iTerm2 with "report keys using CSI u"); elsewhere they arrive as a plain Enter and send.
A paste keeps its newlines (bracketed paste).

Enter and the newline keys are handled in the box's own `_on_key`, not by priority bindings: the
app runs a priority binding the moment the key reaches it, while the characters before it still
wait in the box's message queue, so a burst ("Say hi.\r" from tmux send-keys, expect, a text
expander, a paste without bracketed paste) was sent empty or cut. Here the key is handled after
the characters typed before it, and the box is emptied at once, so that characters after it in the
same burst stay for the next message.
"""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")
HISTORY_LIMIT = 500
TYPING_KEYS = ((NEWLINE_KEYS, "new line (Shift/Alt+Enter in terminals that tell them from Enter)"),
               (("up", "down"), "earlier prompts, from the first / last line"))
"""Keys the box handles in `_on_key` and TextArea's cursor actions, not bindings: for /help."""


class ChatInput(TextArea):
    """A TextArea that sends on Enter and recalls earlier prompts, as shells do: Up on the first
    line goes back, Down on the last line goes forward, past the newest back to the unsent draft."""

    DEFAULT_CSS = """
    ChatInput { height: auto; min-height: 3; max-height: 10; }
    """
    # For the footer (and a click on it): the keys themselves are taken by `_on_key`, in order.
    BINDINGS = [Binding("enter", "submit", "Send", show=True, tooltip="send the message")]

    class Submitted(Message):
        def __init__(self, input: "ChatInput", value: str) -> None:
            super().__init__()
            self.input = input
            self.value = value

        @property
        def control(self) -> "ChatInput":
            return self.input

    def __init__(self, *, placeholder: str = "", id: str | None = None, disabled: bool = False) -> None:
        super().__init__(id=id, disabled=disabled, placeholder=placeholder, soft_wrap=True,
                         tab_behavior="focus", highlight_cursor_line=False)
        self.prompts: list[str] = []
        """Earlier prompts, oldest first: the store's recent ones, then this session's."""
        self._index: int | None = None   # into history while recalling; None: editing the draft
        self._draft = ""

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    # ---- keys --------------------------------------------------------------------------------
    def action_submit(self) -> None:
        """Send what the box holds, and empty it (`give_back` returns a message the app refused)."""
        text = self.text
        if text.strip():
            self.value = ""
        self.post_message(self.Submitted(self, text))

    def give_back(self, text: str) -> None:
        """A message the app did not take (a reply is running): back in the box, before anything
        typed since."""
        self.value = text + self.text

    def action_newline(self) -> None:
        self.insert("\n")

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter" or event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()   # TextArea would insert a newline for Enter
            if event.key == "enter":
                self.action_submit()
            else:
                self.action_newline()
            return
        await super()._on_key(event)

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self._visual_row() == 0 and self.recall(-1):
            return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        if not select and self._visual_row() == self.wrapped_document.height - 1 and self.recall(+1):
            return
        super().action_cursor_down(select)

    def _visual_row(self) -> int:
        """The cursor's line on screen (a long line wraps into several)."""
        return self.wrapped_document.location_to_offset(self.cursor_location).y

    # ---- history -----------------------------------------------------------------------------
    def remember(self, text: str) -> None:
        """A sent prompt joins the history (not twice in a row), and recalling starts over."""
        if text.strip() and (not self.prompts or self.prompts[-1] != text):
            self.prompts.append(text)
            del self.prompts[:-HISTORY_LIMIT]
        self._index = None

    def add_older(self, prompts: list[str]) -> None:
        """Prompts older than all those held (the store's, read while the chat runs), oldest first.
        A recall in progress stays on the prompt it shows: its index moves with the insertion."""
        older = prompts[max(0, len(prompts) - (HISTORY_LIMIT - len(self.prompts))):] \
            if len(self.prompts) < HISTORY_LIMIT else []
        self.prompts[:0] = older
        if self._index is not None:
            self._index += len(older)

    def recall(self, step: int) -> bool:
        """Show the previous (-1) or next (+1) prompt; False when there is none that way."""
        index = len(self.prompts) if self._index is None else self._index
        new = index + step
        if new < 0 or new > len(self.prompts) or (self._index is None and step > 0):
            return False
        if self._index is None:
            self._draft = self.text
        self._index = None if new == len(self.prompts) else new
        self.value = self._draft if self._index is None else self.prompts[new]
        return True
