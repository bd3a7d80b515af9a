"""Target/draft compatibility and bad model files: every failure is one `error:` line and exit 2.

Runs on tiny random GGUFs from tiny_gguf.py (a few KB each), so the whole file takes seconds.
One thread per model keeps a tiny model fast on a busy machine (llama.cpp's thread barriers stall
when a thread is descheduled). The CLI runs in a subprocess so that a llama.cpp abort would fail
the test instead of killing pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_gguf import TOKENS, write_tiny_gguf

CLI = [sys.executable, "-m", "localspec"]


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    renamed = list(TOKENS)
    renamed[7] = renamed[7] + "X"  # same size, one token text differs at id 7
    files = {
        "A": write_tiny_gguf(d / "a.gguf"),
        "A2": write_tiny_gguf(d / "a2.gguf", seed=1, n_layer=2),  # same vocab, other weights
        "B": write_tiny_gguf(d / "b.gguf", renamed),
        # More than 128 ids apart (padding within 128 is tolerated, as llama.cpp does).
        "C": write_tiny_gguf(d / "c.gguf", [*TOKENS, *(f"▁extra{i}" for i in range(200))]),
        "P": write_tiny_gguf(d / "p.gguf", [*TOKENS, *(f"▁pad{i}" for i in range(64))]),
        "E": write_tiny_gguf(d / "e.gguf", eos=3),
    }
    data = files["A"].read_bytes()
    files["trunc"] = d / "trunc.gguf"
    files["trunc"].write_bytes(data[: len(data) // 2])
    files["text"] = d / "text.gguf"
    files["text"].write_text("this is not a model\n")
    files["missing"] = d / "missing.gguf"
    return files


def run_generate(target: Path, draft: Path, *extra: str) -> subprocess.CompletedProcess:
    args = ["generate", "hi", "--target", str(target), "--draft", str(draft), "--raw"]
    args += ["--n-ctx", "64", "--threads", "1"]
    return subprocess.run(CLI + args + list(extra), capture_output=True, text=True, timeout=60)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def test_token_text_differs(ggufs):
    line = one_error_line(run_generate(ggufs["A"], ggufs["B"], "--max-tokens", "2"))
    assert str(ggufs["A"]) in line and str(ggufs["B"]) in line
    assert "token id 7" in line


def test_vocab_size_differs(ggufs):
    line = one_error_line(run_generate(ggufs["A"], ggufs["C"], "--max-tokens", "2"))
    assert str(ggufs["A"]) in line and str(ggufs["C"]) in line
    assert str(len(TOKENS)) in line and str(len(TOKENS) + 200) in line


@pytest.mark.parametrize("order", ["padded-draft", "padded-target"])
def test_padded_vocab_within_slack_generates(ggufs, order):
    """Same tokens, one side padded with 64 extra ids (like Qwen2.5 7B vs 0.5B): accepted, and
    sampling works across the size difference."""
    target, draft = (ggufs["A"], ggufs["P"]) if order == "padded-draft" else (ggufs["P"], ggufs["A"])
    r = run_generate(target, draft, "--max-tokens", "6", "--temperature", "1", "-k", "3", "--seed", "3", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_tokens"] >= 1


def test_eos_differs(ggufs):
    line = one_error_line(run_generate(ggufs["A"], ggufs["E"], "--max-tokens", "2"))
    assert "EOS" in line
    assert str(ggufs["A"]) in line and str(ggufs["E"]) in line


def test_same_vocab_loads_and_generates(ggufs):
    from localspec.config import ModelConfig
    from localspec.engine import Model
    from localspec.loading.vocab import check as check_vocab

    load = lambda key: Model(ModelConfig(str(ggufs[key]), n_ctx=64, n_threads=1))  # noqa: E731
    with load("A") as a, load("A2") as a2:
        assert a.n_vocab == len(TOKENS)
        check_vocab(a, a2)
        logits = a.eval(a.tokenize("hi the"), logits_from=-1)
        assert logits.shape == (1, len(TOKENS))

    r = run_generate(ggufs["A"], ggufs["A2"], "--max-tokens", "4", "--temperature", "0", "-k", "2", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["n_tokens"] >= 1
    assert result["target"] == str(ggufs["A"]) and result["draft"] == str(ggufs["A2"])


@pytest.mark.parametrize("bad", ["trunc", "text", "missing"])
@pytest.mark.parametrize("role", ["target", "draft"])
def test_bad_model_file(ggufs, bad, role):
    pair = (ggufs[bad], ggufs["A"]) if role == "target" else (ggufs["A"], ggufs[bad])
    line = one_error_line(run_generate(*pair, "--max-tokens", "2"))
    assert str(ggufs[bad]) in line


def test_recurrent_target_is_refused_before_generating(ggufs, monkeypatch):
    """A recurrent/hybrid model's state cannot be rewound to drop rejected drafts: say so up front."""
    import localspec.engine as engine
    from localspec.config import ConfigError
    from localspec.loading.session import LoadConfig, Session

    monkeypatch.setattr(engine.C, "llama_model_is_recurrent", lambda model: True)
    with pytest.raises(ConfigError, match="recurrent/hybrid.*--drafter none") as err:
        Session.load(LoadConfig(target=str(ggufs["A"]), drafter="lookup", n_ctx=64, threads=1))
    assert str(ggufs["A"]) in str(err.value)
    plain = Session.load(LoadConfig(target=str(ggufs["A"]), drafter="none", n_ctx=64, threads=1))
    plain.close()
