"""The context is the size asked for: llama.cpp pads what it allocates (to 256 tokens), and that
padding must not become room a prompt or a reply may use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from localspec.config import DecodeConfig, ModelConfig, SamplingConfig
from localspec.decoding.decoder import generate_steps
from localspec.engine import EngineError, Model

N_CTX = 64


@pytest.fixture(scope="module")
def small(model_paths):
    with Model(ModelConfig(str(model_paths[0]), n_ctx=N_CTX, n_threads=1)) as m:
        yield m


def _tokens(model, n: int) -> list[int]:
    ids = model.tokenize("The lighthouse keeper wrote in his log every night. " * 20)
    assert len(ids) >= n
    return ids[:n]


def test_the_model_holds_exactly_the_context_asked_for(small):
    assert small.n_ctx == N_CTX and small.describe()["n_ctx"] == N_CTX
    small.reset()
    small.eval(_tokens(small, N_CTX))
    assert len(small.tokens) == N_CTX
    small.reset()
    with pytest.raises(EngineError, match=f"context full: {N_CTX + 1} tokens > n_ctx {N_CTX}"):
        small.eval(_tokens(small, N_CTX + 1))


def test_generation_stops_at_the_context_asked_for(small):
    prompt = _tokens(small, N_CTX - 6)
    steps = list(generate_steps(small, None, prompt, SamplingConfig(temperature=0),
                                DecodeConfig(max_tokens=100, k=0)))
    assert steps[-1].finish == "context"
    assert len(prompt) + sum(len(s.tokens) for s in steps) == N_CTX


def test_generate_refuses_a_prompt_that_fills_the_context(small):
    text = small.detokenize(_tokens(small, N_CTX))
    assert len(small.tokenize(text)) == N_CTX  # raw mode reads it back as the same 64 tokens
    done = subprocess.run([sys.executable, "-m", "localspec", "generate", text, "--raw", "--drafter", "none",
                           "--n-ctx", str(N_CTX), "--threads", "1", "--max-tokens", "4"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert f"prompt is {N_CTX} tokens, too long for n_ctx {N_CTX}" in done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
