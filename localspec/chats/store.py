"""Saved conversations: a SQLite file in the user data directory (or $LOCALSPEC_HISTORY).

Saving is a convenience, never a reason for a chat to stop. A locked file is tried again a few
times (RETRY_DELAYS); a store opened for the chat turns every failure that lasts (a corrupt file, a
lock held for seconds, a read-only directory, a full disk) into `Store.disabled` with a one-line
`Store.notice`; every later call is accepted and does nothing. The `localspec history` commands
open it with `strict=True` and get a one-line `StoreError` instead. A file that is not ours (no
conversations tables) is refused before anything in it changes.

One connection per store, shared by threads under a lock (`check_same_thread=False`): Textual starts
a fresh worker thread per reply, so a connection per thread would be opened per reply and never
closed; SQLite takes one writer at a time anyway, and every write here is short. WAL with
synchronous=NORMAL: a committed write survives the process being killed (only an OS crash can take
the last ones back), and readers (`localspec history` while a chat runs) never wait.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .conversation import Conversation, Message, Summary, make_title

ENV = "LOCALSPEC_HISTORY"   # a file path
FLUSH_SECONDS = 2.0
"""A streaming reply is written at most this often (and always when it finishes)."""
BUSY_TIMEOUT_MS = 250
"""How long one attempt waits for another connection's lock: short, since the chat waits for it."""
RETRY_DELAYS = (0.1, 0.3, 0.9)
"""Pauses before a locked file is tried again (`history rm` of a long conversation, two chats creating
it at once), the last time on a fresh connection: ~2.3 s in all before saving gives up, once."""
MAX_ID = 2**63 - 1
"""SQLite's largest integer: no row has a larger id, and a larger number cannot even be bound."""
ROLES = ("user", "assistant")

# Schema version N is reached by running MIGRATIONS[:N] in order; a file is brought up to
# len(MIGRATIONS) when opened. Append, never edit: files in the wild are at every earlier version.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL DEFAULT '',
            created REAL NOT NULL,            -- Unix seconds
            updated REAL NOT NULL,
            settings TEXT NOT NULL DEFAULT '{}',  -- JSON: model pair, sampling, drafter, k, ...
            system TEXT
        )""",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            ordinal INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            partial INTEGER NOT NULL DEFAULT 0,
            created REAL NOT NULL,
            updated REAL NOT NULL,
            stats TEXT,                       -- JSON, assistant replies
            UNIQUE (conversation, ordinal)
        )""",
        "CREATE INDEX conversations_by_updated ON conversations(updated)",
    ),
)


class StoreError(Exception):
    """The history database cannot be used; the message is one line, fit for the CLI."""

    locked = False   # another connection held the lock: trying later may work


def default_path() -> Path:
    """$LOCALSPEC_HISTORY, else history.sqlite3 in the platform's user data directory."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("localspec")) / "history.sqlite3"


def _describe(e: BaseException, path: Path) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.OperationalError):   # no retry helps
        return f"{path} is not a usable history database ({text}); move it away to start a new one"
    return f"{path}: {text}"


class Store:
    """Conversations in one SQLite file. Every method is safe to call from any thread."""

    def __init__(self, path: Path, conn: sqlite3.Connection | None, notice: str | None = None,
                 strict: bool = False, clock: Callable[[], float] = time.monotonic,
                 flush_seconds: float = FLUSH_SECONDS, now: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """`clock` times reply writes, `now` dates rows (Unix seconds), `sleep` waits between
        attempts at a locked file (tests pass their own)."""
        self.path = path
        self.notice = notice
        """Why saving stopped (one line), or None while it works."""
        self.strict = strict
        self.clock = clock
        self.flush_seconds = flush_seconds
        self.now = now
        self.sleep = sleep
        self._conn = conn
        self._lock = threading.Lock()

    @classmethod
    def null(cls, notice: str, path: Path | None = None) -> "Store":
        return cls(path or Path(os.devnull), None, notice)   # accepts every call, keeps nothing

    @property
    def disabled(self) -> bool:
        return self._conn is None

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # ---- writing -------------------------------------------------------------------------------
    def new_conversation(self, settings: dict | None = None, system: str | None = None) -> int | None:
        """A new, empty conversation; its id (None when saving is off)."""
        now = self.now()
        return self._run(lambda c: c.execute("INSERT INTO conversations (created, updated, settings, system) "
                                             "VALUES (?, ?, ?, ?)", (now, now, _dumps(settings or {}), system)).lastrowid)

    def add_message(self, conv: int | None, role: str, content: str, stats: dict | None = None,
                    partial: bool = False) -> int | None:
        """Append a message to conversation `conv`; its id (None when saving is off)."""
        if role not in ROLES:   # a bug in the caller, not a storage failure: say so
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        return self._insert(conv, role, content, None if stats is None else _dumps(stats), partial)

    def start_reply(self, conv: int | None) -> "ReplyWriter":
        """An assistant reply to stream into: stored at once as an empty partial message, then
        rewritten by `append` every `flush_seconds` and by `finish`."""
        return ReplyWriter(self, self._insert(conv, "assistant", "", None, True))

    def update_message(self, msg: int | None, content: str, stats: dict | None = None,
                       partial: bool = False) -> None:
        """Rewrite message `msg` (a streamed reply's text so far, or its final text and stats)."""
        if msg is None:
            return
        now = self.now()
        body = None if stats is None else _dumps(stats)

        def update(c: sqlite3.Connection) -> None:
            with _transaction(c):
                c.execute("UPDATE messages SET content = ?, stats = COALESCE(?, stats), partial = ?, updated = ? "
                          "WHERE id = ?", (content, body, int(partial), now, msg))
                c.execute("UPDATE conversations SET updated = ? WHERE id = "
                          "(SELECT conversation FROM messages WHERE id = ?)", (now, msg))

        self._run(update)

    def delete_message(self, msg: int | None) -> None:
        """Remove one message: a turn the chat took back after an error."""
        if msg is not None:
            self._run(lambda c: c.execute("DELETE FROM messages WHERE id = ?", (msg,)))

    def delete(self, conv: int) -> bool:
        """Delete a conversation and its messages; whether it existed."""
        return _is_id(conv) and bool(self._run(
            lambda c: c.execute("DELETE FROM conversations WHERE id = ?", (conv,)).rowcount))

    # ---- reading -------------------------------------------------------------------------------
    def list_conversations(self, limit: int | None = None) -> list[Summary]:
        """Most recently updated first; partial as the last message is (Summary.partial)."""
        sql = ("SELECT c.id, c.title, c.created, c.updated, COUNT(m.id), COALESCE((SELECT l.partial FROM messages l "
               "WHERE l.conversation = c.id ORDER BY l.ordinal DESC LIMIT 1), 0) FROM conversations c LEFT JOIN "
               "messages m ON m.conversation = c.id GROUP BY c.id ORDER BY c.updated DESC, c.id DESC LIMIT ?")
        limit = -1 if limit is None or limit > MAX_ID else limit   # SQLite: a negative limit is none
        rows = self._run(lambda c: c.execute(sql, (limit,)).fetchall(), [])
        return [Summary(r[0], r[1], r[2], r[3], r[4], bool(r[5])) for r in rows]

    def get(self, conv: int) -> Conversation | None:
        """A conversation with its messages, or None when there is no such id."""
        def read(c: sqlite3.Connection):
            with _transaction(c, "DEFERRED"):   # a snapshot: the messages match the conversation row
                head = c.execute("SELECT id, title, created, updated, settings, system FROM conversations "
                                 "WHERE id = ?", (conv,)).fetchone()
                rows = c.execute("SELECT id, ordinal, role, content, partial, created, updated, stats FROM "
                                 "messages WHERE conversation = ? ORDER BY ordinal", (conv,)).fetchall()
            return head, rows

        head, rows = self._run(read, (None, [])) if _is_id(conv) else (None, [])
        if head is None:
            return None
        messages = tuple(Message(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6], _loads(r[7])) for r in rows)
        return Conversation(head[0], head[1], head[2], head[3], _loads(head[4]) or {}, head[5], messages)

    def last_id(self) -> int | None:
        """The most recently updated conversation, to resume."""
        row = self._run(lambda c: c.execute(
            "SELECT id FROM conversations ORDER BY updated DESC, id DESC LIMIT 1").fetchone())
        return row[0] if row else None

    def _insert(self, conv: int | None, role: str, content: str, stats: str | None, partial: bool) -> int | None:
        if conv is None:   # a conversation never stored (saving was off when it began) takes nothing
            return None
        now = self.now()

        def insert(c: sqlite3.Connection) -> int:
            with _transaction(c):
                ordinal = c.execute("SELECT COALESCE(MAX(ordinal) + 1, 0) FROM messages WHERE conversation = ?",
                                    (conv,)).fetchone()[0]
                msg = c.execute("INSERT INTO messages (conversation, ordinal, role, content, partial, created, "
                                "updated, stats) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                (conv, ordinal, role, content, int(partial), now, now, stats)).lastrowid
                title = make_title(content) if role == "user" else ""
                c.execute("UPDATE conversations SET updated = ?, title = CASE WHEN title = '' THEN ? ELSE title "
                          "END WHERE id = ?", (now, title, conv))
            return msg

        return self._run(insert)

    def _run(self, op: Callable[[sqlite3.Connection], Any], default: Any = None) -> Any:
        """op(connection): the one place storage errors are caught. A locked file is tried again
        after each pause of RETRY_DELAYS, the last time on a fresh connection."""
        with self._lock:
            for attempt, pause in enumerate((*RETRY_DELAYS, None), 1):
                if self._conn is None:
                    if self.strict:
                        raise StoreError(self.notice or "the history database is closed")
                    return default
                try:
                    return op(self._conn)
                except (sqlite3.Error, OSError) as e:
                    if pause is None or not _locked(e):
                        # An IntegrityError is a conversation deleted under the chat (`localspec
                        # history rm`): the store itself is fine. Anything else will fail again.
                        return self._give_up(_describe(e, self.path), default,
                                             close=not isinstance(e, sqlite3.IntegrityError))
                self.sleep(pause)
                if attempt == len(RETRY_DELAYS):   # the last attempt, on a fresh connection
                    self._conn.close()
                    try:
                        self._conn = _connect(self.path)
                    except StoreError as e:
                        self._conn = None
                        return self._give_up(str(e), default)

    def _give_up(self, message: str, default: Any, close: bool = True) -> Any:
        if self.strict:
            raise StoreError(message)
        self.notice = f"history not saved: {message}"
        if close and self._conn is not None:
            self._conn.close()
            self._conn = None
        return default


class ReplyWriter:
    """Streams one assistant reply into the store, time-throttled: `append` writes when
    `flush_seconds` have passed since the last write, `finish` always writes. `text`: what the
    message holds already (a reply being continued grows from it)."""

    def __init__(self, store: Store, msg: int | None, text: str = "") -> None:
        self.store = store
        self.id = msg   # the message's id (None when saving is off)
        self._parts: list[str] = [text] if text else []
        self._last = store.clock()
        self._done = False

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def append(self, text: str) -> bool:
        """Add streamed text; whether this call wrote to the database."""
        self._parts.append(text)
        if self._done or self.id is None or self.store.clock() - self._last < self.store.flush_seconds:
            return False
        self.store.update_message(self.id, self.text, partial=True)
        self._last = self.store.clock()
        return True

    def finish(self, stats: dict | None = None, partial: bool = False) -> None:
        """Write the whole reply: `partial=True` when it was stopped (Esc, quitting)."""
        if not self._done:
            self._done = True
            self.store.update_message(self.id, self.text, stats, partial)

    def discard(self) -> None:
        """Remove the reply: the chat took the turn back after an error."""
        self._done = True
        self.store.delete_message(self.id)


def open_store(path: str | Path | None = None, *, strict: bool = False,
               clock: Callable[[], float] = time.monotonic, flush_seconds: float = FLUSH_SECONDS,
               now: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> Store:
    """The history store at `path` (default: `default_path()`), created and migrated as needed; a
    locked file is tried again after each pause of RETRY_DELAYS. (`clock`, `now`, `sleep`: Store.)

    Never raises unless `strict`: a store that cannot be used comes back disabled, with a notice."""
    path = Path(path).expanduser() if path is not None else default_path()
    for pause in (*RETRY_DELAYS, None):
        try:
            conn = _connect(path)
        except StoreError as e:
            if e.locked and pause is not None:
                sleep(pause)
                continue
            if strict:
                raise
            return Store.null(f"history not saved: {e}", path)
        return Store(path, conn, strict=strict, clock=clock, flush_seconds=flush_seconds, now=now, sleep=sleep)


def _connect(path: Path) -> sqlite3.Connection:
    conn = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (`_transaction`), so a failed write never
        # leaves one open behind the next call. `timeout` is SQLite's busy_timeout.
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=False)
        _check_ours(conn, path)   # before anything below changes the file (its journal mode first)
        for pragma in ("foreign_keys = ON", "journal_mode = WAL", "synchronous = NORMAL"):
            conn.execute(f"PRAGMA {pragma}")
        _migrate(conn, path)
        return conn
    except (sqlite3.Error, OSError, StoreError) as e:
        if conn is not None:
            conn.close()
        error = e if isinstance(e, StoreError) else StoreError(_describe(e, path))
        error.locked = _locked(e)
        raise error from None


def _check_ours(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a file this module did not make: an empty one is new, ours has a schema version and
    our tables. Only reads: a foreign file is left exactly as it was."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if (tables or version) and not (version >= 1 and {"conversations", "messages"} <= tables):
        raise StoreError(f"{path} is not a localspec history database (it holds other data); "
                         f"move it away or set {ENV} to another file")
    _check_version(version, path, len(MIGRATIONS))


def _check_version(version: int, path: Path, known: int) -> None:   # before and during _migrate
    if version > known:
        raise StoreError(f"{path} was written by a newer localspec (schema {version}, this one knows "
                         f"{known}); upgrade localspec or set {ENV} to another file")


def _migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[Sequence[str]] = MIGRATIONS) -> None:
    if conn.execute("PRAGMA user_version").fetchone()[0] == len(migrations):
        return
    with _transaction(conn):
        # Read again under the write lock: another process may have migrated meanwhile.
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        _check_version(version, path, len(migrations))
        for statements in migrations[version:]:
            for sql in statements:
                conn.execute(sql)   # DDL is transactional in SQLite: a failed step leaves no half schema
        conn.execute(f"PRAGMA user_version = {len(migrations)}")


@contextmanager
def _transaction(conn: sqlite3.Connection, mode: str = "IMMEDIATE") -> Iterator[None]:
    # IMMEDIATE takes the write lock up front, so a busy database fails at BEGIN (after the busy
    # timeout) rather than half way through, and two writers never deadlock upgrading a read lock.
    conn.execute(f"BEGIN {mode}")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _locked(e: BaseException) -> bool:   # SQLITE_BUSY (5) or SQLITE_LOCKED (6): trying later may work
    code = getattr(e, "sqlite_errorcode", None)   # Python 3.11+; before, only the message says
    return code & 0xFF in (5, 6) if code is not None else isinstance(e, sqlite3.OperationalError) and "locked" in str(e)


def _is_id(n: int) -> bool:   # a number past MAX_ID cannot even be bound (OverflowError)
    return 1 <= n <= MAX_ID


def _dumps(value: dict) -> str:   # default=str: a Path or a numpy float32 in stats is no reason to fail
    return json.dumps(value, ensure_ascii=False, default=str)


def _loads(text: str | None) -> Any:
    try:
        return None if text is None else json.loads(text)
    except ValueError:   # edited by hand: show the conversation anyway
        return None
