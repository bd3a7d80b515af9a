"""The ``localspec bench`` command; localspec.cli.app calls register(app). The logic is in localspec.bench.run."""

from __future__ import annotations

import json
from typing import List, Optional

import typer
from typer.core import TyperCommand

from . import options as o
from .constraint_options import DraftMask
from .panels import SPECULATION

CATEGORY_HELP = "Only this category (repeatable): {names} in the built-in suite, or those of --prompts."


class _BenchCommand(TyperCommand):
    """`bench`, whose --category help names the categories of the built-in suite, read from the
    suite itself when the help is shown: reading it on registering would load the bench module
    (and numpy) at every start of `localspec`, whichever command runs."""

    def format_help(self, ctx, formatter):
        from localspec.bench import run as bench

        names = ", ".join(bench.categories_of(bench.load_prompts()))
        for param in self.params:
            if param.name == "category":
                param.help = CATEGORY_HELP.format(names=names)
        return super().format_help(ctx, formatter)


def register(app: typer.Typer) -> None:
    """Add the ``bench`` command to ``app``."""

    @app.command("bench", cls=_BenchCommand)
    @o.with_options(o.MODELS, o.SAMPLING)
    def bench_command(
        max_tokens: int = o.max_tokens(128),
        chat: o.ChatTemplate = True,
        prompts: Optional[str] = typer.Option(
            None, "--prompts", metavar="FILE",
            help='Your own suite, JSON lines: one {"category": ..., "prompt": ..., "max_tokens": N} per line.',
        ),
        repeat: int = typer.Option(1, "--repeat", help="Run the suite N times (default 1)."),
        category: Optional[List[str]] = typer.Option(None, "--category", help="Only this category (repeatable)."),
        compare: Optional[str] = typer.Option(
            None, "--compare", metavar="llama-cpp-python",
            help="Also time llama-cpp-python's own Llama.generate, plain and with prompt lookup.",
        ),
        warmup: bool = typer.Option(
            True, "--warmup/--no-warmup", help="One uncounted warm-up run per variant (default --warmup)."),
        concurrency: Optional[str] = typer.Option(
            None, "--concurrency", metavar="LEVELS",
            help="Run the suite with this many generations at once (a comma list like 1,2,4: one level each), plain batched "
                 "decoding against speculation at each: total and per-request tokens/s, inter-token latency, α."),
        constraints: bool = typer.Option(
            False, "--constraints",
            help="JSON extraction (prompts with a schema: the json category) five ways, interleaved: plain and "
                 "speculative unconstrained, and under the schema plain, with the draft masked, and unmasked."),
        as_json: bool = typer.Option(False, "--json", help="Print the full report as JSON (schema: docs/bench-schema.md)."),
        options: dict = None,
        k: Optional[str] = typer.Option(
            None, "-k", "--draft-tokens", metavar="auto|N|SWEEP", rich_help_panel=SPECULATION,
            help="Draft tokens per step: auto, a number N, or a SWEEP like 1,2,4,8 (one variant each) (default auto).",
        ),  # a sweep: its own declaration
        tree: str = typer.Option(
            o.TREE_DEFAULT, "--tree", metavar="auto|off|SHAPE", rich_help_panel=SPECULATION,
            help=f"Draft trees: auto, off or a SHAPE like 2,2, as for generate. Not off: each speculative variant (auto's, "
                 f"under --drafter auto) runs twice, interleaved, as chains and with trees, set against each other "
                 f"(default {o.TREE_DEFAULT})."),
        no_warm_start: o.NoWarmStart = False,
        draft_mask: DraftMask = True,
    ) -> None:
        """Benchmark plain vs speculative decoding on a prompt suite: α, tokens/s, speedup, bound."""
        from dataclasses import replace

        from localspec.bench import run as bench, report as bench_report
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
                raise ConfigError(f"--compare must be one of: {', '.join(bench.COMPARE)}; got {o.shown(compare)}")
            suite = bench.select_categories(bench.load_prompts(prompts), category)
            opts = o.resolve(options, tree=tree)  # -k is a sweep here, parsed above
            if constraints and (concurrency is not None or compare is not None):
                # each is a mode of its own: one would have been dropped without a word
                raise ConfigError("--constraints runs on its own: leave out --concurrency and --compare")
            if ks is None:
                ks = [opts.k] if opts.k else [None]  # a preset's k, else adaptive
            if opts.load.drafter == "none":
                raise ConfigError("bench compares plain with speculative decoding; --drafter none leaves nothing to compare")
            from localspec.loading.session import Session

            if concurrency is not None:
                from localspec.bench import concurrency as conc

                levels = conc.parse_levels(concurrency)
                if compare is not None:
                    raise ConfigError("--compare runs one generation at a time; leave it out with --concurrency")
                session = Session.load(replace(opts.load, parallel=max(levels)))
                chat_on = session.chat_or_raw(chat, lambda m: typer.echo(m, err=True))
                encoded = [session.prompt_tokens(p.prompt, chat_on, p.system) for p in suite]
                for toks, p in zip(encoded, suite):
                    session.check_fits(toks, f"prompt {p.source}")
                with _progress_bar() as progress:
                    report = conc.run_concurrency(
                        session, encoded, [p.max_tokens or max_tokens for p in suite], levels, opts.sampling,
                        ks, opts.tree, repeat, warmup, progress)
                typer.echo(json.dumps(report, ensure_ascii=False, indent=2) if as_json else conc.format_concurrency(report))
                return
            if constraints:
                from localspec.bench import constrained

                session = Session.load(opts.load)
                chat_on = session.chat_or_raw(chat, lambda m: typer.echo(m, err=True))
                encoded = [session.prompt_tokens(p.prompt, chat_on, p.system) for p in suite]
                with _progress_bar() as progress:
                    report = constrained.run_constraints(
                        session, encoded, [p.schema for p in suite], [p.max_tokens or max_tokens for p in suite],
                        opts.sampling, ks[0], opts.tree, repeat, warmup, progress)
                typer.echo(json.dumps(report, ensure_ascii=False, indent=2) if as_json
                           else constrained.format_constraints(report))
                return
            session = Session.load(opts.load)
            options = bench.BenchOptions(
                sampling=opts.sampling, ks=tuple(ks), max_tokens=max_tokens, repeat=repeat, chat=chat,
                compare=compare, warmup=warmup, warm_start=not no_warm_start, tree=opts.tree,
                mask_draft=draft_mask,
            )
            with _progress_bar() as progress:
                report = bench.run_bench(session, suite, options, prompts_file=prompts, progress=progress,
                                         notice=lambda m: typer.echo(m, err=True))
        except (ConfigError, EngineError) as e:
            o.fail(e)
        finally:
            if session is not None:
                session.close()
        if as_json:
            typer.echo(json.dumps(report, ensure_ascii=False, indent=2))
        else:
            typer.echo(bench_report.format_report(report))


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
