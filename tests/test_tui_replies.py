"""Replies in `localspec chat` (issue 20), on the scripted chat (no model): a reply runs until the
model stops (no 256-token cap), `/continue` grows the reply that hit its cap, one speaker label and
one note format live and resumed, and the panel's numbers are localspec.stats' own, labelled."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from localspec.decoding.stats import RunStats
from localspec_tui.reply import ReplyView
from localspec_tui.widgets import MessageRow
from tests.test_tui_support import (CODE_REPLY, PREFILL_SECONDS, ROLES, STEP_SECONDS, TURN_END, TURN_START, mid_reply,
                                    notices, ready, run, screen_text, script, scripted_app, send, tokenize,
                                    type_and_send, wait_for)

STORY = " ".join(f"Day {i}: the keeper climbed the stairs and lit the lamp." for i in range(100)) + "\nThe end.\n"


async def command(pilot, text: str) -> None:
    """Send a command that starts a reply (/continue) and wait until that reply is done and drawn."""
    app = pilot.app
    before = app.last_done
    await type_and_send(pilot, text)
    await wait_for(pilot, lambda: not app.busy and app.last_done is not before
                   and all(v.settled for v in app.query(ReplyView)))
    await pilot.pause()


# ---- item 1: no cap unless asked -------------------------------------------------------------
def test_a_1000_token_story_finishes_without_a_cap():
    assert len(tokenize(STORY)) > 1000

    async def scenario():
        app = scripted_app(replies=(STORY,))   # the chat's own defaults
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await send(pilot, "Write a 1,000-word story about a lighthouse keeper.")
            assert app.chat.max_tokens is None
            assert app.last_done.finish == "stop" and app.last_done.n_tokens == len(tokenize(STORY))
            assert app.chat.history[-1]["content"] == STORY
            note = app.query(ReplyView).last().note
            assert "max tokens" not in note and not any("max-tokens" in n for n in notices(app))

    run(scenario())


def test_with_no_cap_old_turns_make_room_for_a_long_reply_which_may_run_past_it():
    from localspec.chats import conversation
    from tests.test_tui_support import GREEDY, FakeSession, ScriptedChat

    assert conversation.reply_room(4096, None) == conversation.REPLY_ROOM == 1024
    assert conversation.reply_room(1000, None) == 500 and conversation.reply_room(4096, 64) == 64
    chat = ScriptedChat(FakeSession(), sampling=GREEDY, replies=(STORY,))
    n_ctx, target = chat.session.target.n_ctx, chat.session.target
    turn_text = " ".join(["lighthouse"] * 300)   # 300 tokens of FakeModel's template
    for i in range(5):
        chat.history += [{"role": "user", "content": f"{i} {turn_text}"}, {"role": "assistant", "content": turn_text}]
    turn = chat.prepare("Now a long story.")
    assert turn.dropped and len(turn.prompt) + conversation.REPLY_ROOM <= n_ctx   # the reply starts with its room
    last_dropped = [{"role": "user", "content": f"{turn.dropped // 2 - 1} {turn_text}"},
                    {"role": "assistant", "content": turn_text}]
    assert len(target.chat_prompt(last_dropped + chat.history)) + conversation.REPLY_ROOM > n_ctx   # no more went
    reply = chat.reply(turn, lambda chunk: None)
    assert reply.finish == "stop" and reply.n_tokens > conversation.REPLY_ROOM   # past the room, to its end


def test_max_tokens_still_caps_a_reply_and_says_how_to_go_on():
    async def scenario():
        app = scripted_app(replies=(STORY,), max_tokens=50)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await send(pilot, "A story, please.")
            assert app.last_done.finish == "length" and app.last_done.n_tokens == 50
            assert "max tokens" in app.query(ReplyView).last().note
            assert notices(app)[-1] == "the reply reached --max-tokens 50; /continue goes on"

    run(scenario())


def test_the_chat_command_has_no_cap_by_default(monkeypatch):
    from localspec.cli.app import app as cli_app

    # Rich sizes help from a terminal on stdin/stdout/stderr, else COLUMNS, else 80 columns, where
    # the box border falls inside "default: no cap"; terminal_width is Click's only.
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(cli_app, ["chat", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--max-tokens" in text and "default: no cap" in text and "256" not in text


# ---- item 2: /continue -------------------------------------------------------------------------
def test_continue_grows_the_capped_reply_in_place_and_in_the_store(store):
    async def scenario():
        app = scripted_app(store=store, max_tokens=20)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await send(pilot, "Write a function that adds two numbers.")
            capped = app.chat.history[-1]["content"]
            assert app.last_done.finish == "length" and CODE_REPLY.startswith(capped) and capped != CODE_REPLY
            view = app.query(ReplyView).last()
            app.chat.max_tokens = None
            await command(pilot, "/continue")
            assert app.last_done.finish == "stop" and app.last_done.stats["continued"] is True
            assert app.query(ReplyView).last() is view and len(app.query(ReplyView)) == 1   # the same reply grew
            assert view.text == CODE_REPLY and view.note.startswith("continued: ")
            assert app.chat.history == [{"role": "user", "content": "Write a function that adds two numbers."},
                                        {"role": "assistant", "content": CODE_REPLY}]
            # the prompt was the conversation with the reply's turn left open: no end-of-turn after it
            target, prompt = app.chat.session.target, app.chat.prompts[-1]
            closed = target.chat_prompt(app.chat.messages()[:1] + [{"role": "assistant", "content": capped}])
            assert closed[-3:] == [TURN_END, TURN_START, ROLES["assistant"]] and prompt == closed[:-3]
            await command(pilot, "/continue")   # a finished reply: the model ends it again at once
            assert app.chat.history[-1]["content"] == CODE_REPLY and app.last_done.stats is None
            assert notices(app)[-1] == "nothing added: the model ends the reply there"
            assert view.note.startswith("continued: ") and "70 tokens" not in view.note   # its numbers stay
            return app.saver.conv

    conv = store.get(run(scenario()))
    assert [(m.role, m.content, m.partial) for m in conv.messages] == [
        ("user", "Write a function that adds two numbers.", False), ("assistant", CODE_REPLY, False)]
    assert conv.messages[1].stats["continued"] is True


def test_continue_after_esc_and_after_resume(store):
    async def stop_mid_reply():
        app = scripted_app(store=store, gate_after=5)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await mid_reply(pilot, "Write a function that adds two numbers.")
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.busy)
            assert app.last_done.finish == "stopped"
            return app.saver.conv

    conv = run(stop_mid_reply())
    assert store.list_conversations()[0].partial and store.get(conv).messages[-1].partial

    async def resume_and_continue():
        app = scripted_app(store=store, resume=store.get(conv), gate_after=3)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            view = app.query(ReplyView).last()
            before = view.note
            await mid_reply(pilot, "/continue")
            # while it grows, not the stopped part's numbers under it
            assert "20 tokens" in before and view.note == "…", (before, view.note)
            app.chat.gate.set()
            await wait_for(pilot, lambda: not app.busy and all(v.settled for v in app.query(ReplyView)))
            assert app.query(ReplyView).last().text == CODE_REPLY and len(app.query(ReplyView)) == 1
            assert view.note.startswith("continued: ")

    run(resume_and_continue())
    messages = store.get(conv).messages
    assert [(m.role, m.partial) for m in messages] == [("user", False), ("assistant", False)]
    assert messages[1].content == CODE_REPLY and not store.list_conversations()[0].partial


def test_a_reply_that_filled_the_context_continues_only_when_older_turns_can_go():
    async def scenario():
        app = scripted_app(replies=(STORY, "Hello.", STORY))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            app.chat.session.target.n_ctx = 300
            await send(pilot, "Tell a story.")   # the story: it runs to the end of the context
            assert app.last_done.finish == "context"
            assert notices(app)[-1] == "the context is full: /reset starts over (or restart with a larger --n-ctx)"
            before = list(app.chat.history)
            await type_and_send(pilot, "/continue")
            await wait_for(pilot, lambda: not app.busy and notices(app)[-1].startswith("error: cannot continue"))
            assert "fill the context (n_ctx 300)" in notices(app)[-1] and app.chat.history == before

            await type_and_send(pilot, "/reset")
            await pilot.pause()
            await send(pilot, "Hi.")               # "Hello."
            await send(pilot, "Now a story.")      # fills the context again, with an older turn before it
            assert app.last_done.finish == "context" and notices(app)[-1].endswith("/continue goes on, the oldest "
                                                                                     "turns dropped")
            story = app.chat.history[-1]["content"]
            await command(pilot, "/continue")
            assert any(n.startswith("context full: dropped the 2 oldest messages") for n in notices(app))
            grown = app.chat.history[-1]["content"]
            assert grown.startswith(story) and len(grown) > len(story) and STORY.startswith(grown)
            assert len(app.chat.history) == 2

    run(scenario())


def test_continue_with_nothing_to_continue_says_so():
    async def scenario():
        app = scripted_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await type_and_send(pilot, "/continue")
            await pilot.pause()
            assert notices(app)[-1].startswith("nothing to continue") and not app.busy
            assert app.chat.history == []

    run(scenario())


# ---- item 4: one speaker label and one note, live and resumed ---------------------------------
def test_a_reply_reads_the_same_live_and_after_resume(store):
    def shown(app) -> tuple[str, str]:
        row = app.query(MessageRow).last()
        return str(row.query_one(".who").render()), row.body.note

    async def live():
        app = scripted_app(store=store, max_tokens=30)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await send(pilot, "Write a function that adds two numbers.")
            return app.saver.conv, shown(app)

    conv, now = run(live())

    async def resumed():
        app = scripted_app(store=store, resume=store.get(conv))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            return shown(app)

    assert now[0] == "smollm" and run(resumed()) == now
    assert "30 tokens" in now[1] and "max tokens" in now[1] and "tokens/s decode" in now[1]


# ---- items 8 and 9: the panel's numbers, labelled, from localspec.decoding.stats -----------------------
def test_panel_and_note_speeds_are_labelled_and_each_has_one_definition():
    async def scenario():
        app = scripted_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "Write a function that adds two numbers.")
            app.refresh_panel()
            await pilot.pause()
            return screen_text(app), app.query(ReplyView).last().note, app.chat.live.view()

    text, note, view = run(scenario())
    chunks = script(CODE_REPLY)
    window = RunStats()
    for chunk in chunks[-32:]:
        window.add(chunk.step)
    assert view["tps"] == pytest.approx(window.tokens_per_second)
    assert re.search(rf"decode tok/s\s+{window.tokens_per_second:.1f}", text)
    n_tokens = sum(len(c.tokens) for c in chunks)
    decode = sum(sum(STEP_SECONDS) if c.step.n_drafted else sum(STEP_SECONDS[1:]) for c in chunks)
    assert f"{n_tokens / decode:.1f} tokens/s decode ({n_tokens / (PREFILL_SECONDS + decode):.1f} with prefill)" in note


def test_plain_decoding_reads_one_token_per_pass_in_the_panel_and_the_note():
    async def scenario():
        app = scripted_app(replies=("Fine, thank you for asking. And you?",), final_pass=True)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await pilot.press("f2")   # speculation off: one token per target pass
            await send(pilot, "How are you?")
            app.refresh_panel()
            await pilot.pause()
            return screen_text(app), app.query(ReplyView).last().note, app.chat.live.view()

    text, note, view = run(scenario())
    # the last pass emitted only the end-of-generation token: no pass of the output
    assert view["tokens_per_pass"] == 1.0 and re.search(r"tokens/pass\s+1\.00", text)
    assert "1.00 tokens/target pass" in note
