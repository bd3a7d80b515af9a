"""The scripts in tools/ still fit the package: each imports (without running its main), each
Python one answers `--help`, and each shell script parses. None of them runs a model here: a
stale import (a module renamed by a re-layout) is what this catches, in seconds."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools"
SCRIPTS = sorted(TOOLS.glob("*.py"))
SHELL = sorted(TOOLS.glob("*.sh"))


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _main_guarded(tree: ast.Module) -> bool:
    """Whether the module has an `if __name__ == "__main__":` block."""
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)]
            consts = [n.value for n in ast.walk(node.test) if isinstance(n, ast.Constant)]
            if "__name__" in names and "__main__" in consts:
                return True
    return False


def _localspec_imports(tree: ast.Module) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every `from localspec... import ...`, top level or inside a function."""
    return [(node.lineno, node.module, [a.name for a in node.names]) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "localspec"]


def test_there_are_tools():
    assert SCRIPTS and SHELL


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_imports_without_running(path, monkeypatch):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert _main_guarded(tree), f"{path.name} runs its work on import: put it under `if __name__ == '__main__':`"
    top_calls = [n for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                 and isinstance(n.value.func, ast.Name) and n.value.func.id == "main"]
    assert not top_calls, f"{path.name} calls main() at import"
    monkeypatch.setattr(sys, "argv", [str(path), "--no-such-option"])   # a main run by mistake fails loudly
    monkeypatch.setattr(sys, "path", list(sys.path))   # gpu_bench.py puts the repository first
    spec = importlib.util.spec_from_file_location(f"_tool_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_lazy_imports_resolve(path):
    """Imports inside functions run only when the tool does: check that each names something real."""
    for line, module_name, names in _localspec_imports(ast.parse(path.read_text(encoding="utf-8"))):
        module = importlib.import_module(module_name)
        for name in names:   # a name in the module, or a submodule of it
            assert name == "*" or hasattr(module, name) or importlib.util.find_spec(f"{module_name}.{name}"), (
                f"{path.name}:{line}: {module_name} has no {name}")


def test_each_cli_answers_help():
    """`--help` of every tool with an argparse or Typer command line, run at once (each loads numpy
    or llama-cpp-python: one after another they would take most of the time)."""
    with_cli = [p for p in SCRIPTS if any(word in p.read_text(encoding="utf-8") for word in ("argparse", "typer"))]
    assert with_cli
    runs = {p.name: subprocess.Popen([sys.executable, str(p), "--help"], cwd=REPO, env=_env(), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE) for p in with_cli}
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"{name} --help: exit {proc.returncode}\n{err[-2000:]}"
        assert "usage" in out.lower(), f"{name} --help printed no usage:\n{out[:500]}"


@pytest.mark.parametrize("path", SHELL, ids=[p.name for p in SHELL])
def test_shell_scripts_parse(path):
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
