"""The ``localspec doctor`` command; localspec.cli calls register(app)."""

from __future__ import annotations

import json
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to ``app``."""

    @app.command("doctor")
    def doctor_command(
        preset: Optional[str] = typer.Option(None, "--preset", help="Model preset from `localspec models`."),
        target: Optional[str] = typer.Option(None, "--target", help="Target GGUF (default: embedded SmolLM2-135M F32)."),
        draft: Optional[str] = typer.Option(None, "--draft", help="Draft GGUF to check against the target."),
        drafter: Optional[str] = typer.Option(
            None, "--drafter", help="Measure only this drafter: model | lookup | none (default: every one available)."
        ),
        n_ctx: Optional[int] = typer.Option(None, "--n-ctx", help="Context length for the memory estimate (default 4096)."),
        seconds: float = typer.Option(20.0, "--seconds", help="Calibration time budget; 0 skips calibration."),
        temperature: Optional[float] = typer.Option(None, "--temperature", help="Temperature to measure α at (default: the preset's or 0.8)."),
        threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (default: this machine's cores)."),
        target_gpu_layers: Optional[int] = typer.Option(None, "--target-gpu-layers", help="Target layers on the GPU (-1 = all)."),
        draft_gpu_layers: Optional[int] = typer.Option(None, "--draft-gpu-layers", help="Draft layers on the GPU (-1 = all)."),
        forget: bool = typer.Option(False, "--forget", help="Delete what the k controller learned on this pair and machine (its warm start)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the report."),
    ) -> None:
        """Check the llama.cpp build, a target/draft pair and this machine; recommend drafter and k."""
        from localspec.cli import fail, resolve_options
        from localspec.config import ConfigError
        from localspec.engine import EngineError

        if seconds < 0:
            fail(f"--seconds must be >= 0, got {seconds:g}")
        try:
            opts = resolve_options(
                preset=preset, target=target, draft=draft, drafter=drafter, k=None, temperature=temperature,
                top_k=None, top_p=None, min_p=None, seed=0, n_ctx=n_ctx, threads=threads,
                target_gpu_layers=target_gpu_layers, draft_gpu_layers=draft_gpu_layers,
            )
            target_path, draft_path, drafters = _pair(opts.load, explicit=drafter)
            from localspec import doctor

            report = doctor.diagnose(
                target_path, draft_path, drafters, n_ctx=opts.load.n_ctx, threads=opts.load.threads,
                gpu_layers={"target": opts.load.target_gpu_layers, "draft": opts.load.draft_gpu_layers},
                sampling=opts.sampling, seconds=seconds, forget=forget,
            )
        except (ConfigError, EngineError, OSError) as e:
            fail(e)
        if preset:
            report["preset"] = preset
        if as_json:
            typer.echo(json.dumps(report, ensure_ascii=False))
        else:
            typer.echo(doctor.format_report(report))


def _pair(load, explicit: str | None) -> tuple[str, str | None, list[str]]:
    """Target path, draft path and the drafters to measure. Without --drafter every drafter that
    the models allow is measured, so the recommendation can compare them."""
    from localspec import defaults
    from localspec.config import ConfigError

    notice = lambda m: typer.echo(m, err=True)  # noqa: E731
    target = load.target or str(defaults.default_target_path(notice))
    draft = load.draft
    if draft is None and not load.target and explicit in (None, "model"):
        draft = str(defaults.default_draft_path(notice))
    if explicit == "model" and draft is None:
        raise ConfigError("--drafter model needs --draft PATH (a GGUF sharing the target's tokenizer)")
    if explicit is not None:
        drafters = [] if explicit == "none" else [explicit]
    else:
        drafters = (["model"] if draft else []) + ["lookup"]
    return target, draft, drafters
