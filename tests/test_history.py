"""Saved conversations (localspec.chats.store, export, cli_history) and fitting a history to the context
(localspec.chats.conversation). No model is loaded: everything here runs in a second or two."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from localspec import tokens
from localspec.chats import conversation, export, store as history
from localspec.config import ConfigError
from localspec.chats.conversation import make_title, short_title
from localspec.chats.store import BUSY_TIMEOUT_MS, MAX_ID, MIGRATIONS, RETRY_DELAYS, ReplyWriter, Store, StoreError, _migrate, default_path, open_store

REPO = Path(__file__).resolve().parent.parent
STATS = {"n_tokens": 12, "alpha": 0.75, "tokens_per_step": 2.4, "tokens_per_second": 41.5, "k": "auto",
         "drafter": "auto", "temperature": 0.7, "target": "/m/t.gguf"}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Ticks:
    """A wall clock that moves one second per reading: rows written one after another are ordered
    whatever the real clock's resolution (Windows: ~15 ms)."""

    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


class Pauses:
    """A `sleep` that records the pauses asked for, and can run `then` on the first one."""

    def __init__(self, then=None) -> None:
        self.asked: list[float] = []
        self.then = then

    def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        if self.then is not None and len(self.asked) == 1:
            self.then()


class Locker(threading.Thread):
    """Another process's writer: holds the write lock of `path` from its own connection until
    `release` is set, then sets `released`."""

    def __init__(self, path: Path, mode: str = "IMMEDIATE") -> None:
        super().__init__(daemon=True)
        self.path, self.mode = path, mode
        self.held, self.release, self.released = threading.Event(), threading.Event(), threading.Event()

    def run(self) -> None:
        c = sqlite3.connect(self.path, isolation_level=None)
        try:
            c.execute(f"BEGIN {self.mode}")
            self.held.set()
            self.release.wait()
            c.execute("ROLLBACK")
        finally:
            c.close()
            self.released.set()

    def __enter__(self) -> "Locker":
        self.start()
        assert self.held.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.join(30)

    def let_go(self) -> None:
        """Release the lock and wait until it is released (from the store's pause)."""
        self.release.set()
        assert self.released.wait(30)


def raw(path: Path, sql: str, *args) -> list[tuple]:
    """Read the file as another process would: a connection of its own."""
    c = sqlite3.connect(path)
    try:
        return c.execute(sql, args).fetchall()
    finally:
        c.close()


def two_turns(s: Store) -> int:
    conv = s.new_conversation({"target": "/m/target.gguf", "draft": "/m/draft.gguf", "k": "auto"}, "Be brief.")
    s.add_message(conv, "user", "  \n Tell me   about\tlighthouses \nand more")
    s.add_message(conv, "assistant", "They guide ships.", stats=STATS)
    s.add_message(conv, "user", "Who kept them?")
    s.add_message(conv, "assistant", "Keepers.", stats={"n_tokens": 3})
    return conv


# ---- the store --------------------------------------------------------------------------------
def test_round_trip(store):
    conv = two_turns(store)
    got = store.get(conv)
    assert got.id == conv and got.system == "Be brief."
    assert got.settings == {"target": "/m/target.gguf", "draft": "/m/draft.gguf", "k": "auto"}
    assert [(m.ordinal, m.role, m.partial) for m in got.messages] == [
        (0, "user", False), (1, "assistant", False), (2, "user", False), (3, "assistant", False)]
    assert got.messages[0].content == "  \n Tell me   about\tlighthouses \nand more"   # stored as given
    assert got.messages[1].stats == STATS and got.messages[0].stats is None
    assert got.title == "Tell me about lighthouses"   # first non-empty line of the first user message
    assert got.history()[1] == {"role": "assistant", "content": "They guide ships."}
    assert got.created <= got.updated and got.updated >= got.messages[-1].created
    assert store.get(conv + 1) is None


def test_titles():
    assert make_title("word " * 40) == ("word " * 40).strip()   # whole: only lists shorten it
    assert short_title(make_title("word " * 40)) == ("word " * 12).strip()[:59].rstrip() + "…"
    assert len(short_title("x" * 100)) == 60 and short_title("x" * 60) == "x" * 60
    assert make_title("\n\n  short  one \nsecond") == "short one"
    assert make_title("") == ""


# ---- issue 20: full titles, and [partial] belongs to the last reply ----------------------------
LONG_TITLE = "Tell me everything about the lighthouses of the Breton coast, their keepers and their lamps"


def test_the_full_title_is_kept_in_storage_json_and_export_and_shortened_only_in_lists(store, db, monkeypatch,
                                                                                        capsys):
    assert len(LONG_TITLE) > 60
    conv = store.new_conversation({}, None)
    store.add_message(conv, "user", LONG_TITLE + "\nand more")
    assert store.get(conv).title == LONG_TITLE and store.list_conversations()[0].title == LONG_TITLE
    assert json.loads(export.to_json(store.get(conv)))["title"] == LONG_TITLE
    assert export.summary_dict(store.list_conversations()[0])["title"] == LONG_TITLE
    assert export.to_markdown(store.get(conv)).startswith(f"# {LONG_TITLE}\n")
    store.close()
    code, out, _ = cli(monkeypatch, capsys, "history", "--json")
    assert code == 0 and json.loads(out)[0]["title"] == LONG_TITLE
    code, out, _ = cli(monkeypatch, capsys, "history")
    assert code == 0 and short_title(LONG_TITLE) in out and LONG_TITLE not in out   # the table shortens it
    code, out, _ = cli(monkeypatch, capsys, "history", "show", str(conv))
    assert out.startswith(f"# {LONG_TITLE}\n")


def test_partial_is_cleared_once_the_conversation_goes_on(store):
    conv = store.new_conversation({}, None)
    store.add_message(conv, "user", "Tell a story.")
    store.start_reply(conv).finish({"n_tokens": 4, "finish": "stopped"}, partial=True)   # Esc
    assert store.list_conversations()[0].partial
    store.add_message(conv, "user", "Shorter, please.")
    assert not store.list_conversations()[0].partial   # it went on: no longer partial
    w = store.start_reply(conv)
    w.append("Once upon")
    assert store.list_conversations()[0].partial        # the new reply is not finished yet
    w.finish({"n_tokens": 3})
    summary = store.list_conversations()[0]
    assert not summary.partial and summary.n_messages == 4
    assert [m.partial for m in store.get(conv).messages] == [False, True, False, False]   # the reply keeps its mark


def test_a_continued_reply_grows_in_its_own_message(store):
    conv = store.new_conversation({}, None)
    store.add_message(conv, "user", "Tell a story.")
    first = store.start_reply(conv)
    first.append("Once upon")
    first.finish({"n_tokens": 2, "finish": "length"})
    w = ReplyWriter(store, first.id, "Once upon")
    w.append(" a time.")
    w.finish({"n_tokens": 3, "continued": True})
    messages = store.get(conv).messages
    assert [(m.role, m.content) for m in messages] == [("user", "Tell a story."), ("assistant", "Once upon a time.")]
    assert messages[1].stats == {"n_tokens": 3, "continued": True}


def test_the_stats_line_labels_both_speeds_and_how_a_reply_ended():
    line = export.stats_line({"n_tokens": 5, "tokens_per_second": 20.0, "decode_tokens_per_second": 25.0,
                              "finish": "length", "n_prompt_tokens": 40, "cached_tokens": 30, "continued": True})
    assert line == ("continued: 5 tokens · 25.0 tokens/s decode (20.0 with prefill) · max tokens · "
                    "prompt 40 tokens (30 cached)")
    assert export.stats_line({"tokens_per_second": 20.0}) == "20.0 tokens/s with prefill"   # an older record
    assert export.stats_line({"alpha": True, "finish": "stop"}) == ""


def test_wal_schema_version_and_short_busy_timeout(store, db):
    assert raw(db, "PRAGMA journal_mode") == [("wal",)]   # persistent in the file: any reader sees it
    conn = store._conn
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1   # NORMAL
    assert 0 < conn.execute("PRAGMA busy_timeout").fetchone()[0] == BUSY_TIMEOUT_MS <= 500
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert raw(db, "PRAGMA user_version") == [(len(MIGRATIONS),)]


def test_reply_writes_are_throttled_and_finish_always_writes(db):
    clock = Clock()
    s = open_store(db, clock=clock, flush_seconds=2.0)
    conv = s.new_conversation({}, None)
    s.add_message(conv, "user", "hi")
    w = s.start_reply(conv)
    stored = lambda: raw(db, "SELECT content, partial, stats FROM messages WHERE id = ?", w.id)[0]  # noqa: E731
    assert stored() == ("", 1, None)   # the reply exists from the start, marked partial
    clock.t = 0.5
    assert not w.append("Hello") and stored() == ("", 1, None)
    clock.t = 2.1
    assert w.append(", wor") and stored() == ("Hello, wor", 1, None)
    clock.t = 3.0
    assert not w.append("ld") and stored()[0] == "Hello, wor"   # 0.9 s after the last write
    clock.t = 4.2
    assert w.append("!") and stored()[0] == "Hello, world!"   # 2.1 s after it
    w.append(" Bye.")
    w.finish(STATS)
    content, partial, stats = stored()
    assert (content, partial, json.loads(stats)) == ("Hello, world! Bye.", 0, STATS)
    assert s.get(conv).messages[-1].partial is False


def test_a_stopped_reply_is_kept_as_partial_and_finish_writes_once(store, db):
    conv = store.new_conversation({}, None)
    store.add_message(conv, "user", "hi")
    w = store.start_reply(conv)
    w.append("half a tho")
    w.finish({"n_tokens": 4}, partial=True)
    w.append("ught")          # after finish: kept in memory only
    w.finish(STATS)           # a second finish changes nothing
    m = store.get(conv).messages[-1]
    assert (m.content, m.partial, m.stats) == ("half a tho", True, {"n_tokens": 4})
    assert store.list_conversations()[0].partial


def test_a_discarded_reply_and_a_taken_back_message_are_removed(store):
    conv = store.new_conversation({}, None)
    user = store.add_message(conv, "user", "hi")
    w = store.start_reply(conv)
    w.append("oops")
    w.discard()
    store.delete_message(user)
    assert store.get(conv).messages == ()
    with pytest.raises(ValueError):
        store.add_message(conv, "system", "roles are user and assistant")


def test_delete_cascades_to_messages(store, db):
    keep, gone = two_turns(store), two_turns(store)
    assert store.delete(gone) and not store.delete(gone)
    assert store.get(gone) is None
    assert raw(db, "SELECT COUNT(*) FROM messages WHERE conversation = ?", gone) == [(0,)]
    assert raw(db, "SELECT COUNT(*) FROM messages") == [(4,)] and len(store.get(keep).messages) == 4


def test_listing_is_most_recently_updated_first(db):
    store = open_store(db, now=Ticks())
    a, b, c = (store.new_conversation({}, None) for _ in range(3))
    for conv, text in ((a, "first"), (b, "second"), (c, "third")):
        store.add_message(conv, "user", text)
    assert [s.id for s in store.list_conversations()] == [c, b, a]
    assert store.last_id() == c
    w = store.start_reply(a)   # a reply to the oldest moves it to the top
    w.finish(STATS)
    rows = store.list_conversations()
    assert [s.id for s in rows] == [a, c, b] and store.last_id() == a
    assert (rows[0].title, rows[0].n_messages, rows[0].partial) == ("first", 2, False)
    assert [s.id for s in store.list_conversations(limit=2)] == [a, c]


def test_concurrent_writers_share_one_store(store):
    conv = store.new_conversation({}, None)

    def write(n: int) -> None:
        for i in range(20):
            store.add_message(conv, "user", f"{n}-{i}")

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = store.get(conv).messages
    assert [m.ordinal for m in got] == list(range(80)) and not store.disabled


def test_default_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("LOCALSPEC_HISTORY", raising=False)
    home = Path(os.environ["XDG_DATA_HOME"])
    if sys.platform.startswith("linux"):
        assert default_path() == home / "localspec" / "history.sqlite3"
    monkeypatch.setenv("LOCALSPEC_HISTORY", str(tmp_path / "mine.db"))
    assert default_path() == tmp_path / "mine.db"


# ---- failures never reach the chat ------------------------------------------------------------
def assert_accepts_everything(s: Store) -> None:
    """The chat's calls on a store that cannot save: all accepted, none raises."""
    conv = s.new_conversation({"a": 1}, "sys")
    s.add_message(conv, "user", "still chatting")
    w = s.start_reply(conv)
    w.append("a reply")
    w.finish(STATS)
    assert s.list_conversations() == [] and s.get(1) is None and s.last_id() is None
    assert s.delete(1) is False


def test_a_corrupt_file_disables_saving_with_a_notice(db):
    db.parent.mkdir(parents=True)
    db.write_bytes(os.urandom(64) + b"this is not SQLite" * 300)
    s = open_store(db)
    assert s.disabled and str(db) in s.notice and "not a usable history database" in s.notice
    assert "\n" not in s.notice
    assert_accepts_everything(s)
    with pytest.raises(StoreError, match="not a usable"):
        open_store(db, strict=True)


def test_a_directory_that_cannot_be_created_disables_saving(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    s = open_store(blocker / "history.sqlite3")
    assert s.disabled and "history not saved" in s.notice
    assert_accepts_everything(s)
    with pytest.raises(StoreError):
        open_store(blocker / "history.sqlite3", strict=True)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_directory_disables_saving(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        s = open_store(ro / "history.sqlite3")
        assert s.disabled and s.notice
        assert_accepts_everything(s)
    finally:
        ro.chmod(0o700)


def test_a_lock_released_while_a_write_waits_loses_nothing(db):
    """A `history rm` of a long conversation, or another chat creating the file, holds the lock
    longer than one busy timeout: the write is tried again after a pause, and saving goes on."""
    store = open_store(db)
    conv = store.new_conversation({}, None)
    with Locker(db) as other:
        store.sleep = pauses = Pauses(then=other.let_go)   # released during the first pause
        msg = store.add_message(conv, "user", "hello?")
    assert pauses.asked == [RETRY_DELAYS[0]]
    assert msg is not None and not store.disabled and store.notice is None
    assert [m.content for m in store.get(conv).messages] == ["hello?"]
    store.close()


def test_a_lock_that_stays_is_retried_on_a_fresh_connection_then_said_once(db, monkeypatch):
    store = open_store(db)
    conv = store.new_conversation({}, None)
    store.sleep = pauses = Pauses()
    opened = []
    connect = history._connect
    monkeypatch.setattr(history, "_connect", lambda path: opened.append(path) or connect(path))
    with Locker(db):
        assert store.add_message(conv, "user", "hello?") is None
        assert pauses.asked == list(RETRY_DELAYS) and opened == [db]   # re-opened before the last try
        assert store.disabled and "locked" in store.notice and "\n" not in store.notice
        notice = store.notice
        w = store.start_reply(conv)   # saving is off now: nothing more waits for the lock
        w.append("reply")
        w.finish(STATS)
        assert pauses.asked == list(RETRY_DELAYS) and opened == [db] and store.notice == notice
    assert raw(db, "SELECT COUNT(*) FROM messages") == [(0,)]


def test_the_cli_waits_for_a_lock_too_then_says_why(db):
    strict = open_store(db, strict=True, sleep=Pauses())
    with Locker(db):
        with pytest.raises(StoreError, match="locked"):
            strict.delete(1)
        assert strict.sleep.asked == list(RETRY_DELAYS)


def test_opening_a_locked_database_tries_again(tmp_path):
    path = tmp_path / "h.sqlite3"
    with Locker(path, "EXCLUSIVE") as other:   # a new rollback-journal file, locked before we look
        waits = Pauses()
        s = open_store(path, sleep=waits)
        assert s.disabled and "locked" in s.notice and waits.asked == list(RETRY_DELAYS)
        assert_accepts_everything(s)
        pauses = Pauses(then=other.let_go)
        s = open_store(path, sleep=pauses)   # two chats creating the file at once
    assert pauses.asked == [RETRY_DELAYS[0]] and not s.disabled, s.notice
    s.close()


@pytest.mark.parametrize("number", [MAX_ID + 1, 2**64, 10**30, 0, -1, -(2**63) - 1])
def test_ids_no_row_can_have_are_not_found_not_an_overflow(store, number):
    """`history show/rm/export 9223372036854775808`, `chat --resume` with it: SQLite cannot even bind
    the number (OverflowError); no conversation has it, so it is not found."""
    conv = two_turns(store)
    assert store.get(number) is None and store.delete(number) is False
    assert [s.id for s in store.list_conversations(limit=MAX_ID + 1)] == [conv]   # more than all: all
    assert store.get(MAX_ID) is None and store.delete(MAX_ID) is False   # the largest one is asked for
    assert not store.disabled and store.notice is None


def test_a_foreign_sqlite_file_is_refused_as_it_was(tmp_path, monkeypatch, capsys):
    """Not ours (another program's database at $LOCALSPEC_HISTORY): refused before its journal mode
    (or anything else in it) changes."""
    path = tmp_path / "theirs.sqlite3"
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE notes (body TEXT)")
    c.execute("INSERT INTO notes VALUES ('keep me')")
    c.commit()
    c.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not a localspec history database"):
        open_store(path, strict=True)
    s = open_store(path)
    assert s.disabled and "not a localspec history database" in s.notice
    monkeypatch.setenv("LOCALSPEC_HISTORY", str(path))
    code, out, err = cli(monkeypatch, capsys, "history")
    assert code == 2 and err.count("\n") == 1 and "not a localspec history database" in err
    assert raw(path, "PRAGMA journal_mode") == [("delete",)] and path.read_bytes() == before
    assert raw(path, "SELECT name FROM sqlite_master") == [("notes",)]
    assert not Path(f"{path}-wal").exists()


def test_a_full_disk_disables_saving(store):
    conv = store.new_conversation({}, None)
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages + 1}")   # SQLite's own "disk is full"
    store.add_message(conv, "user", "x" * 100_000)
    assert store.disabled and "full" in store.notice
    assert_accepts_everything(store)


def test_a_conversation_deleted_under_the_chat_stops_its_saving_only(store):
    conv, other = store.new_conversation({}, None), store.new_conversation({}, None)
    store.delete(conv)   # `localspec history rm` from another terminal
    assert store.add_message(conv, "user", "hi") is None and store.notice
    assert not store.disabled and store.add_message(other, "user", "hi") is not None


def test_a_file_from_a_newer_localspec_is_refused(db):
    open_store(db).close()
    raw(db, f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(StoreError, match="newer localspec"):
        open_store(db, strict=True)
    assert open_store(db).disabled


def test_migrations_run_in_order_and_a_failed_one_changes_nothing(store, db):
    conv = two_turns(store)
    conn = store._conn
    broken = MIGRATIONS + (("ALTER TABLE conversations ADD COLUMN pinned INTEGER", "NOT SQL AT ALL"),)
    with pytest.raises(sqlite3.Error):
        _migrate(conn, db, broken)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert "pinned" not in [r[1] for r in conn.execute("PRAGMA table_info(conversations)")]
    added = MIGRATIONS + (("ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0",),)
    _migrate(conn, db, added)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(added)
    assert conn.execute("SELECT pinned FROM conversations").fetchall() == [(0,)]
    assert len(store.get(conv).messages) == 4


CRASHING_CHAT = """
import sys, time
from localspec.chats.store import open_store
now = [0.0]
s = open_store(sys.argv[1], clock=lambda: now[0])
conv = s.new_conversation({"target": "t.gguf"}, "Be brief.")
s.add_message(conv, "user", "first question")
s.add_message(conv, "assistant", "first answer", stats={"n_tokens": 2})
s.add_message(conv, "user", "second question")
s.add_message(conv, "assistant", "second answer", stats={"n_tokens": 3})
s.add_message(conv, "user", "third question")
w = s.start_reply(conv)
w.append("the reply so far")
now[0] = 5.0
assert w.append(", written")
now[0] = 5.5
w.append(" and this never is")
print("WRITTEN", flush=True)
time.sleep(120)
"""


def test_a_reply_cut_off_by_a_crash_survives_up_to_its_last_write(db):
    db.parent.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_CHAT, str(db)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "WRITTEN", proc.stderr.read() if proc.poll() is not None else line
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    s = open_store(db)
    conv = s.get(s.last_id())
    assert [(m.role, m.content, m.partial) for m in conv.messages] == [
        ("user", "first question", False), ("assistant", "first answer", False),
        ("user", "second question", False), ("assistant", "second answer", False),
        ("user", "third question", False), ("assistant", "the reply so far, written", True)]
    assert conv.messages[3].stats == {"n_tokens": 3} and conv.system == "Be brief."
    assert s.list_conversations()[0].partial


# ---- export -----------------------------------------------------------------------------------
def test_markdown_export(store):
    conv = two_turns(store)
    w = store.start_reply(conv)
    w.append("cut")
    w.finish(partial=True)
    md = export.to_markdown(store.get(conv))
    assert md.startswith("# Tell me about lighthouses\n")
    assert "target.gguf + draft.gguf" in md and "/m/" not in md
    assert md.count("## user") == 2 and md.count("## assistant") == 3 and "## system\n\nBe brief." in md
    assert "\n*12 tokens · α 0.750 · 2.40 tokens/target pass · 41.5 tokens/s with prefill · k auto · drafter auto · " \
           "temperature 0.7*\n" in md
    assert "They guide ships.\n\n*12 tokens" in md   # the numbers sit under their reply
    assert md.rstrip().endswith("cut\n\n*partial: stopped or cut off before it finished*")
    assert md.index("Tell me   about") < md.index("They guide") < md.index("Who kept") < md.index("Keepers")


def test_json_export_has_the_documented_shape(store):
    conv = two_turns(store)
    store.start_reply(conv).finish(partial=True)
    data = json.loads(export.to_json(store.get(conv)))
    assert set(data) == {"format", "version", "id", "title", "created", "updated", "settings", "system", "messages"}
    assert (data["format"], data["version"], data["id"]) == ("localspec.conversation", 1, conv)
    assert data["created"].endswith("+00:00") and data["system"] == "Be brief."
    assert [set(m) for m in data["messages"]] == [{"role", "content", "partial", "created", "updated", "stats"}] * 5
    assert data["messages"][1]["stats"] == STATS and data["messages"][-1]["partial"] is True
    assert [m["content"] for m in data["messages"]][2:4] == ["Who kept them?", "Keepers."]


# ---- fitting a history to the context ---------------------------------------------------------
def render(messages):
    """A stand-in chat template: one token per character, plus 4 per message."""
    return [0] * sum(len(m["content"]) + 4 for m in messages)


def test_fit_drops_oldest_pairs_never_the_system_prompt_and_leaves_history_alone():
    history = [{"role": r, "content": f"{i}" * 50} for i, r in enumerate(["user", "assistant"] * 3 + ["user"])]
    before = [dict(m) for m in history]
    fitted = conversation.fit("sys", history, render, n_ctx=200, max_tokens=20)
    assert fitted.dropped == 4 and history == before
    assert fitted.prompt == render(conversation.messages("sys", history[4:]))
    assert len(fitted.prompt) + 20 <= 200
    assert conversation.fit("sys", history, render, n_ctx=10_000, max_tokens=20).dropped == 0
    with pytest.raises(ConfigError, match="too long"):
        conversation.fit("sys", history + [{"role": "user", "content": "x" * 300}], render, 200, 20)
    assert conversation.messages(None, history[:1]) == history[:1]


def test_a_prompt_of_n_ctx_minus_one_tokens_fits_as_in_generate():
    """One rule (localspec.tokens.prompt_fits) for chat, generate and serve: room for one token is enough."""
    n_ctx = 100
    message = lambda n: [{"role": "user", "content": "x" * (n - 4)}]  # noqa: E731 (render: n tokens)
    assert len(conversation.fit(None, message(n_ctx - 1), render, n_ctx, max_tokens=20).prompt) == n_ctx - 1
    with pytest.raises(ConfigError, match="too long"):
        conversation.fit(None, message(n_ctx), render, n_ctx, max_tokens=20)
    assert tokens.prompt_fits(n_ctx - 1, n_ctx) and not tokens.prompt_fits(n_ctx, n_ctx)


# ---- the CLI ----------------------------------------------------------------------------------
def cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`localspec ARGS` through the real entry point, in this process."""
    from localspec.cli.app import main

    monkeypatch.setattr(sys, "argv", ["localspec", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_cli_list_show_export_rm(db, monkeypatch, capsys, tmp_path):
    assert cli(monkeypatch, capsys, "history")[0] == 0 and not db.exists()   # listing creates nothing
    s = open_store(db)
    first = two_turns(s)
    second = s.new_conversation({}, None)
    s.add_message(second, "user", "newer one")
    s.start_reply(second).finish(partial=True)
    s.close()
    code, out, _ = cli(monkeypatch, capsys, "history")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["ID", "UPDATED", "MESSAGES", "TITLE"]
    assert lines[1].split()[0] == str(second) and "newer one" in lines[1] and "[partial]" in lines[1]
    assert lines[2].split()[0] == str(first) and "Tell me about lighthouses" in lines[2] and " 4 " in lines[2]
    code, out, _ = cli(monkeypatch, capsys, "history", "--json", "--limit", "1")
    assert code == 0 and [r["id"] for r in json.loads(out)] == [second]
    code, out, _ = cli(monkeypatch, capsys, "history", "show", str(first))
    assert code == 0 and out.startswith("# Tell me about lighthouses") and "## assistant" in out
    code, out, _ = cli(monkeypatch, capsys, "history", "show", str(first), "--json")
    assert code == 0 and json.loads(out)["id"] == first
    for fmt in ("md", "json"):
        target = tmp_path / f"out.{fmt}"
        code, out, _ = cli(monkeypatch, capsys, "history", "export", str(first), fmt, str(target))
        assert code == 0 and len(out.splitlines()) == 1 and str(target) in out
        assert target.read_text(encoding="utf-8") == (export.to_markdown if fmt == "md" else export.to_json)(
            open_store(db).get(first))
    code, out, _ = cli(monkeypatch, capsys, "history", "rm", str(first))
    assert code == 0 and out == f"deleted conversation {first}\n"
    assert [s.id for s in open_store(db).list_conversations()] == [second]


@pytest.mark.parametrize("args,needle", [
    (["show", "abc"], "'abc'"),
    (["show", "1.5"], "'1.5'"),
    (["show", "999"], "no conversation 999"),
    (["show", "0"], "no conversation 0"),
    (["show", "1", "--json", "--md"], "one of --json and --md"),
    (["rm", "999"], "no conversation 999"),
    (["rm", "x"], "'x'"),
    (["export", "1", "txt", "{tmp}/out"], "md or json"),
    (["export", "999", "md", "{tmp}/out"], "no conversation 999"),
    (["export", "1", "md", "{tmp}/a-file/out.md"], "cannot write"),
    (["export", "1", "md", "{tmp}"], "cannot write"),
    (["--limit", "-1"], "--limit"),
    (["frobnicate"], "frobnicate"),
])
def test_cli_bad_input_exits_2_with_one_line(db, monkeypatch, capsys, tmp_path, args, needle):
    s = open_store(db)
    two_turns(s)
    s.close()
    (tmp_path / "a-file").write_text("x")
    code, out, err = cli(monkeypatch, capsys, "history", *[a.format(tmp=tmp_path) for a in args])
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


@pytest.mark.parametrize("args", [[], ["show", "1"], ["rm", "1"], ["export", "1", "json", "-"]])
def test_cli_on_a_corrupt_database_exits_2_with_one_line(db, monkeypatch, capsys, args):
    db.parent.mkdir(parents=True)
    db.write_bytes(b"\x00garbage" * 1000)
    code, out, err = cli(monkeypatch, capsys, "history", *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not a usable history database" in lines[0]
    assert db.read_bytes() == b"\x00garbage" * 1000   # left as it was, for the user to look at


def test_the_cli_entry_point_in_a_subprocess(db):
    s = open_store(db)
    conv = two_turns(s)
    s.close()
    env = {**os.environ, "LOCALSPEC_HISTORY": str(db)}
    run = lambda *a: subprocess.run([sys.executable, "-m", "localspec", "history", *a], cwd=REPO, env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    ok = run("export", str(conv), "json", "-")
    assert ok.returncode == 0 and json.loads(ok.stdout)["messages"][0]["role"] == "user"
    bad = run("show", "nope")
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.splitlines()) == 1
