"""Saved conversations in `localspec chat`, driven by Pilot on the scripted chat (no model):
saving with the numbers, partial replies (Esc, quitting, a kill), --no-save, --resume, /reset,
the conversation list, /export, and a store that fails."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localspec.chats import export
from localspec.chats.store import open_store
from localspec.decoding.stats import positions_tested
from tests.test_tui_support import (CODE_REPLY, PREFILL_SECONDS, STEP_SECONDS, long_reply, mid_reply, notices, ready,
                                    run, screen_text, script, scripted_app, send, type_and_send, wait_for)

from localspec_tui.conversations import ConversationList  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def expected_stats(text: str) -> dict:
    chunks = script(text)
    tested = sum(positions_tested(c.step.n_drafted, c.step.n_accepted) for c in chunks)
    seconds = sum(sum(STEP_SECONDS) if c.step.n_drafted else sum(STEP_SECONDS[1:]) for c in chunks)
    n_tokens = sum(len(c.tokens) for c in chunks)
    return {"n_tokens": n_tokens, "alpha": sum(c.step.n_accepted for c in chunks) / tested,
            "tokens_per_pass": n_tokens / len(chunks), "tokens_per_step": n_tokens / len(chunks), "decode_tokens_per_second": n_tokens / seconds,
            "tokens_per_second": n_tokens / (PREFILL_SECONDS + seconds)}


def test_every_turn_is_saved_with_its_numbers(store):
    async def scenario():
        app = scripted_app(store=store)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await send(pilot, "Write a function that adds two numbers.")
            await send(pilot, "Thanks!")
            return app.saver.conv, list(app.chat.history)

    conv_id, history = run(scenario())
    conv = store.get(conv_id)
    assert conv.history() == history and len(history) == 4
    assert not any(m.partial for m in conv.messages)
    assert conv.title == "Write a function that adds two numbers."
    assert conv.settings["target"].endswith("F32.gguf") and conv.settings["draft"].endswith("Q4_1.gguf")
    assert conv.settings["drafter"] == "auto" and conv.settings["k"] == "auto"
    stats = conv.messages[1].stats
    for key, value in expected_stats(CODE_REPLY).items():
        assert stats[key] == pytest.approx(value), key
    assert (stats["k"], stats["drafter"], stats["temperature"], stats["finish"]) == ("auto", "auto", 0.0, "stop")
    assert stats["target"] == conv.settings["target"] and stats["draft"] == conv.settings["draft"]
    assert "tokens/target pass" in export.to_markdown(conv)


def test_esc_keeps_the_reply_so_far_marked_partial(store):
    async def scenario():
        app = scripted_app(store=store, gate_after=12)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await mid_reply(pilot, "Write a function that adds two numbers.")
            shown = app.reply_view.text
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.busy)
            assert app.last_done.finish == "stopped"
            kept = app.chat.history[-1]["content"]
            assert kept.startswith(shown) and len(kept) < len(CODE_REPLY)
            await wait_for(pilot, lambda: app.query("ReplyView").last().settled)
            assert app.query("ReplyView").last().text == kept
            return app.saver.conv, kept

    conv_id, kept = run(scenario())
    last = store.get(conv_id).messages[-1]
    assert (last.role, last.content, last.partial) == ("assistant", kept, True)
    assert last.stats["finish"] == "stopped"


def test_quitting_mid_reply_saves_it_partial(store):
    async def scenario():
        app = scripted_app(store=store, gate_after=12)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await mid_reply(pilot, "Write a function that adds two numbers.")
            await pilot.press("ctrl+q")
        return app

    app = run(scenario())   # returns once the reply thread has ended too
    last = store.get(store.last_id()).messages[-1]
    assert last.role == "assistant" and last.partial and last.content
    assert CODE_REPLY.startswith(last.content) and last.content == app.chat.history[-1]["content"]


def test_a_lost_rpc_worker_keeps_the_reply_so_far(store, monkeypatch):
    """What the abort callback runs before its one line (engine.rpc): the reply so far is saved,
    marked partial, and the terminal given back."""
    from localspec.engine import rpc

    async def scenario():
        app = scripted_app(store=store, gate_after=12)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await mid_reply(pilot, "Write a function that adds two numbers.")
            left: list = []
            monkeypatch.setattr("localspec_tui.terminal.restore_terminal", lambda driver: left.append(True))
            assert len(rpc._hooks) == 1
            for hook in list(rpc._hooks):
                hook()
            last = store.get(app.saver.conv).messages[-1]
            assert left == [True]
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.busy)
            return last

    last = run(scenario())
    assert last.role == "assistant" and last.partial and last.content and CODE_REPLY.startswith(last.content)
    assert rpc._hooks == []   # the hook lives only while a reply is generated


def test_no_save_keeps_nothing(db):
    from localspec_tui.cli import open_history

    async def scenario():
        app = scripted_app(store=None)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await send(pilot, "Hello there.")
            assert app.saver.conv is None and len(app.chat.history) == 2
            await pilot.press("ctrl+o")
            await pilot.pause()
            assert not isinstance(app.screen, ConversationList)
            assert "saving is off" in screen_text(app)

    run(scenario())
    assert open_history(True, None) == (None, None)
    assert not db.exists()   # --no-save does not even create the file


def test_resume_shows_the_stored_conversation_and_continues_it(store):
    conv = store.new_conversation({"target": "/m/t.gguf"}, "Be brief.")
    store.add_message(conv, "user", "What is a lighthouse?")
    store.add_message(conv, "assistant", "A tower with a **light**.", stats={"n_tokens": 7, "alpha": 0.5})
    store.add_message(conv, "user", "never answered")   # the chat was killed before the reply began
    stored = store.get(conv)

    async def scenario():
        app = scripted_app(store=store, resume=stored)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            text = screen_text(app)
            assert "What is a lighthouse?" in text and "A tower with a light." in text   # Markdown
            assert "7 tokens · α 0.500" in text and "never answered" in text
            assert app.chat.history == stored.history()[:2] and app.chat.system == "Be brief."
            await send(pilot, "Who kept them?")
            # the whole history went into the prompt: the first turn's prefill refills the cache
            assert app.chat.messages()[:3] == [{"role": "system", "content": "Be brief."}] + stored.history()[:2]
            assert app.saver.conv == conv

    run(scenario())
    messages = store.get(conv).messages
    assert [m.content for m in messages][:4] == ["What is a lighthouse?", "A tower with a **light**.",
                                                 "never answered", "Who kept them?"]
    assert messages[4].role == "assistant" and messages[4].content == CODE_REPLY


def chat_cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec", "chat", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120, cwd=REPO)


def test_resume_with_a_bad_id_is_one_line_before_the_screen(store, db):
    store.add_message(store.new_conversation({}, None), "user", "hi")
    env = {"LOCALSPEC_HISTORY": str(db)}
    for args, needle in [(("--resume", "99"), "no conversation 99"), (("--resume", "x"), "got 'x'"),
                         (("7",), "--resume 7")]:
        r = chat_cli(*args, env=env)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, (args, r.stderr)
    # a good id passes on to the next check (this test has no terminal)
    r = chat_cli("--resume", env=env)
    assert r.returncode == 2 and "terminal" in r.stderr
    r = chat_cli("--resume", env={"LOCALSPEC_HISTORY": str(db.parent / "none.sqlite3")})
    assert r.returncode == 2 and "no saved conversation" in r.stderr
    assert not (db.parent / "none.sqlite3").exists()


def test_reset_starts_a_new_conversation(store):
    async def scenario():
        app = scripted_app(store=store)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await send(pilot, "First one.")
            first = app.saver.conv
            await type_and_send(pilot, "/reset")
            await pilot.pause()
            assert app.saver.conv is None and app.chat.history == []
            await send(pilot, "Second one.")
            return first, app.saver.conv

    first, second = run(scenario())
    assert first != second
    assert [store.get(c).title for c in (first, second)] == ["First one.", "Second one."]
    assert all(len(store.get(c).messages) == 2 for c in (first, second))


def test_the_conversation_list_opens_and_deletes(store):
    older = store.new_conversation({}, None)
    store.add_message(older, "user", "About lighthouses")
    store.add_message(older, "assistant", "They guide ships.")
    time.sleep(0.01)
    newer = store.new_conversation({}, None)
    store.add_message(newer, "user", "About dragons")
    store.add_message(newer, "assistant", "They hoard gold.")

    async def open_list(pilot) -> ConversationList:
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConversationList) and pilot.app.screen.loaded)
        await pilot.pause()
        return pilot.app.screen

    async def scenario():
        app = scripted_app(store=store)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            listing = await open_list(pilot)
            assert [s.id for s in listing.rows] == [newer, older]
            assert "About dragons" in screen_text(app) and "About lighthouses" in screen_text(app)
            await pilot.press("down", "enter")   # the older one
            await wait_for(pilot, lambda: app.saver.conv == older and "They guide ships." in screen_text(app))
            assert not isinstance(app.screen, ConversationList)
            assert app.chat.history == store.get(older).history()
            await send(pilot, "Tell me more.")   # continues the one opened
            assert len(store.get(older).messages) == 4

            listing = await open_list(pilot)
            assert [s.id for s in listing.rows] == [older, newer] and "●" in screen_text(app)
            await pilot.press("down", "d")      # the other one
            await wait_for(pilot, lambda: listing.loaded and len(listing.rows) == 1)
            assert store.get(newer) is None
            await pilot.press("delete")         # the open one: the chat starts over
            await wait_for(pilot, lambda: listing.loaded and not listing.rows)
            await wait_for(pilot, lambda: app.saver.conv is None and app.chat.history == [])
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, ConversationList)
            assert any("deleted conversation" in n for n in notices(app))
            assert "They guide ships." not in screen_text(app)

    run(scenario())
    assert store.list_conversations() == []


@pytest.mark.parametrize("saving", [True, False])
def test_export_writes_markdown_and_json(tmp_path, db, saving):
    store = open_store(db) if saving else None
    md, js = tmp_path / "out" / "c.md", tmp_path / "c.json"
    md.parent.mkdir()

    async def scenario():
        app = scripted_app(store=store)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await send(pilot, "Write a function that adds two numbers.")
            for command in (f"/export md {md}", f"/export json {js}", f"/export md {tmp_path}/no/such/dir/x.md",
                            "/export pdf x.pdf", "/export md"):
                await type_and_send(pilot, command)
                await pilot.pause()
            await wait_for(pilot, lambda: md.exists() and js.exists()
                           and any("could not export" in n for n in notices(app)))
            said = " | ".join(notices(app))
            assert "wrote 2 messages as Markdown" in said and "usage: /export md PATH" in said
            assert "Traceback" not in screen_text(app)

    run(scenario())
    if store is not None:
        store.close()
    body = md.read_text()
    assert body.startswith("# Write a function that adds two numbers.") and "def add(a: int" in body
    data = json.loads(js.read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][1]["content"] == CODE_REPLY
    # saved: the numbers come from the store; not saved: from memory, without them
    assert ("tokens/target pass" in body) == saving and (data["messages"][1]["stats"] is not None) == saving


def test_a_store_that_cannot_be_opened_is_one_notice_and_the_chat_goes_on(db):
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database" * 200)
    store = open_store(db)
    assert store.disabled

    async def scenario():
        app = scripted_app(store=store)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await send(pilot, "Hello?")
            await send(pilot, "Still there?")
            said = [n for n in notices(app) if "history not saved" in n]
            assert len(said) == 1 and "not a usable history database" in said[0]
            assert len(app.chat.history) == 4

    run(scenario())


def test_a_store_that_fails_mid_chat_says_so_once(store):
    async def scenario():
        app = scripted_app(store=store)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "Hello?")
            store._conn.close()   # as a disk that went away would: every later write fails
            await send(pilot, "Still there?")
            await send(pilot, "And now?")
            assert store.disabled and sum("history not saved" in n for n in notices(app)) == 1
            assert len(app.chat.history) == 6

    run(scenario())


CRASHING_CHAT = """
import asyncio, sys
from localspec.chats.store import open_store
from tests.test_tui_support import CODE_REPLY, long_reply, ready, scripted_app, send, type_and_send

async def main():
    store = open_store(sys.argv[1], flush_seconds=0.05)
    app = scripted_app(store=store, replies=(CODE_REPLY, long_reply(400)), delay=0.004)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "first question")
        await type_and_send(pilot, "second question")
        print("STREAMING", flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


def test_a_reply_cut_off_by_a_kill_survives_through_the_chat_path(db):
    """The app's own saving code (the generation worker and its ReplyWriter), killed mid-reply."""
    db.parent.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_CHAT, str(db)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        line = proc.stdout.readline()
        assert line.strip() == "STREAMING", proc.stderr.read() if proc.poll() is not None else line
        deadline = time.monotonic() + 60
        while len(set(seen)) < 3:   # two throttled writes of the reply after its empty start
            assert time.monotonic() < deadline and proc.poll() is None, "no partial write seen"
            c = sqlite3.connect(db)
            try:
                row = c.execute("SELECT content FROM messages WHERE ordinal = 3").fetchone()
            finally:
                c.close()
            if row is not None:
                seen.append(row[0])
            time.sleep(0.02)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    s = open_store(db)
    conv = s.get(s.last_id())
    assert [(m.role, m.partial) for m in conv.messages] == [
        ("user", False), ("assistant", False), ("user", False), ("assistant", True)]
    assert [m.content for m in conv.messages[:3]] == ["first question", CODE_REPLY, "second question"]
    assert conv.messages[1].stats["n_tokens"] == expected_stats(CODE_REPLY)["n_tokens"]
    partial = conv.messages[3].content
    assert long_reply(400).startswith(partial) and len(partial) >= len(seen[-1]) > 0
    s.close()
