"""The ``localspec bench`` command; localspec.cli calls register(app). The logic is in localspec.bench."""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from localspec import cli_options as o


def register(app: typer.Typer) -> None:
    """Add the ``bench`` command to ``app``."""

    @app.command("bench")
    def bench_command(
        target: o.Target = None,
        draft: o.Draft = None,
        drafter: o.Drafter = None,
        k: Optional[str] = typer.Option(
            None, "-k", "--draft-tokens",
            help="Draft tokens per step: N, 'auto' (default), or a sweep like 1,2,4,8 (one variant each).",
        ),
        temperature: o.Temperature = None,
        top_k: o.TopK = None,
        top_p: o.TopP = None,
        min_p: o.MinP = None,
        seed: o.Seed = None,
        max_tokens: int = typer.Option(128, "--max-tokens", help="Tokens per prompt (a prompt's own max_tokens wins)."),
        n_ctx: o.NCtx = None,
        threads: o.Threads = None,
        target_gpu_layers: o.TargetGpuLayers = None,
        draft_gpu_layers: o.DraftGpuLayers = None,
        chat: bool = typer.Option(True, "--chat/--raw", help="Apply the GGUF's chat template (default) or send raw text."),
        preset: o.Preset = None,
        prompts: Optional[str] = typer.Option(
            None, "--prompts", metavar="FILE.jsonl",
            help='Your own suite: one {"category": ..., "prompt": ..., "max_tokens": N} per line.',
        ),
        repeat: int = typer.Option(1, "--repeat", help="Run the suite N times."),
        category: Optional[List[str]] = typer.Option(None, "--category", help="Only this category (repeatable)."),
        compare: Optional[str] = typer.Option(
            None, "--compare", metavar="llama-cpp-python",
            help="Also time llama-cpp-python's own Llama.generate, plain and with prompt lookup.",
        ),
        warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="One uncounted warm-up run per variant."),
        no_warm_start: o.NoWarmStart = False,
        as_json: bool = typer.Option(False, "--json", help="Print the full report as JSON (schema: docs/bench-schema.md)."),
    ) -> None:
        """Benchmark plain vs speculative decoding on a prompt suite: α, tokens/s, speedup, bound."""
        from localspec import bench
        from localspec.cli import fail, resolve_options
        from localspec.config import ConfigError
        from localspec.engine import EngineError

        session = None
        try:
            ks = bench.parse_k_sweep(k) if k is not None else None
            if repeat < 1:
                raise ConfigError(f"repeat must be >= 1, got {repeat}")
            if max_tokens < 1:
                raise ConfigError(f"max-tokens must be >= 1, got {max_tokens}")
            if compare is not None and compare not in bench.COMPARE:
                raise ConfigError(f"--compare must be one of: {', '.join(bench.COMPARE)}; got {compare!r}")
            suite = bench.select_categories(bench.load_prompts(prompts), category)
            opts = resolve_options(
                preset=preset, target=target, draft=draft, drafter=drafter, k=None, temperature=temperature,
                top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, n_ctx=n_ctx, threads=threads,
                target_gpu_layers=target_gpu_layers, draft_gpu_layers=draft_gpu_layers,
            )
            if ks is None:
                ks = [opts.k] if opts.k else [None]  # a preset's k, else adaptive
            if opts.load.drafter == "none":
                raise ConfigError("bench compares plain with speculative decoding; --drafter none leaves nothing to compare")
            from localspec.session import Session

            session = Session.load(opts.load)
            options = bench.BenchOptions(
                sampling=opts.sampling, ks=tuple(ks), max_tokens=max_tokens, repeat=repeat, chat=chat,
                compare=compare, warmup=warmup, warm_start=not no_warm_start,
            )
            with _progress_bar() as progress:
                report = bench.run_bench(session, suite, options, prompts_file=prompts, progress=progress,
                                         notice=lambda m: typer.echo(m, err=True))
        except (ConfigError, EngineError) as e:
            fail(e)
        finally:
            if session is not None:
                session.close()
        if as_json:
            typer.echo(json.dumps(report, ensure_ascii=False, indent=2))
        else:
            typer.echo(format_report(report))


class _progress_bar:
    """A rich progress bar on stderr while the suite runs; nothing when stderr is not a terminal."""

    def __enter__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        console = Console(stderr=True)
        self._bar = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True, refresh_per_second=4,
                             disable=not console.is_terminal)
        self._bar.__enter__()
        self._task = None
        return self

    def __call__(self, done: int, total: int, what: str) -> None:
        if self._task is None:
            self._task = self._bar.add_task(what, total=total)
        self._bar.update(self._task, completed=done, description=what)

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)


# ---- the table -------------------------------------------------------------------------------


def _f(x, fmt: str = ".1f", none: str = "—") -> str:
    return none if x is None else format(x, fmt)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def _groups(report: dict):
    yield from report["categories"].items()
    yield "overall", report["overall"]


def format_report(report: dict) -> str:
    from pathlib import Path

    c = report["config"]
    name = lambda p: Path(p).name if p else "—"  # noqa: E731
    temp = "greedy (T=0)" if c["temperature"] == 0 else (
        f"T={c['temperature']:g} top-k {c['top_k']} top-p {c['top_p']:g} min-p {c['min_p']:g}")
    lines = [
        f"localspec bench · target {name(c['target'])} · draft {name(c['draft'])} · drafter {c['drafter']}",
        f"{temp} · seed {c['seed']} · max {c['max_tokens']} tokens · {c['n_prompts']} prompts × {c['repeat']} · "
        f"{c['threads']} thread{'' if c['threads'] == 1 else 's'} · {'chat template' if c['chat'] else 'raw prompts'}",
    ]
    for key in report["overall"]["spec"]:
        lines += ["", f"speculative k={key}" + (" (adaptive, one controller across the suite)" if key == "auto" else "")]
        rows = [["category", "n", "α", "acc len", "tok/pass", "plain t/s", "spec t/s", "speedup (median)", "bound (k)",
                 "p50/p99 ms", "draft/verify/py %", "verify ms/step", "host ms/step (/row)", "draft host ms/tok"]]
        for group, g in _groups(report):
            s, p = g["spec"][key], g["plain"]
            b = s["bound"]
            ts = s["time_split"]
            total = sum(ts.values()) or 1.0
            split = "/".join(f"{100 * ts[x] / total:.0f}" for x in ("draft", "verify")) + \
                f"/{100 * (ts['python'] + ts['outside']) / total:.0f}"
            lat = s["latency_ms"]
            rows.append([
                group, str(g["n_prompts"]), _f(s["alpha"], ".3f"), _f(s["mean_accepted"], ".2f"),
                _f(s["tokens_per_step"], ".2f"), _f(p["tokens_per_second"]), _f(s["tokens_per_second"]),
                f"{_f(s['speedup'], '.2f')}× ({_f(s['speedup_median'], '.2f')}×)",
                "—" if b is None else f"{b['speedup']:.2f}× ({b['k']})",
                f"{_f(lat['p50'])}/{_f(lat['p99'])}", split, _f(s["verify_ms_per_step"], ".2f"),
                f"{_f(s['host']['target_ms_per_step'], '.2f')} ({_f(s['host']['target_ms_per_row'], '.3f')})",
                _f(s["host"]["draft_ms_per_token"], ".3f"),
            ])
        lines += _table(rows)
        o = report["overall"]
        s = o["spec"][key]
        lines.append("acceptance by position: " + (" ".join(f"{a:.2f}" for a in s["acceptance_by_position"]) or "—"))
        match = "" if s["greedy_match"] is None else f" · identical to plain: {100 * s['greedy_match']:.0f}% of runs"
        lines.append(f"plain step: {_f(o['plain']['plain_step_ms'], '.2f')} ms in plain runs (host "
                     f"{_f(o['plain']['host']['target_ms_per_step'], '.2f')} ms), "
                     f"{_f(s['plain_step_ms'], '.2f')} ms when the speculative path decodes plainly "
                     f"({s['n_plain_steps']} of {s['n_steps']} steps)")
        lines.append(f"mean k {_f(s['mean_k'], '.2f')} · plain p50/p99 {_f(o['plain']['latency_ms']['p50'])}/"
                     f"{_f(o['plain']['latency_ms']['p99'])} ms · prefill {_prefill(o['plain'])} plain, "
                     f"{_prefill(s)} spec{match}")
    ref = report["overall"]["reference"]
    if ref:
        lines += ["", f"llama-cpp-python (Llama.generate, same GGUF and threads; lookup = LlamaPromptLookupDecoding, "
                      f"num_pred_tokens {c['reference_lookup_tokens']})"]
        keys = list(report["overall"]["spec"])
        head = ["category", "lcp t/s", "lcp+lookup t/s", "localspec plain t/s"]
        for key in keys:
            head += [f"k={key} t/s", "× lcp", "× lcp+lookup"]
        rows = [head]
        for group, g in _groups(report):
            r = g["reference"]
            row = [group, _f(r["plain"]["tokens_per_second"]), _f(r["lookup"]["tokens_per_second"]),
                   _f(g["plain"]["tokens_per_second"])]
            for key in keys:
                row += [_f(g["spec"][key]["tokens_per_second"]),
                        _f(r["plain"]["localspec_speedup"][key], ".2f") + "×",
                        _f(r["lookup"]["localspec_speedup"][key], ".2f") + "×"]
            rows.append(row)
        lines += _table(rows)
    lines += ["", "t/s = generated tokens / decode seconds (prefill excluded); speedup = spec t/s ÷ plain t/s in "
                  "this run (median: of the per-prompt ratios); bound = E(k)·t_plain / (k·t_draft + t_verify(k+1)) from the measured acceptance and costs."]
    return "\n".join(lines)


def _prefill(s: dict) -> str:
    n = s["n_runs"]
    return "—" if not n else f"{1000 * s['prefill_seconds'] / n:.0f} ms/prompt"
