"""`localspec chat`, registered on the main Typer app through the "localspec.commands" entry point."""

from __future__ import annotations

from typing import Optional

import typer

from localspec.cli import options as o


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)


@o.with_options(o.models_for("chat"), o.SAMPLING)
def chat(
    max_tokens: Optional[int] = typer.Option(
        None, "--max-tokens",
        help="Stop a reply after this many tokens (default: no cap; a reply runs until the model stops or the "
             "context is full, and /continue goes on after a cap)."),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    no_save: bool = typer.Option(False, "--no-save", help="Do not save this conversation (see `localspec history`)."),
    # A flag and an argument, not an option with an optional value (which this Typer cannot
    # declare): `--resume` alone is the last conversation, `--resume 3` conversation 3.
    resume: bool = typer.Option(False, "--resume", help="Continue a saved conversation: the last one, or ID."),
    conv_id: Optional[str] = typer.Argument(None, metavar="ID",
                                            help="With --resume: a conversation id from `localspec history`."),
    options: dict = None,
    k: o.DraftTokens = None,
    tree: o.Tree = o.TREE_DEFAULT,
    no_warm_start: o.NoWarmStart = False,
) -> None:
    """Chat in the terminal, watching speculation work: α, k, tokens/s and which words the draft wrote.
    Conversations are saved (`localspec history` lists them; Ctrl+O in the chat)."""
    from localspec.config import ConfigError, DecodeConfig
    from localspec.engine import EngineError

    import sys
    from dataclasses import replace

    from localspec.loading.session import resolve_files

    store = None
    try:
        opts = o.resolve(options, k=k, tree=tree)
        # validates --max-tokens (when given) and -k now, in one line
        DecodeConfig(**({} if max_tokens is None else {"max_tokens": max_tokens}), k=opts.k)
        system = None if system is None else o.utf8(system, "--system")
        if conv_id is not None and not resume:
            raise ConfigError(f"unexpected argument {conv_id!r} (to continue a conversation: --resume {conv_id})")
        store, conversation = open_history(no_save, (conv_id or "last") if resume else None)
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise ConfigError("chat needs a terminal (stdin or stdout is not one); "
                              "use `localspec generate` in scripts and pipes")
        # Missing or broken model files are reported here, in the shell, as `generate` does.
        opts = replace(opts, load=resolve_files(opts.load, lambda m: typer.echo(m, err=True)))
        if opts.sampling.grammar:   # a bad one is refused here, not by every message on the screen
            from localspec.engine.grammar import check_grammar

            check_grammar(opts.load.target, opts.sampling.grammar)
    except (ConfigError, EngineError) as e:
        if store is not None:
            store.close()
        o.fail(e)
    # The screen needs a core too (o.RESERVE): the thread choice leaves it one.
    opts = replace(opts, load=replace(opts.load, reserve_cores=o.RESERVE["chat"][0]))

    from .app import ChatApp   # Textual is imported only when the chat really starts

    app = ChatApp(opts.load, opts.sampling, k=opts.k, max_tokens=max_tokens, system=system,
                  warm_start=not no_warm_start, store=store, resume=conversation, tree=opts.tree)
    # The reply worker needs the GIL back after every llama.cpp call; with Python's default 5 ms
    # switch interval a busy UI thread (Markdown of a long paragraph) held it so long that a
    # reply streamed at half of `generate`'s speed (measured: 0.51x, and 0.81x with 0.5 ms).
    sys.setswitchinterval(0.0005)
    try:
        app.run()
    finally:
        if store is not None:
            store.close()   # the reply thread has ended (App.run waits for its workers): all written
    if app.session is not None:
        app.session.close()
    if app.load_error:
        o.fail(app.load_error)  # the screen is gone; say why once more, and exit 2 like `generate`


def open_history(no_save: bool, resume: str | None):
    """(store to save into or None, the conversation to resume or None). A bad --resume is a
    ConfigError, reported before the screen opens; a store that cannot be used only turns saving
    off (the chat says so), unless --resume needs it."""
    from localspec.config import ConfigError
    from localspec.chats.store import default_path, open_store

    if no_save and resume is None:
        return None, None   # the history file is not even opened
    if resume is not None and not default_path().exists():   # reading must not create the file
        raise ConfigError(f"no saved conversation to resume ({default_path()} does not exist yet)")
    store = open_store()
    try:
        conversation = _find(store, resume)
    except ConfigError:
        store.close()
        raise
    if no_save:
        store.close()
        store = None
    return store, conversation


def _find(store, resume: str | None):
    from localspec.config import ConfigError

    conversation = None
    if resume is not None:
        if store.disabled:
            raise ConfigError(f"cannot resume: {store.notice}")
        if resume == "last":
            conv_id = store.last_id()
            if conv_id is None:
                raise ConfigError("no saved conversation to resume (see `localspec history`)")
        else:
            try:
                conv_id = int(resume)
            except ValueError:
                raise ConfigError(f"--resume takes a conversation id from `localspec history`, got {resume!r}") from None
        conversation = store.get(conv_id)
        if conversation is None:
            raise ConfigError(f"no conversation {conv_id} to resume (see `localspec history`)")
    return conversation
