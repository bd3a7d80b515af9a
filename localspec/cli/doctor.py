"""The ``localspec doctor`` command; localspec.cli.app calls register(app)."""

from __future__ import annotations

import json
from typing import Optional

import typer

from . import options as o

MAX_SECONDS = 3600
"""The longest calibration `--seconds` asks for: an hour measures α and costs many times over."""


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to ``app``."""

    @app.command("doctor")
    @o.with_options(o.MODELS)
    def doctor_command(
        options: dict = None,
        drafter: Optional[str] = typer.Option(
            None, "--drafter", metavar="auto|model|lookup|none",
            help="Measure only this drafter; auto: the two it chooses between (default: every one available)."),
        seconds: float = typer.Option(
            20.0, "--seconds", help="Calibration time budget in seconds, 0 skips calibration (default 20)."),
        temperature: Optional[float] = typer.Option(None, "--temperature", help="Temperature to measure α at (default: the preset's or 0.8)."),
        forget: bool = typer.Option(False, "--forget", help="Delete what the k controller learned on this pair and machine (its warm start)."),
        save_anyway: bool = typer.Option(False, "--save-anyway", help=(
            "Write the calibration to the warm-start record even when other work took the cores it needed "
            "(it is not written then: its timings describe a slower machine).")),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the report."),
    ) -> None:
        """Check the llama.cpp build, a target/draft pair and this machine; recommend drafter and k."""
        from localspec.config import ConfigError
        from localspec.engine import EngineError

        if not 0 <= seconds <= MAX_SECONDS:   # false for nan too; inf would calibrate forever
            o.fail(f"--seconds must be between 0 and {MAX_SECONDS}, got {seconds:g}")
        try:
            opts = o.resolve(options, drafter=drafter, temperature=temperature, seed=0)
            target_path, draft_path, drafters = _pair(opts.load, explicit=drafter)
            from localspec.doctor import checks as doctor, report as doctor_report

            report = doctor.diagnose(
                target_path, draft_path, drafters, n_ctx=opts.load.n_ctx, threads=opts.load.threads,
                gpu_layers={"target": opts.load.target_gpu_layers, "draft": opts.load.draft_gpu_layers},
                sampling=opts.sampling, seconds=seconds, forget=forget, save_anyway=save_anyway,
                placement={"target": opts.load.target_placement, "draft": opts.load.draft_placement},
                n_batch=opts.load.n_batch,
            )
        except (ConfigError, EngineError, OSError) as e:
            o.fail(e)
        if options["preset"]:
            report["preset"] = options["preset"]
        if as_json:
            typer.echo(json.dumps(report, ensure_ascii=False))
        else:
            typer.echo(doctor_report.format_report(report))


def _pair(load, explicit: str | None) -> tuple[str, str | None, list[str]]:
    """Target path, draft path and the drafters to measure. Without --drafter every drafter that
    the models allow is measured, so the recommendation can compare them."""
    from localspec.loading import defaults
    from localspec.config import ConfigError

    notice = lambda m: typer.echo(m, err=True)  # noqa: E731
    # A draft given on the command line is always checked against the target (vocabulary, memory).
    want_draft = bool(load.draft) or explicit in (None, "model", "auto")
    target, draft = defaults.default_pair(load.target, load.draft, want_draft, notice)
    if explicit in ("model", "auto") and draft is None:
        raise ConfigError(f"--drafter {explicit} needs --draft PATH (a GGUF sharing the target's tokenizer)")
    if explicit == "auto":
        drafters = ["model", "lookup"]   # auto chooses between them: measure both
    elif explicit is not None:
        drafters = [] if explicit == "none" else [explicit]
    else:
        drafters = (["model"] if draft else []) + ["lookup"]
    return target, draft, drafters
