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
            targets = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
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
    assert "localspec.engine.quantize" in imports("localspec.defaults", known["localspec.defaults"], known)


def test_only_the_engine_imports_llama_cpp_and_localspec_never_imports_the_ui():
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        if "llama_cpp" in names:
            assert name.startswith("localspec.engine"), name
        if name.startswith("localspec."):
            assert not names & {"localspec_tui", "tui", "textual"}, name


def test_only_the_entry_point_imports_the_cli_module():
    g = graph()
    importers = sorted(name for name, deps in g.items() if "localspec.cli" in deps)
    assert importers == ["localspec.__main__"]


def test_the_installed_packages_have_names_of_their_own():
    import tomllib

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    tops = {p.split(".")[0] for p in cfg["packages"]}
    assert tops == {"localspec", "localspec_tui"}
    assert cfg["package-dir"]["localspec_tui"] == "tui"


LONG_MODULES = {
    # module: (lines it may have at most, the reason it is allowed past LONG_MODULE)
    "localspec.controller": (545, "one state machine (start-up, fallback, refresh, fits, warm start, "
                                  "floors) over shared state; the layout issue splits it"),
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
