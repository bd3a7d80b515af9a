"""`localspec` command line: generate, plus commands registered by other modules and by `tui`."""

from __future__ import annotations

import json
import secrets
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import List, NoReturn, Optional

import typer

from . import cli_options as o
from .config import ConfigError, DecodeConfig, SamplingConfig

app = typer.Typer(
    name="localspec",
    help="Exact speculative decoding for local LLMs on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail(message: object) -> NoReturn:
    """One line on stderr, exit code 2: how every bad input ends."""
    text = " ".join(str(message).split()) or type(message).__name__
    typer.echo(f"error: {text}", err=True)
    raise typer.Exit(2)


def parse_k(value: str | None) -> int | None:
    """'auto' (None) or a non-negative integer."""
    if value is None or value.strip().lower() == "auto":
        return None
    try:
        k = int(value)
    except ValueError:
        fail(f"draft tokens (-k) must be a number or 'auto', got {value!r}")
    if k < 0:
        fail(f"draft tokens (-k) must be >= 0, got {k}")
    return k


@dataclass(frozen=True)
class Resolved:
    """Options after merging: explicit flag > preset > built-in default."""

    load: object
    sampling: SamplingConfig
    k: int | None


def resolve_options(
    *,
    preset: str | None,
    target: str | None,
    draft: str | None,
    drafter: str | None,
    k: str | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    seed: int | None,
    n_ctx: int | None,
    threads: int | None,
    target_gpu_layers: int | None,
    draft_gpu_layers: int | None,
) -> Resolved:
    """Shared by generate, bench and chat so that every command reads options the same way."""
    from .session import LoadConfig

    base = SamplingConfig()
    p = None
    if preset:
        from .presets import load_preset, resolve_model

        p = load_preset(preset)
        if target is None:
            target = str(resolve_model(p.target, preset=p.name))
        if draft is None and p.draft is not None and (drafter or p.drafter) == "model":
            draft = str(resolve_model(p.draft, preset=p.name))
        drafter = drafter or p.drafter
        base = p.sampling()
        n_ctx = n_ctx or p.n_ctx
    pick = lambda given, default: default if given is None else given  # noqa: E731
    sampling = SamplingConfig(
        temperature=pick(temperature, base.temperature),
        top_k=pick(top_k, base.top_k),
        top_p=pick(top_p, base.top_p),
        min_p=pick(min_p, base.min_p),
        seed=seed if seed is not None else secrets.randbits(31),
    )
    load = LoadConfig(
        target=target,
        draft=draft,
        drafter=drafter,
        n_ctx=pick(n_ctx, 4096),
        threads=threads,
        target_gpu_layers=pick(target_gpu_layers, -1),
        draft_gpu_layers=pick(draft_gpu_layers, -1),
    )
    k_value = parse_k(k) if k is not None else (p.k if p is not None else None)
    return Resolved(load, sampling, k_value)


def read_prompt(prompt: str) -> str:
    if prompt == "-":
        text = sys.stdin.read()
        if not text.strip():
            fail("empty prompt on stdin")
        return text
    if not prompt:
        fail("empty prompt")
    return prompt


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="The prompt; '-' reads it from stdin."),
    target: o.Target = None,
    draft: o.Draft = None,
    drafter: o.Drafter = None,
    k: Optional[str] = typer.Option(None, "-k", "--draft-tokens", help="Draft tokens per step: N or 'auto' (default)."),
    temperature: o.Temperature = None,
    top_k: o.TopK = None,
    top_p: o.TopP = None,
    min_p: o.MinP = None,
    seed: o.Seed = None,
    max_tokens: int = typer.Option(256, "--max-tokens", help="Stop after this many tokens."),
    n_ctx: o.NCtx = None,
    threads: o.Threads = None,
    target_gpu_layers: o.TargetGpuLayers = None,
    draft_gpu_layers: o.DraftGpuLayers = None,
    chat: bool = typer.Option(True, "--chat/--raw", help="Apply the GGUF's chat template (default) or send raw text."),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt (chat mode)."),
    stop: Optional[List[str]] = typer.Option(None, "--stop", help="Stop string (repeatable)."),
    preset: o.Preset = None,
    no_warm_start: o.NoWarmStart = False,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
) -> None:
    """Generate text with speculative decoding; the output is distributed exactly as the target's."""
    from .engine import EngineError

    text = read_prompt(prompt)
    try:
        opts = resolve_options(
            preset=preset, target=target, draft=draft, drafter=drafter, k=k, temperature=temperature,
            top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, n_ctx=n_ctx, threads=threads,
            target_gpu_layers=target_gpu_layers, draft_gpu_layers=draft_gpu_layers,
        )
        decode = DecodeConfig(max_tokens=max_tokens, k=opts.k, stop=tuple(stop or ()))
        _generate(text, opts, decode, chat, system, as_json, warm=not no_warm_start)
    except (ConfigError, EngineError) as e:
        fail(e)


def _generate(text, opts: Resolved, decode: DecodeConfig, chat: bool, system, as_json: bool,
              warm: bool = True) -> None:
    import time

    from . import warmstart
    from .controller import KController
    from .session import Session
    from .stats import RunStats
    from .stream import stream_text

    session = Session.load(opts.load)
    target = session.target
    chat = session.chat_or_raw(chat, lambda m: typer.echo(m, err=True))
    tokens = session.prompt_tokens(text, chat, system)
    session.check_fits(tokens)
    drafter = session.make_drafter()
    controller = KController(decode.k_max, fixed_k=decode.k, draft_cost_free=bool(drafter and drafter.draft_cost_free))
    temperature = opts.sampling.temperature
    warmed = warm and drafter is not None and warmstart.load_into(controller, session, drafter.name, temperature)
    stats = RunStats()
    pieces: list[str] = []
    out_tokens: list[int] = []
    start = time.perf_counter()
    first_step_at = None
    for chunk in stream_text(target, drafter, tokens, opts.sampling, decode, controller):
        if first_step_at is None:
            first_step_at = time.perf_counter() - start - chunk.step.t_draft - chunk.step.t_verify - chunk.step.t_python
        stats.add(chunk.step)
        out_tokens.extend(chunk.step.tokens)
        pieces.append(chunk.text)
        if not as_json and chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    result = {
        "text": "".join(pieces),
        "tokens": out_tokens,
        **stats.summary(),
        "prefill_seconds": first_step_at,
        "n_prompt_tokens": len(tokens),
        "acceptance_by_position": stats.acceptance_by_position(),
        "drafter": session.drafter_kind,
        "k": "auto" if decode.k is None else decode.k,
        "temperature": opts.sampling.temperature,
        "top_k": opts.sampling.top_k,
        "top_p": opts.sampling.top_p,
        "min_p": opts.sampling.min_p,
        "seed": opts.sampling.seed,
        "target": str(target.path),
        "draft": str(session.draft.path) if session.draft else None,
        "warm_start": bool(warmed),
    }
    if warm and drafter is not None:
        warmstart.save(controller, session, drafter.name, temperature)
    session.close()
    if as_json:
        typer.echo(json.dumps(result, ensure_ascii=False))
        return
    sys.stdout.write("\n")
    typer.echo(summary_line(result), err=True)


def summary_line(r: dict) -> str:
    alpha = "—" if r["alpha"] is None else f"{r['alpha']:.3f}"
    tps = r["tokens_per_second"] or 0.0
    return (
        f"α {alpha} · {r['tokens_per_step'] or 0:.2f} tokens/target pass · {tps:.1f} tokens/s · "
        f"{r['n_steps']} steps · {r['n_tokens']} tokens · drafter {r['drafter']} · k {r['k']}"
    )


def _register_commands() -> None:
    from . import cli_bench, cli_doctor, cli_presets

    for module in (cli_presets, cli_bench, cli_doctor):
        module.register(app)
    # Commands from other packages (the terminal UI registers `chat`) arrive through entry points,
    # so this package never imports them directly.
    for ep in entry_points(group="localspec.commands"):
        ep.load()(app)


_register_commands()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("\ninterrupted", err=True)
        raise SystemExit(130)
