"""`localspec generate` end to end, through the real entry point in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "localspec"]
REPO = Path(__file__).resolve().parent.parent
JSON_FIELDS = {
    "text": str, "tokens": list, "n_tokens": int, "n_steps": int, "n_drafted": int, "n_accepted": int,
    "alpha": (float, type(None)), "tokens_per_step": float, "tokens_per_second": float, "seconds": float,
    "drafter": str, "k": (int, str), "temperature": float, "seed": int, "target": str,
    "draft": (str, type(None)), "n_tested": int, "draft_efficiency": (float, type(None)),
}


def localspec(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, input=stdin, timeout=300)


def test_generate_json_on_the_default_pair():
    r = localspec("generate", "Tell me about lighthouses.", "--max-tokens", "24", "--temperature", "1.0",
                  "--seed", "7", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    for field, kind in JSON_FIELDS.items():
        assert isinstance(data[field], kind), (field, data[field])
    assert data["n_tokens"] == len(data["tokens"]) > 0
    assert data["drafter"] == "auto" and data["draft"].endswith(".gguf")
    assert data["n_drafted"] > 0 and data["alpha"] == pytest.approx(data["n_accepted"] / data["n_tested"])
    assert data["draft_efficiency"] == pytest.approx(data["n_accepted"] / data["n_drafted"])
    assert data["draft_efficiency"] <= data["alpha"]
    assert data["tokens_per_step"] == pytest.approx(data["n_tokens"] / data["n_passes"])
    assert data["n_passes"] in (data["n_steps"], data["n_steps"] - 1)   # the last pass may emit only EOG
    assert data["text"].strip()


def test_same_seed_same_output_with_fixed_k():
    args = ("generate", "Write a haiku about rain.", "--max-tokens", "24", "--temperature", "1.0",
            "--seed", "42", "-k", "3", "--json")
    a, b = json.loads(localspec(*args).stdout), json.loads(localspec(*args).stdout)
    assert a["tokens"] == b["tokens"]


def test_prompt_from_stdin_streams_text_and_summary():
    r = localspec("generate", "-", "--max-tokens", "12", "--temperature", "0", "--drafter", "lookup",
                  stdin="Name three colours.")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    summary = r.stderr.strip().splitlines()[-1]
    assert summary.startswith("α ") and "tokens/target pass" in summary and "tokens/s" in summary
    assert "draft efficiency" in summary


def test_summary_says_why_generation_ended():
    r = localspec("generate", "Count from 1 to 20, separated by commas.", "--stop", "7", "--max-tokens", "64",
                  "--temperature", "0", "--drafter", "lookup")
    assert r.returncode == 0, r.stderr
    assert "7" not in r.stdout and "6" in r.stdout   # cut at the stop string, long before 64 tokens
    assert "tokens (stop string) ·" in r.stderr.strip().splitlines()[-1]


def test_the_reason_by_finish():
    from localspec.cli.app import ended

    assert ended({"finish": "length"}) == ended({"finish": "length", "stop_string": False}) == "--max-tokens reached"
    assert ended({"finish": "context"}) == "context full"
    assert ended({"finish": "stop"}) == "end of text"
    assert ended({"finish": "stop", "grammar": "json"}) == "grammar complete"
    assert ended({"finish": "stop", "grammar": "json", "stop_string": True}) == "stop string"


def test_raw_mode_and_no_drafter():
    r = localspec("generate", "The capital of France is", "--raw", "--drafter", "none", "--max-tokens", "8",
                  "--temperature", "0", "--json")
    data = json.loads(r.stdout)
    assert data["n_drafted"] == 0 and data["alpha"] is None and data["tokens_per_step"] == 1.0
    assert data["n_tested"] == 0 and data["draft_efficiency"] is None


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, model_paths):
    d = tmp_path_factory.mktemp("bad")
    (d / "notes.gguf").write_text("just some text\n")
    data = model_paths[1].read_bytes()
    (d / "cut.gguf").write_bytes(data[: len(data) // 3])
    return d


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--target", "{d}/missing.gguf"], "not found"),
        (["--target", "{d}/notes.gguf"], "not a GGUF"),
        (["--target", "{d}/cut.gguf", "--drafter", "lookup"], "cut.gguf"),
        (["--draft", "{d}/notes.gguf"], "not a GGUF"),
        (["-k", "-3"], "-k"),
        (["-k", "many"], "-k"),
        (["--temperature", "-0.5"], "temperature"),
        (["--top-p", "1.5"], "top-p"),
        (["--max-tokens", "0"], "max-tokens"),
        (["--drafter", "magic"], "drafter"),
        (["--n-ctx", "4"], "n-ctx"),
        (["--n-ctx", "256", "--raw", "--drafter", "lookup", "--prompt-file-long"], "too long"),
    ],
)
def test_bad_input_exits_2_with_one_line(bad_files, args, needle):
    prompt = "hello"
    if "--prompt-file-long" in args:
        args = [a for a in args if a != "--prompt-file-long"]
        prompt = "word " * 400
    extra = [] if "--max-tokens" in args else ["--max-tokens", "4"]
    r = localspec("generate", prompt, *[a.format(d=bad_files) for a in args], *extra)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert needle in lines[0], lines[0]


def test_empty_stdin_prompt_is_an_error():
    r = localspec("generate", "-", stdin="")
    assert r.returncode == 2 and r.stderr.startswith("error: ")


def _tests_model_cache(env: dict) -> str:
    """Where tests/conftest.py keeps the models it makes, under the environment `env`."""
    code = "import tests.conftest as c; print(c.MODEL_CACHE)"
    keep = {k: v for k, v in os.environ.items() if k not in ("LOCALSPEC_CACHE", "XDG_CACHE_HOME", "HOME")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=REPO, env={**keep, **env})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_the_tests_share_the_users_model_cache_not_the_repository(tmp_path, model_paths):
    from tests.conftest import MODEL_CACHE

    # The user's own cache, as localspec itself finds it ($LOCALSPEC_CACHE first) ...
    home = tmp_path / "user"
    expected = home / ("Library/Caches" if sys.platform == "darwin" else ".cache") / "localspec"
    assert _tests_model_cache({"HOME": str(home)}) == str(expected)
    assert _tests_model_cache({"HOME": str(home), "LOCALSPEC_CACHE": str(tmp_path / "mine")}) == str(tmp_path / "mine")
    # ... never a copy inside the repository; the tests' models come from there.
    assert REPO != MODEL_CACHE.resolve() and REPO not in MODEL_CACHE.resolve().parents
    assert model_paths[0].parent.resolve() == MODEL_CACHE.resolve()
