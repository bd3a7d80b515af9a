"""A reply on screen: rendered Markdown, or its tokens coloured by who proposed them (F5 switches).

The work per chunk does not grow with the reply. A chunk only extends `ReplyView.pieces`; the
visible form catches up at most every FLUSH_SECONDS, with the new text only:
- Markdown: `Markdown.append`, which parses again from the start of the last block only. Textual
  keeps a widget per block, so blocks before it are neither parsed nor rendered again;
- tokens: only the lines after the last frozen block live in a Static that is updated; once it
  holds BLOCK_LINES lines they move into a Static of their own that never changes again.
So a flush costs the new text plus the block being written (a paragraph, a code block) — never the
whole reply — and a costly flush (a long block) delays the next one in proportion (UI_SHARE). The hidden form is not kept up to date while it is hidden: F5 catches it up once,
from where it stopped.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.timer import Timer
from textual.widgets import Markdown, Static

DRAFT_STYLE = "bold #5fd7ff"     # accepted tokens of the draft model; the target's own stay plain
LOOKUP_STYLE = "bold #ffaf5f"    # accepted tokens of prompt lookup
STYLES = {"model": DRAFT_STYLE, "lookup": LOOKUP_STYLE}
MODES = ("markdown", "tokens")
FLUSH_SECONDS = 0.05
UI_SHARE = 0.2   # a flush that took t seconds is followed by at least t / UI_SHARE without one
BLOCK_LINES = 8


def styled(pieces) -> Text:
    text = Text()
    for piece, kind in pieces:
        text.append(piece, style=STYLES.get(kind, ""))
    return text


class Block(Static):
    """Some lines of a TokenText; `styled` is what it shows."""

    def __init__(self, styled: Text) -> None:
        super().__init__(styled)
        self.styled = styled

    def show(self, styled: Text) -> None:
        self.styled = styled
        self.update(styled)


class TokenText(Vertical):
    """Text coloured per token, split into blocks at newlines so that only the last block is ever
    redrawn. Hard line breaks end a block, so the blocks together wrap exactly as one Text would."""

    DEFAULT_CSS = """
    TokenText { height: auto; }
    TokenText > Block { height: auto; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._tail: list[tuple[str, str]] = []   # the pieces after the last frozen block
        self._tail_lines = 0                      # newlines among them
        self._tail_view = Block(Text())

    def compose(self) -> ComposeResult:
        yield self._tail_view

    def append(self, pieces) -> None:
        for piece, kind in pieces:
            if piece:
                self._tail.append((piece, kind))
                self._tail_lines += piece.count("\n")
        if self._tail_lines >= BLOCK_LINES:
            self._freeze()
        self._tail_view.show(styled(self._tail))

    def _freeze(self) -> None:
        """Move everything before the tail's last newline into a block of its own."""
        i = max(j for j, (piece, _) in enumerate(self._tail) if "\n" in piece)
        piece, kind = self._tail[i]
        cut = piece.rindex("\n")
        head = self._tail[:i] + [(piece[:cut], kind)]   # the newline itself is the block boundary
        self._tail = [(piece[cut + 1:], kind)] * (cut + 1 < len(piece)) + self._tail[i + 1:]
        self._tail_lines = 0
        self.mount(Block(styled(head)), before=self._tail_view)


class ReplyView(Vertical):
    """An assistant reply, streamed in by `add` on the UI thread, with a note line under it."""

    DEFAULT_CSS = """
    ReplyView { height: auto; }
    ReplyView > Markdown { padding: 0; margin: 0; }
    ReplyView > Markdown > MarkdownBlock:last-child { margin-bottom: 0; }
    ReplyView > .note { height: auto; color: $text-muted; text-style: italic; }
    """

    def __init__(self, mode: str = "markdown", text: str | None = None, note: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        assert mode in MODES, mode
        self.mode = mode
        self.pieces: list[tuple[str, str]] = [(text, "")] if text else []
        """(text, who proposed it) per token: "model", "lookup", "target", or "" for a stored reply."""
        self.note = note
        self.markdown = Markdown()
        self.tokens = TokenText()
        self.note_line = Static(Text(note or "…"), classes="note")
        self.flushes = 0   # how many times the visible form caught up (the tests count them)
        self._drawn = {m: 0 for m in MODES}   # pieces each form shows
        self._timer: Timer | bool | None = None   # True: a flush is queued to run next
        self._flushing = False
        self._mounted = False
        self._last = 0.0
        self._gap = FLUSH_SECONDS
        self._kept_note: str | None = None   # while continuing: the note to restore if nothing comes

    def compose(self) -> ComposeResult:
        yield self.markdown
        yield self.tokens
        yield self.note_line

    def on_mount(self) -> None:
        self._mounted = True
        self._show()
        self._schedule()

    @property
    def text(self) -> str:
        return "".join(piece for piece, _ in self.pieces)

    @property
    def settled(self) -> bool:
        """Everything added so far is on screen (in the visible form)."""
        return self._mounted and not self._flushing and self._timer is None \
            and self._drawn[self.mode] == len(self.pieces)

    # ---- called by the app -----------------------------------------------------------------------
    def add(self, pieces) -> None:
        self.pieces.extend(pieces)
        self._schedule()

    def cut(self, n_chars: int) -> None:
        """Keep the first `n_chars` characters (a reply continued from less than it shows: the
        trailing whitespace a chat template trims). Only what is still to be drawn changes; what
        is drawn already was whitespace, which neither form shows apart from a trailing line."""
        kept, n = [], 0
        for piece, kind in self.pieces:
            if n + len(piece) > n_chars:
                piece = piece[: n_chars - n]
            if piece:
                kept.append((piece, kind))
            n += len(piece)
        self.pieces = kept
        self._drawn = {m: min(d, len(kept)) for m, d in self._drawn.items()}

    def set_mode(self, mode: str) -> None:
        assert mode in MODES, mode
        self.mode = mode
        self._show()
        self._schedule(now=True)

    def continuing(self) -> None:
        """/continue: the note under the reply said how its last part went; while it grows it says
        "…", and gets its old words back if the reply ends with nothing added (or fails)."""
        kept = self.note
        self.set_note("…")
        self._kept_note = kept

    def set_note(self, note: str) -> None:
        self._kept_note = None
        self.note = note
        self.note_line.update(Text(note))
        self._show()

    def finish(self) -> None:
        """The reply ended: show the rest now rather than at the next tick."""
        if self._kept_note is not None:
            self.set_note(self._kept_note)
        self._schedule(now=True)

    # ---- drawing -----------------------------------------------------------------------------
    def _show(self) -> None:
        self.markdown.display = self.mode == "markdown"
        self.tokens.display = self.mode == "tokens"
        # "…" while nothing has come yet, then the note once there is one
        self.note_line.display = bool(self.note) or not self.pieces

    def _schedule(self, now: bool = False) -> None:
        if not self._mounted or self._flushing or self._drawn[self.mode] == len(self.pieces):
            return
        if self._timer is not None:
            if not now or self._timer is True:
                return   # a flush is coming; it takes this chunk too
            self._timer.stop()
        delay = 0.0 if now else self._last + self._gap - time.monotonic()
        if delay > 0:   # (a timer of 0 seconds never fires)
            self._timer = self.set_timer(delay, self._due)
        else:
            self._due()

    def _due(self) -> None:
        # The flush runs as a message of this widget, not inside the timer's task: stopping a
        # timer cancels its task, which must never interrupt a Markdown append half way.
        self._timer = True
        self.call_later(self._flush)

    async def _flush(self) -> None:
        self._timer = None
        if self._flushing:
            return
        self._flushing = True
        began = time.monotonic()
        try:
            mode = self.mode
            start, end = self._drawn[mode], len(self.pieces)
            new = self.pieces[start:end]
            self._drawn[mode] = end
            self.flushes += 1
            if mode == "tokens":
                self.tokens.append(new)
            else:
                await self.markdown.append("".join(piece for piece, _ in new))
        finally:
            self._flushing = False
            self._last = time.monotonic()
            # One block can grow long (a paragraph without breaks, a long code block) and Markdown
            # parses and renders it whole at each flush: spacing flushes by their cost keeps the UI
            # thread to a fifth of the time, so it cannot starve the reply's worker of the GIL.
            self._gap = max(FLUSH_SECONDS, (self._last - began) / UI_SHARE)
        self._show()
        self._schedule()   # what came in while Markdown was parsing
