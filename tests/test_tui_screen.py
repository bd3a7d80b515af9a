"""The chat screen on the scripted chat (no model): Markdown and the draft-token view (F5), work per
chunk that does not grow with the reply, copying, the multi-line message box and its history,
and the full width at 80 columns."""

from __future__ import annotations

import base64

import pytest
from textual import events
from textual.widget import Widget
from textual.widgets import Static

from localspec.chats.store import open_store
from localspec_tui.commands import code_blocks, parse
from localspec_tui.reply import BLOCK_LINES, DRAFT_STYLE, ReplyView
from localspec_tui.widgets import MessageRow
from tests.test_tui_support import (CODE_REPLY, long_reply, notices, ready, run, screen_text, script,
                                    scripted_app, send, settled, type_and_send, wait_for)

CODE = 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n    return a + b\n\n\nprint(add(2, 3))'


# ---- Markdown and the draft-token view --------------------------------------------------------
def test_replies_are_markdown_and_f5_shows_the_draft_tokens():
    async def scenario():
        app = scripted_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "Write a function that adds two numbers.")
            view = app.query_one(ReplyView)
            assert view.markdown.display and not view.tokens.display
            assert view.markdown.query("MarkdownFence")   # the code block is a highlighted block
            text = screen_text(app)
            assert "def add(a: int, b: int) -> int:" in text and "```" not in text and "**5**" not in text
            assert "Markdown  F5 draft tokens" in text

            await pilot.press("f5")
            await wait_for(pilot, lambda: settled(app))
            await pilot.pause()
            assert app.view_mode == "tokens" and view.tokens.display and not view.markdown.display
            text = screen_text(app)
            assert "```python" in text and "**5**" in text and "model draft  lookup draft  target" in text
            await pilot.press("f5")
            await wait_for(pilot, lambda: settled(app))
            assert app.view_mode == "markdown" and view.markdown.display

    run(scenario())


def test_the_token_view_colours_accepted_draft_tokens_and_wraps_as_one_text():
    async def scenario():
        app = scripted_app(view_mode="tokens")
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "Write a function that adds two numbers.")
            tokens = app.query_one(ReplyView).tokens
            blocks = [b for b in tokens.children if isinstance(b, Static)]
            assert len(blocks) >= 2   # frozen blocks and the tail
            texts = [b.styled for b in blocks]
            assert "\n".join(t.plain for t in texts) == CODE_REPLY   # block boundaries are newlines
            drafted = "".join(t.plain[s.start:s.end] for t in texts for s in t.spans if s.style == DRAFT_STYLE)
            model = "".join(p for c in script(CODE_REPLY) for p, kind in c.pieces if kind == "model")
            assert drafted.replace("\n", "") == model.replace("\n", "") != ""

    run(scenario())


# ---- constant work per chunk ------------------------------------------------------------------
class WholeText(Static):
    """The old way: the whole reply drawn again for every chunk (the measure must catch it)."""

    def __init__(self) -> None:
        super().__init__("")
        self.parts: list[str] = []
        self.flushes = 0

    def add(self, pieces) -> None:
        self.parts += [p for p, _ in pieces]
        self.update("".join(self.parts))
        self.flushes += 1

    @property
    def settled(self) -> bool:
        return True


def work_per_chunk(monkeypatch, make_view, text: str) -> list[int]:
    """Lines of text Textual rendered inside the reply's widget for each chunk, the chunks fed one
    at a time and each drawn before the next. (Containers are left out: what they render is their
    blank background, again when a block is added to one, not text to lay out.)"""
    counted: list[int] = [0]
    original = Widget._render_content

    def counting(self) -> None:
        original(self)
        node = self
        while node is not None and node is not view:
            node = node.parent
        if node is view and not self.is_container:
            counted[0] += len(self._render_cache.lines)

    monkeypatch.setattr(Widget, "_render_content", counting)
    per_chunk: list[int] = []

    async def scenario():
        app = scripted_app()
        async with app.run_test(size=(100, 40)) as pilot:
            await ready(pilot)
            app.add_row(MessageRow("smol", view))
            await pilot.pause()
            for chunk in script(text):
                counted[0] = 0
                view.add(chunk.pieces)
                if isinstance(view, ReplyView):
                    view.finish()
                await wait_for(pilot, lambda: view.settled)
                await pilot.pause()
                per_chunk.append(counted[0])

    view = make_view()
    run(scenario())
    return per_chunk


@pytest.mark.parametrize("make_view", [lambda: ReplyView("markdown"), lambda: ReplyView("tokens"), WholeText],
                         ids=["markdown", "tokens", "whole-text (the old way)"])
def test_work_per_chunk_does_not_grow_with_the_reply(monkeypatch, make_view):
    per_chunk = work_per_chunk(monkeypatch, make_view, long_reply(20))
    n = len(per_chunk) // 10
    early, late = per_chunk[n:2 * n], per_chunk[-n:]   # the second tenth (the screen is full) and the last
    old_way = make_view is WholeText
    # Drawing is bounded by a block (a paragraph, a code block, BLOCK_LINES lines), not the reply.
    assert (sum(late) > 3 * sum(early)) == old_way, (early, late)
    if not old_way:
        assert max(late) <= 2 * max(early) + BLOCK_LINES


def test_chunks_arriving_together_are_drawn_together():
    async def scenario():
        app = scripted_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            view = ReplyView("markdown")
            app.add_row(MessageRow("smol", view))
            await pilot.pause()
            chunks = script(long_reply(20))
            for chunk in chunks:   # hundreds of chunks in one go, as a fast model's would come
                view.add(chunk.pieces)
            await wait_for(pilot, lambda: view.settled)
            assert view.flushes <= 3 and view.markdown.source == long_reply(20)
            assert len(chunks) > 100

    run(scenario())


# ---- copying ----------------------------------------------------------------------------------
def test_copy_the_last_reply_and_the_last_code_block():
    async def scenario():
        app = scripted_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await type_and_send(pilot, "/copy")
            await pilot.pause()
            assert notices(app)[-1] == "no reply to copy yet"
            written: list[str] = []
            write = app._driver.write
            app._driver.write = lambda data: (written.append(data), write(data))[1]
            await send(pilot, "Write a function that adds two numbers.")
            await pilot.press("ctrl+r")
            assert app.clipboard == CODE_REPLY
            osc = "\x1b]52;c;" + base64.b64encode(CODE_REPLY.encode()).decode() + "\a"
            assert osc in written                       # what the terminal receives (OSC 52)
            assert notices(app)[-1] == f"copied {len(CODE_REPLY)} characters (the last reply)"
            await pilot.press("ctrl+g")
            assert app.clipboard == CODE and notices(app)[-1] == f"copied {len(CODE)} characters (the last code block)"
            app.copy_to_clipboard("")
            await type_and_send(pilot, "/copy")
            await pilot.pause()
            assert app.clipboard == CODE_REPLY
            await type_and_send(pilot, "/copy code")
            await pilot.pause()
            assert app.clipboard == CODE
            await type_and_send(pilot, "/copy everything")
            await pilot.pause()
            assert notices(app)[-1].startswith("usage: /copy")
            await type_and_send(pilot, "/help")
            await pilot.pause()
            assert "/export md|json PATH" in notices(app)[-1] and "Ctrl+G copy the last code block" in notices(app)[-1]
            assert len(app.chat.history) == 2   # commands are not messages

    run(scenario())


# ---- issue 20: mistyped commands are refused, /help lists every key ------------------------------
def test_a_mistyped_command_is_refused_not_sent_and_a_double_slash_sends_one():
    async def scenario():
        app = scripted_app(replies=("Fine.",))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            for typo in ("/exprt md x.md", "/nope", "/Reset now"):
                await type_and_send(pilot, typo)
                await pilot.pause()
                said = notices(app)[-1]
                assert said.startswith(f"unknown command {typo.split()[0]} (not sent)"), said
                assert all(name in said for name in ("/continue", "/reset", "/export", "/copy", "/help"))
            assert app.chat.history == [] and app.saver.conv is None   # nothing went to the model
            await send(pilot, "//exprt is a typo of /export")
            await send(pilot, "/usr/bin is a folder")   # a path, not a command's name
            assert [m["content"] for m in app.chat.history if m["role"] == "user"] == [
                "/exprt is a typo of /export", "/usr/bin is a folder"]
            await type_and_send(pilot, "/help")
            await pilot.pause()
            assert "//text sends /text" in notices(app)[-1]

    run(scenario())


def test_help_names_every_key_binding():
    from localspec_tui.app import ChatApp
    from localspec_tui.commands import key_name
    from localspec_tui.prompt import ChatInput

    async def scenario():
        app = scripted_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await type_and_send(pilot, "/help")
            await pilot.pause()
            return notices(app)[-1]

    shown = run(scenario())
    bindings = [*ChatApp.BINDINGS, *ChatInput.BINDINGS]
    missing = [b.key for b in bindings if f"{key_name(b.key)} {b.tooltip or b.description}" not in shown]
    assert not missing, shown
    for key in ("Esc ", "F2 ", "F3 ", "F4 ", "F5 ", "Ctrl+O ", "Ctrl+R ", "Ctrl+G ", "Ctrl+Q ", "Enter ", "Ctrl+J/",
                "Up/Down "):
        assert key in shown, key
    assert key_name("ctrl+q") == "Ctrl+Q" and key_name("delete,d") == "Delete/D" and key_name("escape") == "Esc"


def test_code_blocks_and_commands_parse():
    text = "a\n```py\nx = 1\n```\n\n~~~\ny\n~~~~\n````\nnested ``` inside\n````\n``` inline ``` no\n```\nopen"
    assert code_blocks(text) == ["x = 1", "y", "nested ``` inside", "open"]
    assert code_blocks("no code") == []
    assert parse("/export md my notes.md") == ("/export", ["md", "my notes.md"])
    assert parse("/copy code") == ("/copy", ["code"]) and parse("/reset") == ("/reset", [])
    assert parse("/usr/bin is a path") is None and parse("hello") is None and parse("//reset") is None
    assert parse("/exprt md x.md") == ("/exprt", ["md", "x.md"]) and parse("  /help\n") == ("/help", [])


# ---- the message box --------------------------------------------------------------------------
def test_the_message_box_takes_several_lines_and_recalls_earlier_prompts(tmp_path):
    store = open_store(tmp_path / "h.sqlite3")
    old = store.new_conversation({}, None)
    store.add_message(old, "user", "an old question")

    async def scenario():
        app = scripted_app(store=store)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            box = app.prompt_box
            await wait_for(pilot, lambda: box.prompts == ["an old question"])
            await pilot.press("h", "i", "ctrl+j", "y", "o", "shift+enter", "alt+enter")
            app.post_message(events.Paste("pasted\nlines"))   # as the driver delivers a paste
            await pilot.pause()
            assert box.value == "hi\nyo\n\npasted\nlines"
            await pilot.press("enter")
            await wait_for(pilot, lambda: not app.busy and app.last_done is not None and settled(app))
            sent = "hi\nyo\n\npasted\nlines"
            assert app.chat.history[0]["content"] == sent and box.value == ""
            assert store.get(app.saver.conv).messages[0].content == sent

            await pilot.press("h", "e", "y")      # a draft, kept while recalling
            await pilot.press("up")               # first line: back to the last prompt
            assert box.value == sent and box.cursor_location == (4, 5)
            await pilot.press("up")               # inside the recalled text: the cursor moves
            assert box.value == sent and box.cursor_location[0] == 3
            await pilot.press("up", "up", "up", "up")
            assert box.value == "an old question"  # from the store's earlier conversation
            await pilot.press("up")
            assert box.value == "an old question"  # nothing older
            await pilot.press("down")
            assert box.value == sent
            box.move_cursor(box.document.end)
            await pilot.press("down")
            assert box.value == "hey"              # the draft, as it was left

    run(scenario())
    store.close()


# ---- 80 columns -------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [80, 120])
def test_at_80_columns_the_label_goes_above_and_replies_take_the_full_width(width):
    async def scenario():
        app = scripted_app()
        async with app.run_test(size=(width, 30)) as pilot:
            await ready(pilot)
            await send(pilot, "Write a function that adds two numbers.")
            row = app.query(MessageRow).last()
            label, body = row.query_one(".who"), row.body
            conversation = app.query_one("#conversation")
            if width < 100:
                assert label.region.y < body.region.y and body.region.x == label.region.x
                # the whole width inside the border and padding, but for the scrollbar's column
                assert body.region.width >= conversation.content_region.width - 1
            else:
                assert label.region.y == body.region.y and body.region.x >= label.region.right

    run(scenario())
