"""Repetition penalties and logit bias (decoding.processing), exact under speculation.

- The processing is llama.cpp's: on random rows and histories it equals what llama.cpp's own
  samplers (`llama_sampler_init_logit_bias`, `llama_sampler_init_penalties`) make of them.
- Greedy: under each penalty and a logit bias, speculative output equals plain output on the F32
  target, with the draft model and with prompt lookup, and the processing did change the text.
- The law at T = 1 on the tiny llama pair (test_concurrent's): with a strong repeat penalty and
  presence penalty, a generation drafting k = 2 tokens per step follows the target's processed
  distribution (test_exact_e2e's statistics against the target alone, 2,000 runs). Controls: a
  draft left unprocessed must still pass (it only lowers α); a target whose verify rows leave the
  drafted tokens out of the penalty history must fail.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import llama_cpp as C

import localspec.decoding.decoder
import localspec.decoding.drafters
from localspec.config import DecodeConfig, ModelConfig, SamplingConfig
from localspec.decoding.decoder import generate_steps
from localspec.decoding.drafters import ModelDrafter, PromptLookup
from localspec.decoding.processing import process, window
from localspec.engine import Model
from localspec.loading.session import LoadConfig, Session
from tests.law_helpers import CFG, NEAR_TIE, REPEATING, Target, near_tie_gap
from tests.test_exact_e2e import check as law_check
from tests.tiny_gguf import write_tiny_gguf


# -- llama.cpp's own samplers as the oracle --------------------------------------------------------

def llama_cpp_processed(row: np.ndarray, history: list[int], cfg: SamplingConfig) -> np.ndarray:
    n = len(row)
    data = (C.llama_token_data * n)(*[C.llama_token_data(i, float(row[i]), 0.0) for i in range(n)])
    arr = C.llama_token_data_array(data, n, -1, False)
    chain = []
    if cfg.logit_bias:
        biases = (C.llama_logit_bias * len(cfg.logit_bias))(*[C.llama_logit_bias(t, b) for t, b in cfg.logit_bias])
        chain.append(C.llama_sampler_init_logit_bias(n, len(cfg.logit_bias), biases))
    pen = C.llama_sampler_init_penalties(n, cfg.repeat_last_n if cfg.repeat_last_n >= 0 else len(history),
                                         cfg.repeat_penalty, cfg.frequency_penalty, cfg.presence_penalty)
    for t in history:
        C.llama_sampler_accept(pen, t)
    chain.append(pen)
    try:
        for s in chain:
            C.llama_sampler_apply(s, ctypes.byref(arr))
        out = np.empty(n, np.float32)
        for j in range(arr.size):
            out[data[j].id] = data[j].logit
        return out
    finally:
        for s in chain:
            C.llama_sampler_free(s)


@pytest.mark.parametrize("cfg", [
    SamplingConfig(repeat_penalty=1.3, repeat_last_n=16),
    SamplingConfig(repeat_penalty=0.8, repeat_last_n=64, presence_penalty=0.5, frequency_penalty=0.25),
    SamplingConfig(presence_penalty=-0.7, frequency_penalty=1.5, repeat_last_n=-1),
    SamplingConfig(logit_bias=((3, 2.5), (7, -1.0), (11, -np.inf)), repeat_penalty=1.1, repeat_last_n=8),
])
def test_the_processing_is_llama_cpps(cfg):
    rng = np.random.default_rng(0)
    for trial in range(20):
        row = (rng.standard_normal(200) * 3).astype(np.float32)
        history = rng.integers(0, 30, size=int(rng.integers(0, 90))).tolist()
        ours = process(row, window(history, [], cfg), cfg)
        want = llama_cpp_processed(row, history, cfg)
        # float32 both; llama.cpp's compiler may fuse count × frequency + presence into one FMA
        np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-6)
        assert (ours == -np.inf).tolist() == (want == -np.inf).tolist()
        assert ours is not row and row.dtype == np.float32


def test_the_window_is_the_last_n_of_the_text_then_the_drafted_tokens():
    cfg = SamplingConfig(repeat_penalty=1.2, repeat_last_n=4)
    assert window([1, 2, 3, 4, 5], [6, 7], cfg) == [4, 5, 6, 7]
    assert window([1, 2], [3], cfg) == [1, 2, 3]
    assert window([1, 2, 3], [4, 5, 6, 7, 8], cfg) == [5, 6, 7, 8]
    assert window([1, 2], [3], SamplingConfig(repeat_last_n=-1)) == [1, 2, 3]
    assert window([1, 2], [3], SamplingConfig(repeat_last_n=0)) == []


# -- greedy: speculation equals plain under each processing ----------------------------------------

PROCESSINGS = {
    "repeat": SamplingConfig(temperature=0.0, repeat_penalty=1.5, repeat_last_n=32),
    "presence+frequency": SamplingConfig(temperature=0.0, presence_penalty=1.0, frequency_penalty=0.5),
    "logit-bias": SamplingConfig(temperature=0.0, logit_bias=((13, 4.0), (28, -np.inf), (30, -np.inf))),
}


@pytest.fixture(scope="module")
def pair(model_paths):
    target, draft = model_paths
    session = Session.load(LoadConfig(str(target), str(draft), "auto", n_ctx=512, threads=2))
    yield session
    session.close()


def run(session, kind, sampling, prompt, k=None) -> list[int]:
    drafter = session.make_drafter(kind) if kind else None
    steps = generate_steps(session.target, drafter, prompt, sampling, DecodeConfig(max_tokens=48, k=k),
                           rng=np.random.default_rng(0))
    return [t for s in steps for t in s.tokens]


@pytest.mark.parametrize("name", list(PROCESSINGS))
def test_greedy_speculation_equals_plain_under_the_processing(pair, name):
    sampling = PROCESSINGS[name]
    gaps = []
    for text in ("Write a Python function that reverses a string.", "Describe a cat in three sentences."):
        prompt = pair.prompt_tokens(text, True)
        plain = run(pair, None, sampling, prompt)
        assert plain != run(pair, None, SamplingConfig(temperature=0.0), prompt)   # it changed the text
        for kind, k in (("model", None), ("model", 6), ("lookup", None), ("lookup", 6), ("auto", None)):
            gap = near_tie_gap(pair, sampling, prompt, plain, run(pair, kind, sampling, prompt, k))
            if gap is not None:
                gaps.append(gap)
                assert gap < NEAR_TIE, f"{kind} k={k} left plain decoding {gap:.4f} from a tie ({text!r})"
    print(f"near-tie report ({name}, F32 target): {len(gaps)} of 10 runs diverged, each at a near-tie {gaps}")
    assert len(gaps) <= 2


# -- the law at T = 1 -------------------------------------------------------------------------------

K = 2
L = 3
RUNS = 2000
PENALIZED = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95, min_p=0.0, repeat_penalty=3.0,
                           presence_penalty=2.0, repeat_last_n=8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-penalties")
    t_path = write_tiny_gguf(folder / "target.gguf", scale=0.8, n_embd=32, n_ff=64, seed=0)
    d_path = write_tiny_gguf(folder / "draft.gguf", scale=1.1, n_embd=32, n_ff=64, seed=0)
    with Model(ModelConfig(str(t_path), n_ctx=128)) as t, Model(ModelConfig(str(d_path), n_ctx=128)) as d, \
            Model(ModelConfig(str(t_path), n_ctx=128)) as alone:
        yield t, d, Target(alone, alone.tokenize(REPEATING), PENALIZED)


def law_runs(target, draft, ref: Target, n: int):
    runs = []
    for r in range(n):
        tokens, verified, finish = [], [], None
        for step in generate_steps(target, ModelDrafter(draft), ref.prompt, PENALIZED,
                                   DecodeConfig(max_tokens=L, k=K), rng=np.random.default_rng([23, r])):
            tokens += step.tokens
            verified += [step.n_drafted] * (len(step.tokens) + (step.finish == "stop"))
            finish = step.finish
        runs.append((tokens, verified, finish))
    return runs


def test_penalized_sampling_follows_the_target(tiny):
    target, draft, ref = tiny
    result = law_check(ref, law_runs(target, draft, ref, RUNS))
    print(result)
    assert result["forbidden"] == 0 and result["tested"] >= RUNS
    assert result["rank"] < result["rank_crit"], f"not the target's law: {result}"
    assert result["first"].ok, f"first token: {result['first']}"


def test_an_unprocessed_draft_still_follows_the_target(tiny, monkeypatch):
    target, draft, ref = tiny
    monkeypatch.setattr(localspec.decoding.drafters, "processed", lambda row, cfg, seen, i, states=None: row)
    result = law_check(ref, law_runs(target, draft, ref, RUNS))
    print("unprocessed draft", result)
    assert result["forbidden"] == 0 and result["rank"] < result["rank_crit"] and result["first"].ok


def test_verify_rows_blind_to_the_drafted_tokens_fail(tiny, monkeypatch):
    target, draft, ref = tiny
    monkeypatch.setattr(localspec.decoding.decoder, "chain_seen",
                        lambda context, drafted, sampling: lambda i: window(context, [], sampling))
    result = law_check(ref, law_runs(target, draft, ref, RUNS))
    print("blind to drafted", result)
    assert result["forbidden"] > 0 or result["rank"] > result["rank_crit"], f"the wrong history passed: {result}"


def test_greedy_verify_rows_blind_to_the_drafted_tokens_are_caught(pair, monkeypatch):
    """The greedy test's teeth: the wrong history parts from plain decoding away from any tie."""
    sampling = PROCESSINGS["repeat"]
    prompt = pair.prompt_tokens("List the numbers from 1 to 30, one per line, then say done.", True)
    plain = run(pair, None, sampling, prompt)
    monkeypatch.setattr(localspec.decoding.decoder, "chain_seen",
                        lambda context, drafted, cfg: lambda i: window(context, [], cfg))
    gap = near_tie_gap(pair, sampling, prompt, plain, run(pair, "model", sampling, prompt, 6))
    assert gap is not None and gap >= NEAR_TIE, gap
