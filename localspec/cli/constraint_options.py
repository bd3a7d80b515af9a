"""Options that constrain the output: --grammar FILE.gbnf, --json-schema FILE|JSON, --format json
(generate, chat, serve's defaults, bench), and generate's and bench's --draft-mask.

They resolve to one GBNF text in `SamplingConfig.grammar` (engine.grammar converts JSON schemas
with llama-cpp-python's `json_schema_to_gbnf`); the grammar itself is parsed by llama.cpp when a
model is loaded, and a bad one is one error line then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from localspec.config import ConfigError
from .panels import CONSTRAINTS as PANEL

MAX_GRAMMAR_BYTES = 1 << 20   # a grammar or schema file past 1 MiB is not one a person wrote

FORMATS = ("text", "json")

Grammar = Annotated[Optional[str], typer.Option(
    "--grammar", metavar="FILE", rich_help_panel=PANEL,
    help="GBNF grammar file (llama.cpp's format) the output must match.")]
JsonSchema = Annotated[Optional[str], typer.Option(
    "--json-schema", metavar="SCHEMA", rich_help_panel=PANEL,
    help="JSON schema the output must match: a file, or the schema itself.")]
Format = Annotated[Optional[str], typer.Option(
    "--format", metavar="|".join(FORMATS), rich_help_panel=PANEL,
    help="json: the output is one JSON object (default text).")]
DraftMask = Annotated[bool, typer.Option(
    "--draft-mask/--no-draft-mask", rich_help_panel=PANEL,
    help="Under a grammar, mask the draft's rows too (raises α; the output's law is the same either way) "
         "(default --draft-mask).")]

CONSTRAINTS = {"grammar": Grammar, "json_schema": JsonSchema, "format": Format}
"""The output constraints; part of every command's sampling options."""


def _read(path: str, what: str) -> str:
    p = Path(path).expanduser()
    try:
        if not p.is_file():
            raise ConfigError(f"{what} file not found: {path}" if not p.exists() else
                              f"{what} {path} is not a file")
        if p.stat().st_size > MAX_GRAMMAR_BYTES:
            raise ConfigError(f"{what} file {path} is over {MAX_GRAMMAR_BYTES >> 20} MiB")
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} file {path} is not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} file {path}: {e.strerror or e}") from None


def _inline(value: str) -> bool:
    """Whether --json-schema's value is the schema itself: an object, or any JSON where no file of
    that name exists (so `[1, 2]` is refused as not an object, not as a missing file)."""
    if value.lstrip().startswith("{"):
        return True
    if Path(value).expanduser().exists():
        return False
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def grammar_of(grammar: str | None, json_schema: str | None, fmt: str | None) -> tuple[str, str]:
    """(GBNF text, its name for the records) from the options; ("", "") when none is given."""
    from localspec.engine.grammar import ANY_JSON_OBJECT, GrammarError, schema_grammar

    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"--format takes {' or '.join(FORMATS)}, got {fmt[:40]!r}")
    given = [name for name, v in (("--grammar", grammar), ("--json-schema", json_schema),
                                  ("--format json", fmt if fmt == "json" else None)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} both constrain the output: give one")
    for option, value in (("--grammar", grammar), ("--json-schema", json_schema)):
        if value is not None and not value.strip():   # not "none": the user asked for one
            raise ConfigError(f"{option} is empty: give a file{' or the schema itself' if option == '--json-schema' else ''}")
    if grammar is not None:
        text = _read(grammar, "grammar")
        if not text.strip():
            raise ConfigError(f"--grammar: the grammar file {grammar!r} is empty")
        return text, Path(grammar).name
    if json_schema is not None:
        text = json_schema if _inline(json_schema) else _read(json_schema, "JSON schema")
        if not text.strip():
            raise ConfigError(f"--json-schema: the JSON schema file {json_schema!r} is empty")
        name = "schema" if text is json_schema else f"schema {Path(json_schema).name}"
        try:
            return schema_grammar(text), name
        except GrammarError as e:
            raise ConfigError(f"--json-schema: {e}") from None
    if fmt == "json":
        return ANY_JSON_OBJECT, "json"
    return "", ""
