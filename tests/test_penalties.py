"""Repetition penalties and logit bias (decoding.processing), exact under speculation.

- The processing is llama.cpp's: on random rows and histories it equals what llama.cpp's own
  samplers (`llama_sampler_init_logit_bias`, `llama_sampler_init_penalties`) make of them.
- Greedy: under each penalty and a logit bias, speculative output equals plain output on the F32
  target, with the draft model and with prompt lookup, and the processing did change the text.
- The law at T = 1 on the tiny llama pair (test_concurrent's): with a strong repeat penalty and
  presence penalty, a generation drafting k = 2 tokens per step follows the target's processed
  distribution (test_exact_e2e's statistics against the target alone, 2,000 runs), as chains and
  as 2,2 trees (each verify row penalized by its own path), and so does one under a logit bias
  with a frequency penalty. Controls: a draft left unprocessed must still pass (it only lowers α);
  verify rows that leave the drafted tokens (or a tree row's path) out of the penalty history, or
  that drop the bias past a step's first row, must fail.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np
import pytest

import llama_cpp as C

import localspec.decoding.decoder
import localspec.decoding.model_drafter
import localspec.decoding.sampling
from localspec.config import DecodeConfig, ModelConfig, SamplingConfig
from localspec.decoding.decoder import generate_steps
from localspec.decoding.drafters import PromptLookup
from localspec.decoding.model_drafter import ModelDrafter
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
BIASED = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95, min_p=0.0, frequency_penalty=1.5, repeat_last_n=16)
"""With a logit bias chosen from the target's first row (the `biased` fixture)."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-penalties")
    t_path = write_tiny_gguf(folder / "target.gguf", scale=0.8, n_embd=32, n_ff=64, seed=0)
    d_path = write_tiny_gguf(folder / "draft.gguf", scale=1.1, n_embd=32, n_ff=64, seed=0)
    # four sequences each (a unified cache): room for a tree's branches
    with Model(ModelConfig(str(t_path), n_ctx=128, n_seq=4)) as t, \
            Model(ModelConfig(str(d_path), n_ctx=128, n_seq=4)) as d, \
            Model(ModelConfig(str(t_path), n_ctx=128)) as alone:
        yield t, d, Target(alone, alone.tokenize(REPEATING), PENALIZED)


@pytest.fixture(scope="module")
def biased(tiny):
    """The target's rows under BIASED: a logit bias on the first row's likeliest token (down), its
    fourth (up) and its twentieth (up a lot), with a frequency penalty."""
    alone, prompt = tiny[2].model, tiny[2].prompt
    alone.sync(prompt[:-1])
    row = alone.eval(prompt[-1:], logits_from=0)[0]
    order = [int(t) for t in np.argsort(-row, kind="stable")]
    alone.truncate(0)
    cfg = replace(BIASED, logit_bias=((order[0], -2.0), (order[3], 2.5), (order[19], 4.0)))
    return Target(alone, prompt, cfg)


def law_runs(target, draft, ref: Target, n: int, tree: str = "off", counts: dict | None = None):
    """n runs at the reference's own sampling."""
    runs = []
    for r in range(n):
        tokens, verified, finish = [], [], None
        for step in generate_steps(target, ModelDrafter(draft), ref.prompt, ref.cfg,
                                   DecodeConfig(max_tokens=L, k=K, tree=tree), rng=np.random.default_rng([23, r])):
            if counts is not None:
                counts["tree_steps"] = counts.get("tree_steps", 0) + (step.branches > 1)
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
    assert result["pairs"].ok, f"first two tokens: {result['pairs']}"


def test_penalized_tree_sampling_follows_the_target(tiny):
    """Penalties along a tree's paths, no grammar: each verify row's history is its own path."""
    target, draft, ref = tiny
    counts: dict = {}
    result = law_check(ref, law_runs(target, draft, ref, RUNS, tree="2,2", counts=counts))
    print(f"{counts['tree_steps']} tree steps", result)
    assert counts["tree_steps"] >= RUNS // 2
    assert result["forbidden"] == 0 and result["rank"] < result["rank_crit"]
    assert result["first"].ok and result["pairs"].ok, result


def test_tree_rows_penalized_blind_to_their_path_fail(tiny, monkeypatch):
    target, draft, ref = tiny
    monkeypatch.setattr(localspec.decoding.decoder, "tree_seen",
                        lambda context, tokens, parents, sampling: lambda i: window(context, [], sampling))
    result = law_check(ref, law_runs(target, draft, ref, RUNS, tree="2,2"))
    print("tree rows blind to their path", result)
    assert result["forbidden"] > 0 or result["rank"] > result["rank_crit"] or not result["pairs"].ok, \
        f"the wrong history passed: {result}"


def test_biased_sampling_follows_the_target(tiny, biased):
    """The law at T = 1 under a logit bias and a frequency penalty."""
    target, draft, _ = tiny
    result = law_check(biased, law_runs(target, draft, biased, RUNS))
    print(biased.cfg.logit_bias, result)
    assert result["forbidden"] == 0 and result["tested"] >= RUNS
    assert result["rank"] < result["rank_crit"], f"not the target's law: {result}"
    assert result["first"].ok and result["pairs"].ok, result


def test_verify_rows_past_the_first_unbiased_fail(tiny, biased, monkeypatch):
    """Teeth: a decoder that applies the bias to the first verify row only (every step's first token
    is right; the rest are not)."""
    target, draft, _ = tiny
    right = localspec.decoding.sampling.processed
    monkeypatch.setattr(localspec.decoding.sampling, "processed", lambda row, cfg, seen, i, states=None: right(
        row, replace(cfg, logit_bias=()) if i else cfg, seen, i, states))
    result = law_check(biased, law_runs(target, draft, biased, RUNS))
    print("bias on the first verify row only", result)
    assert result["forbidden"] > 0 or result["rank"] > result["rank_crit"] or not result["pairs"].ok, \
        f"the wrong bias passed: {result}"


def test_an_unprocessed_draft_still_follows_the_target(tiny, monkeypatch):
    target, draft, ref = tiny
    monkeypatch.setattr(localspec.decoding.model_drafter, "processed", lambda row, cfg, seen, i, states=None: row)
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
