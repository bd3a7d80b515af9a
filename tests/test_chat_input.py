"""The chat's message box under keys that arrive together: a message typed with its Enter in one
burst (tmux send-keys "Say hi." Enter, expect, a text expander, a paste without bracketed paste),
and Up recall while the stored prompts arrive. Driven by Pilot on the scripted chat (no model)."""

from __future__ import annotations

import pytest

pytest.importorskip("textual")

from textual._xterm_parser import XTermParser  # noqa: E402

from localspec.chats.store import open_store  # noqa: E402
from localspec_tui.messages import PromptHistory  # noqa: E402
from tests.test_tui_support import ready, run, scripted_app, send, settled, wait_for  # noqa: E402

STORY = "Write a long story about a lighthouse keeper, with many details."
MOON = "Now tell me about the moon in exactly two short sentences, please."


def burst(app, data: str) -> None:
    """`data` as one read from the terminal: the driver's own parser makes the key events and the
    driver posts them all, before the app has handled any (what Pilot.press never does: it waits
    for the app to be idle after every key)."""
    for event in XTermParser().feed(data):
        app._driver.process_message(event)


async def replied(pilot, n: int) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: len(app.chat.history) == 2 * n and not app.busy and settled(app))
    await pilot.pause()


async def sent_or_kept(pilot, n: int, text: str) -> None:
    """Until message n is answered, or the box holds `text` and nothing was sent (an Enter lost)."""
    app = pilot.app
    await wait_for(pilot, lambda: (len(app.chat.history) == 2 * n and not app.busy and settled(app))
                   or (len(app.chat.history) < 2 * n - 1 and app.prompt_box.value == text))
    await pilot.pause()


def test_a_message_and_its_enter_in_one_read_are_sent(tmp_path):
    """The Enter was ignored: the box read empty when it came, and the text stayed in the box."""
    store = open_store(tmp_path / "h.sqlite3")

    async def scenario():
        app = scripted_app(store=store, replies=("Hi!",))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            burst(app, "Say hi.\r")
            await sent_or_kept(pilot, 1, "Say hi.")
            assert [m["content"] for m in app.chat.history[:1]] == ["Say hi."]
            assert app.prompt_box.value == ""
            return app.saver.conv

    conv = run(scenario())
    assert [m.content for m in store.get(conv).messages if m.role == "user"] == ["Say hi."]
    store.close()


def test_a_message_split_across_two_reads_is_sent_whole(tmp_path):
    """The Enter in the second read: the message was sent cut at the first read's end ("Write a
    long story about a light"), and the rest was gone, also from the history."""
    store = open_store(tmp_path / "h.sqlite3")

    async def scenario():
        app = scripted_app(store=store, replies=("Once.",))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            burst(app, STORY[:31])
            await wait_for(pilot, lambda: app.prompt_box.value == STORY[:31])
            burst(app, STORY[31:] + "\r")
            await sent_or_kept(pilot, 1, STORY)
            assert [m["content"] for m in app.chat.history[:1]] == [STORY]
            assert app.prompt_box.value == ""
            return app.saver.conv

    conv = run(scenario())
    assert [m.content for m in store.get(conv).messages if m.role == "user"] == [STORY]
    store.close()


def test_a_newline_and_text_after_the_enter_in_one_read_go_where_they_were_typed():
    """Ctrl+J (a line feed) is a newline where it was typed; text after the Enter is the start of
    the next message, left in the box."""
    async def scenario():
        app = scripted_app(replies=("Yes.",))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            box = app.prompt_box
            burst(app, "two\nlines\r" + MOON[:12])
            await sent_or_kept(pilot, 1, "two\nlines" + MOON[:12])
            assert [m["content"] for m in app.chat.history[:1]] == ["two\nlines"]
            await wait_for(pilot, lambda: box.value == MOON[:12])
            burst(app, MOON[12:] + "\r")
            await replied(pilot, 2)
            assert app.chat.history[2]["content"] == MOON and box.value == ""

    run(scenario())


def test_a_message_sent_while_a_reply_runs_stays_in_the_box():
    async def scenario():
        app = scripted_app(gate_after=2)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            box = app.prompt_box
            burst(app, "First.\r")
            await wait_for(pilot, lambda: app.chat.paused.is_set())
            burst(app, "Second.\r")   # refused: a reply is running
            await wait_for(pilot, lambda: box.value == "Second.")
            assert [m["content"] for m in app.chat.history] == ["First."]
            app.chat.gate.set()
            await wait_for(pilot, lambda: not app.busy)
            burst(app, "\r")
            await wait_for(pilot, lambda: len(app.chat.history) == 4 and not app.busy)
            assert app.chat.history[2]["content"] == "Second." and box.value == ""

    run(scenario())


def test_up_recall_stays_put_when_the_stored_prompts_arrive():
    async def scenario():
        app = scripted_app(replies=("Fine.",))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            box = app.prompt_box
            await send(pilot, "first here")
            await send(pilot, "second here")
            await pilot.press("up")
            assert box.value == "second here"
            # The store's prompts (read by a worker) arrive during the recall, older than all
            app.post_message(PromptHistory(["stored one", "stored two"]))
            await wait_for(pilot, lambda: len(box.prompts) == 4)
            assert box.value == "second here"
            await pilot.press("up")
            assert box.value == "first here"
            await pilot.press("up")
            assert box.value == "stored two"
            await pilot.press("down", "down", "down")
            assert box.value == ""   # back to the (empty) draft

    run(scenario())
