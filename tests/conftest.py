"""Shared fixtures: an isolated home for every test, and the real embedded models loaded once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The F32 default target is made once and reused across test runs; it never goes into git.
MODEL_CACHE = Path(os.environ.get("LOCALSPEC_CACHE") or REPO / "cache")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """No test reads or writes the real home, config or Hugging Face cache, or the network."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("LOCALSPEC_CACHE", str(MODEL_CACHE))


@pytest.fixture(scope="session")
def model_paths():
    """(F32 target, Q4_1 draft) of the embedded default pair."""
    os.environ.setdefault("LOCALSPEC_CACHE", str(MODEL_CACHE))
    from localspec.defaults import default_draft_path, default_target_path

    return default_target_path(), default_draft_path()


@pytest.fixture(scope="session")
def target(model_paths):
    from localspec.config import ModelConfig
    from localspec.engine import Model

    with Model(ModelConfig(str(model_paths[0]), n_ctx=2048)) as m:
        yield m


@pytest.fixture(scope="session")
def draft(model_paths):
    from localspec.config import ModelConfig
    from localspec.engine import Model

    with Model(ModelConfig(str(model_paths[1]), n_ctx=2048)) as m:
        yield m


def pytest_terminal_summary(terminalreporter):
    """Greedy divergences on quantized targets are counted and shown, never hidden."""
    from tests import test_decoding

    for row in getattr(test_decoding, "near_tie_report", []):
        terminalreporter.write_line(
            f"near-tie report (Q4_1 target, {row['drafter']} drafter): {row['diverged_at_near_tie']} of "
            f"{row['prompts']} prompts × {row['tokens']} tokens diverged from plain greedy, all at near-ties"
        )
