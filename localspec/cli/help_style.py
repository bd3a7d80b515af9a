"""How every command's --help looks: one style of placeholder, and defaults written in words.

The root command (`app._Group`) applies `plain_help` once, at start, to itself and every command
under it. Which panel an option is shown in is declared with the option (`panels`).
"""

from __future__ import annotations

import typing
from typing import Any


def plain_help(command: Any) -> None:
    """One style of placeholder in `command`'s help and usage lines, and in those of its
    subcommands: an argument is its name in capitals, in brackets when it may be left out
    (PROMPT, ID, [FILE]); an option's value is its metavar (FILE, the literal values it takes, or
    both: auto|N) or else its type as Click names it (INTEGER, FLOAT, TEXT); a flag has none.
    Typer's own (`<bool>` on every flag, `{prompt}` beside `{ID}`, `[[FILE]]`) says less and
    changes between its releases.

    One way of showing a default: in the option's help, in words ("(default 4096)", "(default
    --chat)"). Typer's `[default: …]` is turned off everywhere: most shared options default to None
    (so that a flag can be told from a preset's value) and Typer would show nothing for them."""
    for param in command.params:
        _plain(param)
    context = getattr(command, "context_class", None)
    if context is not None and hasattr(command, "get_help_option"):   # --help, made per command
        help_option = command.get_help_option(context(command))
        if help_option is not None:
            _plain(help_option)
    for sub in getattr(command, "commands", {}).values():
        plain_help(sub)


def _plain(param: Any) -> None:
    param.show_default = False   # the help's words say it (see `plain_help`)
    if param.param_type_name == "argument":
        raw = (param.metavar or param.name or "").strip("[]{}")
        label = raw if "|" in raw else raw.upper()   # md|json: the literal values, as typed
        shown = (label if param.required else f"[{label}]") + ("..." if param.nargs != 1 else "")
        param.metavar = label
        # The usage line: Typer wraps a required argument in braces, and Click's older releases
        # show a metavar as given, brackets or not.
        param.get_usage_pieces = lambda ctx: [shown]
        if hasattr(param, "display_type_rich"):   # Typer's type column (`<str>`) beside the name
            param.display_type_rich = lambda ctx: None
    elif getattr(param, "is_flag", False) or getattr(param, "count", False):
        param.metavar = ""
    elif param.metavar is None:
        param.metavar = _value_name(param)


_TYPE_NAMES = {int: "INTEGER", float: "FLOAT", str: "TEXT"}
"""Click's names of the value types options take."""


def _value_name(param: Any) -> str | None:
    """INTEGER, FLOAT or TEXT for an option's value; None (Typer's own display) for choices."""
    kind = getattr(param, "type", None)
    if kind is not None:   # Typer on Click: a Click ParamType
        return None if hasattr(kind, "choices") else kind.name.upper()
    described = param.type_descriptor   # Typer with its own Click: the annotation itself
    if described.is_choice:
        return None
    return _TYPE_NAMES.get(typing.get_args(described.annotation)[0] if described.is_list else described.annotation)
