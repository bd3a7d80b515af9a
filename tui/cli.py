"""`localspec chat`, registered on the main Typer app through the "localspec.commands" entry point."""

from __future__ import annotations

from typing import Optional

import typer

from localspec import cli_options as o


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)


@o.with_options(o.MODELS, o.SAMPLING)
def chat(
    options: dict = None,
    k: o.DraftTokens = None,
    max_tokens: o.MaxTokens = 256,
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    no_warm_start: o.NoWarmStart = False,
) -> None:
    """Chat in the terminal, watching speculation work: α, k, tokens/s and which words the draft wrote."""
    from localspec.config import ConfigError, DecodeConfig
    from localspec.engine import EngineError

    import sys
    from dataclasses import replace

    from localspec.session import resolve_files

    try:
        opts = o.resolve(options, k=k)
        DecodeConfig(max_tokens=max_tokens, k=opts.k)   # validates max-tokens and -k now, in one line
        system = None if system is None else o.utf8(system, "--system")
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise ConfigError("chat needs a terminal (stdin or stdout is not one); "
                              "use `localspec generate` in scripts and pipes")
        # Missing or broken model files are reported here, in the shell, as `generate` does.
        opts = replace(opts, load=resolve_files(opts.load, lambda m: typer.echo(m, err=True)))
    except (ConfigError, EngineError) as e:
        o.fail(e)
    if options["threads"] is None:
        # The screen needs a core too: llama.cpp's threads spin-wait for each other, and one of them
        # descheduled by the UI slows decoding ~10× (measured on 2 cores: 6.6 vs 41.6 tokens/s).
        from localspec.engine import default_threads

        opts = replace(opts, load=replace(opts.load, threads=max(1, default_threads() - 1)))

    from .app import ChatApp   # Textual is imported only when the chat really starts

    app = ChatApp(opts.load, opts.sampling, k=opts.k, max_tokens=max_tokens, system=system,
                  warm_start=not no_warm_start)
    app.run()
    if app.session is not None:
        app.session.close()   # the reply thread has ended: App.run waits for its workers
    if app.load_error:
        o.fail(app.load_error)  # the screen is gone; say why once more, and exit 2 like `generate`
