"""`localspec chat`, registered on the main Typer app through the "localspec.commands" entry point."""

from __future__ import annotations

from typing import Optional

import typer

from localspec import cli_options as o


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)


def chat(
    target: o.Target = None,
    draft: o.Draft = None,
    drafter: o.Drafter = None,
    k: Optional[str] = typer.Option(None, "-k", "--draft-tokens", help="Draft tokens per step: N or 'auto' (default)."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="0 = greedy (default 0.8); F4 changes it."),
    top_k: o.TopK = None,
    top_p: o.TopP = None,
    min_p: o.MinP = None,
    seed: o.Seed = None,
    max_tokens: int = typer.Option(256, "--max-tokens", help="Longest reply, in tokens."),
    n_ctx: Optional[int] = typer.Option(None, "--n-ctx", help="Context length (default 4096); older turns are dropped beyond it."),
    threads: o.Threads = None,
    target_gpu_layers: o.TargetGpuLayers = None,
    draft_gpu_layers: o.DraftGpuLayers = None,
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    preset: o.Preset = None,
    no_warm_start: o.NoWarmStart = False,
) -> None:
    """Chat in the terminal, watching speculation work: α, k, tokens/s and which words the draft wrote."""
    from localspec.cli import fail, resolve_options
    from localspec.config import ConfigError, DecodeConfig
    from localspec.engine import EngineError

    try:
        opts = resolve_options(
            preset=preset, target=target, draft=draft, drafter=drafter, k=k, temperature=temperature,
            top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, n_ctx=n_ctx, threads=threads,
            target_gpu_layers=target_gpu_layers, draft_gpu_layers=draft_gpu_layers,
        )
        DecodeConfig(max_tokens=max_tokens, k=opts.k)   # validates max-tokens and -k now, in one line
    except (ConfigError, EngineError) as e:
        fail(e)
    if threads is None:
        # The screen needs a core too: llama.cpp's threads spin-wait for each other, and one of them
        # descheduled by the UI slows decoding ~10× (measured on 2 cores: 6.6 vs 41.6 tokens/s).
        from dataclasses import replace

        from localspec.engine import default_threads

        opts = replace(opts, load=replace(opts.load, threads=max(1, default_threads() - 1)))

    from .app import ChatApp   # Textual is imported only when the chat really starts

    app = ChatApp(opts.load, opts.sampling, k=opts.k, max_tokens=max_tokens, system=system,
                  warm_start=not no_warm_start)
    app.run()
    if app.session is not None:
        app.session.close()   # the reply thread has ended: App.run waits for its workers
    if app.load_error:
        fail(app.load_error)  # the screen is gone; say why once more, and exit 2 like `generate`
