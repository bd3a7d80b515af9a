"""The list of saved conversations (Ctrl+O): Enter opens one, Delete or d deletes one, Esc closes.

The store is read and written by thread workers of this screen; what they find comes back as
messages, applied on the UI thread. Opening is the app's business: the screen dismisses itself
with the chosen id.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from localspec.chats.conversation import short_title
from localspec.chats.export import local_time


@dataclass
class Listed(Message):
    rows: list   # localspec.chats.store.Summary, newest first


@dataclass
class Deleted(Message):
    """Posted to the app, which starts over when the open conversation went."""

    conv: int
    ok: bool


def row(summary, current: int | None) -> Text:
    text = Text()
    text.append("● " if summary.id == current else "  ", style="bold")
    text.append(f"{summary.id:>4}  ", style="dim")
    text.append(f"{local_time(summary.updated)}  ", style="dim")
    text.append(f"{summary.n_messages:>3} msg  ", style="dim")
    text.append(short_title(summary.title) or "(untitled)")
    if summary.partial:
        text.append("  partial", style="italic dim")
    return text


class ConversationList(ModalScreen):
    """Dismissed with the id to open, or None."""

    DEFAULT_CSS = """
    ConversationList { align: center middle; }
    ConversationList > Vertical { width: 90%; max-width: 110; height: 80%; border: round $primary;
                                  background: $surface; padding: 0 1; }
    ConversationList OptionList { height: 1fr; border: none; }
    ConversationList .hint { color: $text-muted; height: 1; }
    """
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("delete,d", "delete", "Delete"),
    ]

    def __init__(self, saver, current: int | None) -> None:
        super().__init__()
        self.saver = saver
        self.current = current
        self.rows: list = []
        self.loaded = False   # the first listing arrived (tests wait for it)

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "saved conversations"
            yield OptionList(id="conversations")
            yield Label("Enter open · Delete/d delete · Esc close", classes="hint")

    def on_mount(self) -> None:
        self.load()

    @work(thread=True, exclusive=True, group="list")
    def load(self) -> None:
        self.post_message(Listed(self.saver.list()))

    @work(thread=True, group="delete")
    def delete_conversation(self, conv: int) -> None:
        # To the app, which lists again if this screen is still open: the screen may be gone.
        self.app.post_message(Deleted(conv, self.saver.delete(conv)))

    def on_listed(self, message: Listed) -> None:
        options = self.query_one(OptionList)
        keep = options.highlighted
        self.rows = message.rows
        options.clear_options()
        if not self.rows:
            options.add_option(Option(Text("no saved conversations yet", style="dim"), disabled=True))
        else:
            options.add_options([Option(row(s, self.current), id=str(s.id)) for s in self.rows])
            options.highlighted = min(keep or 0, len(self.rows) - 1)
        options.focus()
        self.loaded = True

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.dismiss(int(event.option.id))

    def action_delete(self) -> None:
        options = self.query_one(OptionList)
        if options.highlighted is None or not self.rows:
            return
        option = options.get_option_at_index(options.highlighted)
        if option.id is not None:
            self.loaded = False
            self.delete_conversation(int(option.id))
