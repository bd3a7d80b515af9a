"""The shape of the code: which way imports run, and what the installed package is called.

Read from the source with `ast` (no imports executed), so a lazy import inside a function counts
as much as one at the top: a circle hidden in a function still hides which way a dependency runs.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
# The installed name of each source folder (tui/ installs as localspec_tui, see pyproject.toml).
PACKAGES = {"localspec": REPO / "localspec", "localspec_tui": REPO / "tui"}
LONG_MODULE = 400


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of localspec and the terminal UI."""
    out = {}
    for top, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([top, *parts])] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that `name` imports anywhere in its file (top level or lazily)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import sub` names the module pkg.sub; `from mod import name` names mod
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_circle():
    assert cycles(graph()) == []


def test_the_circle_check_has_teeth():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    # and the parser sees lazy, relative imports
    known = modules()
    assert "localspec.engine.quantize" in imports("localspec.loading.defaults",
                                                  known["localspec.loading.defaults"], known)
    assert "localspec.engine.gguf" in imports("localspec.engine.files", known["localspec.engine.files"], known)


# ---- layers ---------------------------------------------------------------------------------------

BASE = {"localspec", "localspec.config", "localspec.machine", "localspec.paths", "localspec.tokens"}
"""The top-level modules every layer may use: frozen configuration, the machine's cores and load,
where localspec keeps its files, rules on token sequences. They import no other part of localspec."""

LAYERS = {
    # layer: the layers it may import (besides itself and BASE)
    "base": set(),
    "engine": set(),
    "decoding": set(),
    "chats": set(),
    "loading": {"engine", "decoding"},
    "bench": {"engine", "decoding", "loading"},
    "doctor": {"engine", "decoding", "loading"},
    "serve": {"engine", "decoding", "loading", "chats"},
    "cli": {"engine", "decoding", "loading", "chats", "bench", "doctor", "serve"},
    "main": {"cli"},
    "tui": {"engine", "decoding", "loading", "chats", "cli.options"},
}
"""Which way imports run. The algorithm (`decoding`) is testable without a model: it imports no
engine, and nothing that is a command, the server, a benchmark, the doctor or the UI. The UI
registers its `chat` command with the CLI's shared options, and nothing else of the CLI."""


def layer(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "localspec_tui":
        return "tui"
    if name in BASE:
        return "base"
    return "main" if parts[1] == "__main__" else parts[1]


def layer_problems(g: dict[str, set[str]]) -> list[str]:
    """Every import that runs against LAYERS, as 'module -> module'."""
    problems = []
    for name, deps in sorted(g.items()):
        mine = layer(name)
        for dep in sorted(deps):
            theirs = layer(dep)
            if theirs in (mine, "base"):
                continue
            allowed = LAYERS[mine]
            if theirs in allowed or any(dep == f"localspec.{a}" for a in allowed if "." in a):
                continue
            problems.append(f"{name} -> {dep} ({mine} may not import {theirs})")
    return problems


def test_every_module_belongs_to_a_layer():
    assert {layer(name) for name in modules()} <= set(LAYERS)


def test_imports_run_one_way_between_the_layers():
    assert layer_problems(graph()) == []


def test_the_layer_check_has_teeth():
    """A deliberate wrong import is caught: the algorithm reaching for the CLI, the server or the
    engine, the engine reaching up, the UI reaching into a command."""
    g = graph()
    for wrong in (("localspec.decoding.sampling", "localspec.cli.app"),
                  ("localspec.decoding.decoder", "localspec.serve.app"),
                  ("localspec.decoding.drafters", "localspec.engine"),
                  ("localspec.engine", "localspec.loading.session"),
                  ("localspec.chats.store", "localspec.loading.session"),
                  ("localspec_tui.app", "localspec.cli.app")):
        bad = {name: set(deps) for name, deps in g.items()}
        bad[wrong[0]].add(wrong[1])
        assert layer_problems(bad) == [f"{wrong[0]} -> {wrong[1]} ({layer(wrong[0])} may not import "
                                       f"{layer(wrong[1])})"], wrong


def test_only_the_engine_imports_llama_cpp_and_localspec_never_imports_the_ui():
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        if "llama_cpp" in names:
            assert name.startswith("localspec.engine"), name
        if name.startswith("localspec."):
            assert not names & {"localspec_tui", "tui", "textual"}, name


def test_only_the_entry_point_imports_the_cli_app():
    g = graph()
    importers = sorted(name for name, deps in g.items() if "localspec.cli.app" in deps)
    assert importers == ["localspec.__main__"]


def test_each_subpackage_says_what_it_does_and_what_it_must_never_import():
    for folder in sorted(p for p in (REPO / "localspec").iterdir() if (p / "__init__.py").is_file()):
        if folder.name.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert len(doc.split()) >= 20, f"{folder.name}/__init__.py needs a docstring on its layer"
        assert "never" in doc.lower(), f"{folder.name}/__init__.py must say what it never imports"


TOP_LEVEL_MODULES = 8


def test_the_top_level_holds_few_modules_besides_the_subpackages():
    top = sorted(p.name for p in (REPO / "localspec").glob("*.py"))
    assert len(top) <= TOP_LEVEL_MODULES, top


def test_the_installed_packages_have_names_of_their_own():
    import tomllib

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    tops = {p.split(".")[0] for p in cfg["packages"]}
    assert tops == {"localspec", "localspec_tui"}
    assert cfg["package-dir"]["localspec_tui"] == "tui"
    # and every subpackage is installed (a wheel leaves out a package not listed)
    folders = {"localspec." + p.parent.relative_to(REPO / "localspec").as_posix().replace("/", ".")
               for p in (REPO / "localspec").rglob("__init__.py") if p.parent != REPO / "localspec"}
    assert folders <= set(cfg["packages"]), sorted(folders - set(cfg["packages"]))


LONG_MODULES = {
    # module: (lines it may have at most, the reason it is allowed past LONG_MODULE)
}
"""The reviewed list of modules allowed over LONG_MODULE lines, each capped at its length when it was
reviewed: growing past it, or another module growing past LONG_MODULE, needs a new review here.
(A module's own docstring cannot grant this: anyone can write one.)"""


def line_count(path: Path) -> int:
    return path.read_text(encoding="utf-8").count("\n")


def length_problems(lines: dict[str, int], allowed: dict[str, tuple[int, str]]) -> list[str]:
    """What breaks the length rule: a module over its ceiling, and a listed one that no longer
    needs its place (shrunk to LONG_MODULE or less, or gone)."""
    problems = []
    for name, n in sorted(lines.items()):
        ceiling = allowed[name][0] if name in allowed else LONG_MODULE
        if n > ceiling:
            why = f"its reviewed ceiling is {ceiling}" if name in allowed else f"the limit is {LONG_MODULE}"
            problems.append(f"{name} has {n} lines; {why} (split it, or review it into LONG_MODULES)")
    for name in sorted(allowed):
        if lines.get(name, 0) <= LONG_MODULE:
            problems.append(f"{name} is listed in LONG_MODULES but has {lines.get(name, 0)} lines: remove it")
    return problems


def test_no_module_is_longer_than_its_review_allows():
    lines = {name: line_count(path) for name, path in modules().items()}
    assert length_problems(lines, LONG_MODULES) == []
    assert all(reason.strip() for _, reason in LONG_MODULES.values())


def test_the_length_check_has_teeth():
    allowed = {"a": (500, "reviewed")}
    assert length_problems({"a": 500, "b": LONG_MODULE}, allowed) == []
    grown, unlisted, shrunk = (length_problems(lines, allowed) for lines in (
        {"a": 501}, {"a": 500, "b": LONG_MODULE + 1}, {"a": LONG_MODULE}))
    assert len(grown) == 1 and "a has 501 lines; its reviewed ceiling is 500" in grown[0]
    assert len(unlisted) == 1 and unlisted[0].startswith(f"b has {LONG_MODULE + 1} lines; the limit is")
    assert len(shrunk) == 1 and "remove it" in shrunk[0]


def test_a_docstring_grants_no_length(tmp_path):
    """The old escape: writing "Long because" at the top of a module let it grow without review."""
    module = tmp_path / "m.py"
    module.write_text('"""Long because it says so."""\n' + "x = 1\n" * LONG_MODULE, encoding="utf-8")
    assert length_problems({"m": line_count(module)}, LONG_MODULES) != []
