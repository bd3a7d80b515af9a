"""Every command's --help against the code: each default the help shows is the default the code
applies, no flag shows a placeholder (`<bool>`), and every placeholder has one style.

The help is rendered as a user sees it (Typer's rich panels, wide enough that no row wraps) and
parsed. Defaults are shown one way, in the help's words (`(default 0.8)`, `(default: …)`): each is
compared with what the code does when the option is not given (`REAL_DEFAULTS`), or, for an option
declared with a default, with that declared default (which Typer passes). A default in words that
this file cannot check fails, so that no default can be shown unchecked; an option declared with a
default that its help does not state fails too, and so does Typer's own `[default: X]` anywhere.
The options the model commands share are grouped in panels, the same in every command, after the
command's own options (`panels`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import typer
from typer.testing import CliRunner

from localspec.cli.app import app
from localspec.config import DRAFTERS

runner = CliRunner()
WIDE = {"COLUMNS": "400", "TERMINAL_WIDTH": "400"}   # one line per row: nothing wraps

NAME = r"[A-Z][A-Z0-9_]*"
VALUE = rf"(?:[a-z0-9][a-z0-9.-]*|{NAME})"
LITERAL = rf"[a-z0-9][a-z0-9.-]*(?:\|{VALUE})*"   # the values an option takes: md|json, or auto|N with a NAME
PLACEHOLDER = re.compile(rf"(?:{NAME}|{LITERAL})")
USAGE_PIECE = re.compile(rf"(?:{NAME}|\[{NAME}\]|{LITERAL}|\[OPTIONS\]|COMMAND|\[ARGS\])(?:\.\.\.)?")

TYPER_DEFAULT = re.compile(r"\[default: ([^\]]*)\]")
WRITTEN_DEFAULT = re.compile(r"\(default:? ([^)]*)\)|(\S+) \(default\)|(\(the default\))|\((\S+) by default\)")


def commands() -> list[tuple[str, ...]]:
    """The path of every command and group, the root included (from the app itself)."""
    out = []

    def walk(cmd, path):
        out.append(path)
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return out


def click_command(path: tuple[str, ...]):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def help_of(path: tuple[str, ...]) -> str:
    result = runner.invoke(app, [*path, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    return result.output


def rows(text: str) -> dict[str, list[str]]:
    """{first name of a row (`--max-tokens`, `PROMPT`): its cells} over the help's panels."""
    out = {}
    for line in text.splitlines():
        inner = line.strip()
        if not (inner.startswith("│") and inner.endswith("│")):
            continue
        cells = re.split(r"\s{2,}", inner.strip("│").strip())
        if cells[0] == "*":   # a required argument's mark
            cells = cells[1:]
        assert cells[0] not in out, f"two rows named {cells[0]}"
        out[cells[0]] = cells
    return out


def options(path: tuple[str, ...]) -> list:
    """The command's options, --help included, as Click has them."""
    cmd = click_command(path)
    ctx = cmd.context_class(cmd)
    return [p for p in cmd.get_params(ctx) if p.param_type_name == "option"]


def arguments(path: tuple[str, ...]) -> list:
    return [p for p in click_command(path).params if p.param_type_name == "argument"]


def long_name(param) -> str:
    return next(o for o in param.opts if o.startswith("--"))


ALL = commands()
IDS = [" ".join(p) or "localspec" for p in ALL]


# ---- what the code does when an option is not given ------------------------------------------------


@dataclass(frozen=True)
class At:
    """Where a written default is checked."""

    path: tuple[str, ...]
    param: object
    model_paths: tuple
    store: object


def resolved():
    """`resolve_options` with nothing given: the built-in defaults every command starts from."""
    from localspec.cli.options import MODEL_OPTIONS, resolve_options

    return resolve_options(**{name: None for name in MODEL_OPTIONS})


def threads_default(path: tuple[str, ...]) -> int | None:
    """The thread count `path` uses when --threads is not given, as its code computes it."""
    from localspec.cli import options as cli_options

    return cli_options.threads_default(path[0]) if path else None


def _drafter_default(phrase: str, at: At) -> None:
    from localspec.loading.session import LoadConfig, resolve_files

    with_draft = resolve_files(LoadConfig()).drafter   # no --target: the embedded pair
    without = resolve_files(LoadConfig(target=str(at.model_paths[0]))).drafter
    assert phrase == f"{with_draft} when a draft is available, else {without}"


def _embedded_target(phrase: str, at: At) -> None:
    from localspec.loading.session import LoadConfig, resolve_files

    assert Path(resolve_files(LoadConfig()).target).name in phrase


def _doctor_drafters(phrase: str, at: At) -> None:
    from localspec.cli.doctor import _pair
    from localspec.config import DRAFTERS
    from localspec.loading.session import LoadConfig

    # "every one available": all that a pair with a draft model allows, measured one by one
    assert phrase == "every one available"
    assert _pair(LoadConfig(), None)[2] == [d for d in DRAFTERS if d not in ("auto", "none")]
    assert _pair(LoadConfig(target=str(at.model_paths[0])), None)[2] == ["lookup"]


def _markdown_by_default(phrase: str, at: At) -> None:
    conv = at.store.new_conversation({}, None)
    at.store.add_message(conv, "user", "hi")
    plain, md = (runner.invoke(app, ["history", "show", str(conv), *extra]) for extra in ([], ["--md"]))
    assert plain.exit_code == md.exit_code == 0 and plain.output == md.output


def _loopback(phrase: str, at: At) -> None:
    import ipaddress

    assert phrase == f"{at.param.default}, loopback only" and ipaddress.ip_address(at.param.default).is_loopback


def _no_cap(phrase: str, at: At) -> None:
    # None, not a number: the chat then decodes up to the context (tui/chat.py), no cap in between
    assert phrase.startswith("no cap") and at.param.default is None


def _by_free_memory(phrase: str, at: At) -> None:
    # no split given: llama.cpp's own (its devices' free memory decides)
    assert phrase == "by free memory" and resolved().load.target_placement.tensor_split == ()


def _gpus_else_cpu(phrase: str, at: At) -> None:
    from localspec.engine import rpc

    assert phrase == "every local GPU, else the CPU"
    assert rpc.worker_devices() == (rpc.local_gpus() or rpc.worker_devices(("CPU",)))


def _unconstrained(phrase: str, at: At) -> None:
    assert phrase == "text" and resolved().sampling.grammar == "" and at.param.default is None


def _no_worker_cache(phrase: str, at: At) -> None:
    assert phrase == "no cache" and at.param.default is None


def _no_cors(phrase: str, at: At) -> None:
    # None: the server gets no origins (`tuple(cors_origin or ())`) and sends no CORS headers
    assert phrase == "no CORS" and at.param.default is None


def _declared(phrase: str, at: At) -> None:
    """A default written for an option declared with one: that one (Typer passes it). A flag pair
    (--chat/--raw) names its side."""
    param = at.param
    if param.is_flag and param.secondary_opts:
        assert phrase == (param.opts if param.default else param.secondary_opts)[0], (phrase, param.default)
    else:
        _value(lambda: param.default)(phrase, at)


def _value(get: Callable) -> Callable:
    """A check that the written default is `get()` (a number compared as one)."""
    def check(phrase: str, at: At) -> None:
        want = get()
        numbers = re.findall(r"-?\d+(?:\.\d+)?", phrase)
        if isinstance(want, (int, float)) and not isinstance(want, bool):
            assert numbers and float(numbers[-1]) == want, f"shown {phrase!r}, the code uses {want}"
        else:
            assert str(want) in phrase, f"shown {phrase!r}, the code uses {want}"
    return check


REAL_DEFAULTS: dict[str, Callable[[str, At], None]] = {
    "--n-ctx": _value(lambda: resolved().load.n_ctx),
    "--temperature": _value(lambda: resolved().sampling.temperature),
    "--top-k": _value(lambda: resolved().sampling.top_k),
    "--top-p": _value(lambda: resolved().sampling.top_p),
    "--min-p": _value(lambda: resolved().sampling.min_p),
    "--target-gpu-layers": _value(lambda: resolved().load.target_gpu_layers),
    "--draft-gpu-layers": _value(lambda: resolved().load.draft_gpu_layers),
    "--draft-tokens": _value(lambda: "auto" if resolved().k is None else resolved().k),
    "--target": _embedded_target,
    "--drafter": _drafter_default,
    "doctor --drafter": _doctor_drafters,
    "history show --md": _markdown_by_default,
    "serve --host": _loopback,
    "worker --host": _loopback,
    "worker --cache-dir": _no_worker_cache,
    "serve --cors-origin": _no_cors,
    "worker --device": _gpus_else_cpu,
    "--tensor-split": _by_free_memory,
    "--split-mode": _value(lambda: resolved().load.target_placement.split_mode),
    "--main-gpu": _value(lambda: resolved().load.target_placement.main_gpu),
    "--flash-attn": _value(lambda: resolved().load.target_placement.flash_attn),
    "--stable-shapes": _value(lambda: resolved().load.target_placement.stable_shapes),
    "--cache-type-k": _value(lambda: resolved().load.target_placement.cache_type_k),
    "--cache-type-v": _value(lambda: resolved().load.target_placement.cache_type_v),
    "--draft-cache-type-k": _value(lambda: resolved().load.draft_placement.cache_type_k),
    "--draft-cache-type-v": _value(lambda: resolved().load.draft_placement.cache_type_v),
    "--n-batch": _value(lambda: resolved().load.n_batch),
    "--repeat-penalty": _value(lambda: resolved().sampling.repeat_penalty),
    "--repeat-last-n": _value(lambda: resolved().sampling.repeat_last_n),
    "--presence-penalty": _value(lambda: resolved().sampling.presence_penalty),
    "--frequency-penalty": _value(lambda: resolved().sampling.frequency_penalty),
    "chat --max-tokens": _no_cap,
    "--format": _unconstrained,
}
"""Option (or "command option", which wins) -> a check of a default written in the help's words
against what the code does when the option is not given. An option declared with a default and
not listed here is checked against that (`_declared`)."""


def real_default_check(path: tuple[str, ...], option: str, param=None) -> Callable | None:
    found = REAL_DEFAULTS.get(" ".join((*path, option))) or REAL_DEFAULTS.get(option)
    return found or (_declared if param is not None and param.default is not None else None)


def declares_a_default(param) -> bool:
    """Whether an option has a default its help must state: not None, nor a lone flag's off."""
    if param.default is None or param.default in ((), []):
        return False
    return not (param.is_flag and not param.secondary_opts and param.default is False)


def typer_shown(param) -> str:
    """How Typer writes a declared default: a --x/--no-x flag by the name of its side."""
    if getattr(param, "secondary_opts", None) and getattr(param, "is_flag", False):
        return (param.opts if param.default else param.secondary_opts)[0].lstrip("-")
    return str(param.default)


# ---- the tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_each_shown_default_is_the_real_one(path, model_paths, store):
    table = rows(help_of(path))
    for param in options(path):
        name = long_name(param)
        assert name in table, f"{name} missing from the help of {' '.join(path) or 'localspec'}"
        text = " ".join(table[name])
        for shown in TYPER_DEFAULT.findall(text):
            assert shown == typer_shown(param), f"{name}: help shows {shown!r}, declared {param.default!r}"
        written = TYPER_DEFAULT.sub("", text)
        found = [next(g for g in m.groups() if g is not None) for m in WRITTEN_DEFAULT.finditer(written)]
        assert "default" not in WRITTEN_DEFAULT.sub("", written), f"{name}: a default this test cannot read: {text!r}"
        for phrase in found:
            if name == "--threads":
                want = threads_default(path)
                if want is not None:
                    assert want in [int(n) for n in re.findall(r"\d+", phrase)], (phrase, want)
                continue
            check = real_default_check(path, name, param)
            assert check is not None, (
                f"{' '.join(path)} {name} shows the default {phrase!r} in words: add the code's real "
                "default to REAL_DEFAULTS in tests/test_help.py")
            check(phrase, At(path, param, model_paths, store))


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_no_bool_placeholder_and_one_placeholder_style(path):
    text = help_of(path)
    assert "<bool>" not in text
    assert not re.search(r"<\w+(\[\w+\])?>", text), "Typer's <type> placeholders"
    usage = next(line for line in text.splitlines() if line.strip().startswith("Usage:"))
    pieces = usage.split("localspec", 1)[1].split()[len(path):]
    for piece in pieces:
        assert USAGE_PIECE.fullmatch(piece), f"usage placeholder {piece!r} in {usage.strip()!r}"
    table = rows(text)
    for param in options(path):
        cells = table[long_name(param)]
        opts = {*param.opts, *param.secondary_opts}
        n = next((i for i, c in enumerate(cells) if c not in opts), len(cells))   # the names' cells
        after = cells[n] if n < len(cells) else ""
        if param.is_flag:   # straight to the help: no placeholder
            assert (param.help or "").startswith(after[:20]), (long_name(param), cells)
        else:
            assert PLACEHOLDER.fullmatch(after), f"{long_name(param)}: placeholder {after!r}"
    for param in arguments(path):
        label = param.metavar
        assert PLACEHOLDER.fullmatch(label) and label in table, (label, list(table))
        assert (label if param.required else f"[{label}]") in pieces


def test_placeholders_read_as_documented():
    assert "Usage: localspec generate [OPTIONS] PROMPT" in help_of(("generate",))
    assert "Usage: localspec pull [OPTIONS] PRESET_OR_REPO [FILE]" in help_of(("pull",))
    assert "Usage: localspec history export [OPTIONS] ID md|json PATH" in help_of(("history", "export"))
    row = rows(help_of(("generate",)))["--max-tokens"]
    assert row[1] == "INTEGER"
    assert rows(help_of(("models",)))["--json"][1].startswith("Print")


def test_bench_help_lists_the_categories_of_the_suite(monkeypatch, tmp_path):
    from localspec.bench import run as bench

    names = bench.categories_of(bench.load_prompts())
    line = " ".join(rows(help_of(("bench",)))["--category"])
    assert ", ".join(names) in line
    # Read from the suite, not a copy of it: another suite, other names.
    suite = tmp_path / "suite.jsonl"
    suite.write_text('{"category": "poems", "prompt": "a"}\n{"category": "tables", "prompt": "b"}\n')
    monkeypatch.setattr(bench, "builtin_prompts_file", lambda: suite)
    line = " ".join(rows(help_of(("bench",)))["--category"])
    assert "poems, tables in the built-in suite" in line and names[0] not in line


def test_threads_hook_is_filled_once_the_help_shows_a_number():
    """The hook above must not stay empty once --threads shows the count it computes."""
    for path in ALL:
        row = rows(help_of(path)).get("--threads")
        if row is None:
            continue
        phrase = " ".join(row)
        if re.search(r"\(default:? \d|\[default: \d", phrase) and threads_default(path) is None:
            pytest.fail(f"{' '.join(path)} --threads shows a computed default ({phrase!r}): "
                        "fill in threads_default in tests/test_help.py")


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_defaults_are_shown_one_way(path):
    """Every default in the help's words, none in Typer's `[default: X]`: an option declared with a
    default says it (what it says is checked above)."""
    text = help_of(path)
    assert not TYPER_DEFAULT.search(text), f"Typer's own default shown: {TYPER_DEFAULT.search(text).group(0)}"
    table = rows(text)
    for param in options(path):
        if declares_a_default(param):
            row = " ".join(table[long_name(param)])
            assert WRITTEN_DEFAULT.search(row), f"{long_name(param)}: its default {param.default!r} is not in its help"


# ---- panels ---------------------------------------------------------------------------------------

MODEL_COMMANDS = ("generate", "chat", "serve", "bench")


def panels(text: str) -> dict[str, list[str]]:
    """{panel title: the first names of its rows, in order} of a rendered help."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        inner = line.strip()
        if inner.startswith("╭─"):
            current = out.setdefault(inner.strip("╭─╮ "), [])
        elif current is not None and inner.startswith("│") and inner.endswith("│"):
            cells = re.split(r"\s{2,}", inner.strip("│").strip())
            current.append(cells[1] if cells[0] == "*" else cells[0])
    return out


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_the_shared_options_are_in_panels_after_the_commands_own(command):
    from localspec.cli.panels import ORDER

    shown = panels(help_of((command,)))
    titles = [t for t in shown if t != "Arguments"]
    assert titles == ["Options", *ORDER], titles
    own = shown["Options"]
    assert own[-1] == "--help" and len(own) <= 12, own
    shared = {name for title in ORDER for name in shown[title]}
    assert not shared & set(own)


def test_each_shared_option_is_in_the_same_panel_in_every_command():
    where: dict[str, set[str]] = {}
    for command in MODEL_COMMANDS:
        for title, names in panels(help_of((command,))).items():
            for name in names:
                where.setdefault(name, set()).add(title)
    assert {name: titles for name, titles in where.items() if len(titles) > 1} == {}


def test_generate_shows_what_a_first_run_needs_first():
    shown = panels(help_of(("generate",)))
    assert list(shown)[:2] == ["Arguments", "Options"]
    assert shown["Options"][:3] == ["--max-tokens", "--system", "--stop"]
    assert shown["Speculation"][:3] == ["--drafter", "--draft-tokens", "--tree"]


@pytest.mark.parametrize("option, values", [("--drafter", "|".join(DRAFTERS)), ("--stable-shapes", "auto|on|off"),
                                            ("--flash-attn", "auto|on|off"), ("--split-mode", "none|layer|row|tensor"),
                                            ("--format", "text|json"), ("--tree", "auto|off|SHAPE"),
                                            ("--draft-tokens", "auto|N")])
def test_options_show_the_values_they_take(option, values):
    for command in ("generate", "chat", "serve"):
        assert values in rows(help_of((command,)))[option], (command, option)
