"""The ``localspec history`` commands over saved chats; localspec.cli.app calls register(app)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from .options import fail, shown
from localspec.chats.store import MAX_ID   # SQLite's largest integer: beyond it sqlite3 raises OverflowError

FORMATS = ("md", "json")


def register(app: typer.Typer) -> None:
    """Add ``history`` (list) and its ``show``, ``rm`` and ``export`` subcommands to ``app``."""
    history = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                          help="Saved chat conversations.")
    app.add_typer(history, name="history")

    @history.callback(invoke_without_command=True)
    def list_command(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
        limit: int = typer.Option(20, "--limit", help="Show at most this many, newest first, 0 = all (default 20)."),
    ) -> None:
        """List saved conversations, most recently updated first (`show`, `rm`, `export` below)."""
        if ctx.invoked_subcommand is not None:
            return
        if not 0 <= limit <= MAX_ID:
            fail(f"--limit must be between 0 (all) and 2^63 - 1, got {limit}")
        from localspec.chats.export import local_time, summary_dict

        rows = _run(lambda store: store.list_conversations(limit or None))
        if as_json:
            typer.echo(json.dumps([summary_dict(s) for s in rows], ensure_ascii=False, indent=2))
            return
        if not rows:
            from localspec.chats.store import default_path

            typer.echo(f"no saved conversations ({default_path()})")
            return
        from localspec.chats.conversation import short_title

        table = [("ID", "UPDATED", "MESSAGES", "TITLE")]
        for s in rows:   # the title shortened for the table; --json, show and export have it whole
            title = short_title(s.title or "(untitled)") + ("  [partial]" if s.partial else "")
            table.append((str(s.id), local_time(s.updated), str(s.n_messages), title))
        widths = [max(len(row[i]) for row in table) for i in range(3)]
        for row in table:
            typer.echo("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[3]]).rstrip())

    @history.command("show")
    def show_command(
        conv_id: str = typer.Argument(..., metavar="ID", help="A conversation id from `localspec history`."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON (the export format)."),
        as_md: bool = typer.Option(False, "--md", help="Print Markdown (the default)."),
    ) -> None:
        """Print one conversation."""
        from localspec.chats import export

        if as_json and as_md:
            fail("choose one of --json and --md")
        conv = _get(conv_id)
        typer.echo(export.to_json(conv) if as_json else export.to_markdown(conv), nl=False)

    @history.command("rm")
    def rm_command(conv_id: str = typer.Argument(..., metavar="ID", help="The conversation to delete.")) -> None:
        """Delete one conversation and its messages."""
        number = _id(conv_id)
        if not _run(lambda store: store.delete(number)):
            fail(f"no conversation {number} (see `localspec history`)")
        typer.echo(f"deleted conversation {number}")

    @history.command("export")
    def export_command(
        conv_id: str = typer.Argument(..., metavar="ID", help="The conversation to export."),
        fmt: str = typer.Argument(..., metavar="md|json", help="Markdown or JSON."),
        path: str = typer.Argument(..., metavar="PATH", help="File to write; '-' writes to stdout."),
    ) -> None:
        """Write one conversation to a file as Markdown or JSON."""
        from localspec.chats import export

        if fmt not in FORMATS:
            fail(f"format must be md or json, got {shown(fmt)}")
        conv = _get(conv_id)
        text = export.to_json(conv) if fmt == "json" else export.to_markdown(conv)
        if path == "-":
            sys.stdout.write(text)
            return
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as e:
            fail(f"cannot write {path}: {e.strerror or e}")
        typer.echo(f"wrote conversation {conv.id} ({len(conv.messages)} messages) to {path}")


def _run(op):
    """op(store) on the history database; a database that cannot be used is one line and exit 2."""
    from localspec.chats.store import Store, StoreError, default_path, open_store

    if not default_path().exists():   # nothing saved yet: reading must not create the file
        return op(Store.null("no history yet"))
    try:
        store = open_store(strict=True)
        try:
            return op(store)
        finally:
            store.close()
    except StoreError as e:
        fail(e)


def _id(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        fail(f"a conversation id is a number from `localspec history`, got {shown(text)}")
    if not 1 <= number <= MAX_ID:
        fail(f"no conversation {number} (ids run from 1 to 2^63 - 1)")
    return number


def _get(text: str):
    number = _id(text)
    conv = _run(lambda store: store.get(number))
    if conv is None:
        fail(f"no conversation {number} (see `localspec history`)")
    return conv
