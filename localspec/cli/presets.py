"""The ``localspec models`` and ``localspec pull`` commands; localspec.cli.app calls register(app)."""

from __future__ import annotations

import json
from typing import Optional

import typer

from .options import fail
from localspec.config import ConfigError


def register(app: typer.Typer) -> None:
    """Add the ``models`` and ``pull`` commands to ``app``."""

    @app.command("models")
    def models_command(
        as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table."),
    ) -> None:
        """List the model presets and whether their files are downloaded."""
        from localspec.loading import hub, presets

        try:
            rows = [(p, hub.model_status(p)) for p in presets.list_presets()]
        except ConfigError as e:
            fail(e)
        if as_json:
            typer.echo(json.dumps([_preset_json(p, status) for p, status in rows], indent=2))
            return
        table = [("PRESET", "DRAFTER", "TARGET", "DRAFT", "DOWNLOADED", "SIZE", "VERIFIED")]
        for p, status in rows:
            table.append((
                p.name,
                p.drafter,
                _short(p.target),
                _short(p.draft) if p.draft else "-",
                _downloaded(status),
                _size(status),
                "yes" if p.verified else "no",
            ))
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for row in table:
            typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        typer.echo("\nSIZE: of the preset's files in the Hugging Face cache (built-in models are made or fetched "
                   "on first use).\nVERIFIED: yes when the repo ids and file names were checked against the hub; "
                   "no when they are unconfirmed (`pull` may not find them).\n"
                   "Download a preset's models with `localspec pull PRESET`.")

    @app.command("pull")
    def pull_command(
        preset_or_repo: str = typer.Argument(..., metavar="PRESET_OR_REPO", help="Preset name, or a HF repo id."),
        file: Optional[str] = typer.Argument(None, metavar="FILE", help="GGUF file in the repo, with a repo id."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show download progress bars (default --progress)."),
    ) -> None:
        """Download a preset's models (or one REPO FILE) into the Hugging Face cache."""
        from localspec.loading import hub

        try:
            paths = hub.pull(preset_or_repo, file, progress=progress, notice=typer.echo)
        except ConfigError as e:
            fail(e)
        if paths:
            typer.echo("ready: " + ", ".join(str(p) for p in paths))


def _short(ref) -> str:
    """A model as it fits in a table column: the GGUF file name, or the built-in name."""
    return f"{ref.embedded} (built-in)" if ref.embedded else ref.file


def _downloaded(status) -> str:
    """``built-in``, ``yes``, ``no``, or which of the two is there."""
    hub_rows = [s for s in status if not s.ref.embedded]
    if not hub_rows:
        return "built-in"
    have = [s for s in hub_rows if s.present]
    if len(have) == len(hub_rows):
        return "yes"
    if not have:
        return "no"
    return "only " + ", ".join(s.role for s in have)


def _size(status) -> str:
    """The bytes of the preset's files on disk, or ``-`` when none is (or only built-in ones)."""
    from localspec.loading.hub import format_size

    sizes = [s.size_bytes for s in status if s.size_bytes is not None]
    return format_size(sum(sizes)) if sizes else "-"


def _preset_json(p, status) -> dict:
    models = {
        s.role: {
            "repo": s.ref.repo,
            "file": s.ref.file,
            "embedded": s.ref.embedded,
            "present": s.present,
            "path": str(s.path) if s.path else None,
            "size_bytes": s.size_bytes,
        }
        for s in status
    }
    return {
        "name": p.name,
        "description": p.description,
        "drafter": p.drafter,
        "target": models["target"],
        "draft": models.get("draft"),
        "sampling": {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p},
        "k": "auto" if p.k is None else p.k,
        "n_ctx": p.n_ctx,
        "note": p.note,
        "verified": p.verified,
        "path": str(p.path),
    }
