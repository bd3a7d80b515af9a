"""Draft trees end to end on the real models: greedy output equals plain decoding, the caches hold
exactly the emitted text after every step (rejections at every depth), and at T = 1 the law of
the first emitted tokens is the target's own, with a wrong sibling rule that must fail: also
untruncated, over a vocabulary of three of Dense's blocks (exact: rank 0.07, pairs 9.2; skipping
the residual update: rank 64, pairs 185, against 21.8 and 32.3).

The rule itself (recursive rejection sampling over siblings) is proved at the level of
distributions in test_tree_rule.py; here the decoder, the drafters' trees, the engine's tree
batches and the caches are under test.
"""

from __future__ import annotations

import numpy as np
import pytest

import localspec.decoding.decoder
from localspec.config import DecodeConfig, ModelConfig, SamplingConfig
from localspec.decoding.auto import AutoDrafter
from localspec.decoding.decoder import generate_steps
from localspec.decoding.drafters import PromptLookup
from localspec.decoding.model_drafter import ModelDrafter
from localspec.engine import Model
from tests.law_helpers import CFG, REPEATING, Target, no_residual_update, rest_collapsed_tree
from tests.test_exact_e2e import check as law_check
from tests.tiny_gguf import TOKENS, write_tiny_gguf

GREEDY = SamplingConfig(temperature=0.0)
PROMPTS = [
    "Write a Python function that reverses a string.",
    "List five fruits and their colours.",
    "Rename the variable x to total in: def f(x):\n    x = x + 1\n    return x * x",
]
N_TOKENS = 40
SHAPES = ["2,2,2", "3,1,1,1", "4", "auto"]
WIDTH = 8


@pytest.fixture(scope="module")
def tree_target(model_paths):
    with Model(ModelConfig(str(model_paths[0]), n_ctx=1024, n_seq=WIDTH)) as m:
        yield m


@pytest.fixture(scope="module")
def tree_draft(model_paths):
    with Model(ModelConfig(str(model_paths[1]), n_ctx=1024, n_seq=WIDTH)) as m:
        yield m


def make(kind: str, draft):
    if kind == "model":
        return ModelDrafter(draft)
    if kind == "lookup":
        return PromptLookup()
    return AutoDrafter(ModelDrafter(draft))


def run(target, drafter, prompt, sampling, decode, rng=None, check=None):
    tokens, steps = [], []
    for step in generate_steps(target, drafter, prompt, sampling, decode, rng=rng):
        tokens += step.tokens
        steps.append(step)
        if check is not None:
            check(prompt + tokens, step)
    return tokens, steps


@pytest.fixture(scope="module")
def plain(tree_target):
    out = {}
    for text in PROMPTS:
        prompt = tree_target.chat_prompt([{"role": "user", "content": text}])
        out[text] = run(tree_target, None, prompt, GREEDY, DecodeConfig(max_tokens=N_TOKENS, k=0))[0]
    return out


@pytest.mark.parametrize("kind", ["model", "lookup", "auto"])
@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_tree_equals_plain(tree_target, tree_draft, plain, kind, shape):
    """T = 0: the tree's accepted branch follows the target's argmax, so the text is plain greedy
    decoding's, token for token, on the F32 target; and the caches hold the text after each step."""
    trees = 0

    def check(context, step):
        assert tree_target.tokens == context[:-1] or step.finish is not None
        assert all(not s for s in tree_target.seqs[1:]), "a rejected branch stayed in the target's cache"
        assert all(not s for s in tree_draft.seqs[1:]), "a rejected branch stayed in the draft's cache"

    for text in PROMPTS:
        prompt = tree_target.chat_prompt([{"role": "user", "content": text}])
        decode = DecodeConfig(max_tokens=N_TOKENS, k=4 if shape != "auto" else None, tree=shape)
        tokens, steps = run(tree_target, make(kind, tree_draft), prompt, GREEDY, decode, check=check)
        assert tokens == plain[text], f"{kind} {shape}: greedy tree output diverged for {text!r}"
        trees += sum(s.branches > 1 for s in steps)
    if shape != "auto" and kind != "lookup":
        assert trees > 0, "no step verified a tree: the test would prove nothing"


class Noisy:
    """A draft whose logits get Gaussian noise: its trees are rejected at every depth."""

    def __init__(self, model, sigma: float, seed: int):
        self._model, self._sigma, self._rng = model, sigma, np.random.default_rng(seed)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def _noisy(self, rows):
        return None if rows is None else rows + self._rng.normal(0, self._sigma, rows.shape).astype(np.float32)

    def eval(self, tokens, logits_from=None):
        return self._noisy(self._model.eval(tokens, logits_from))

    def decode_rows(self, tokens, seqs, logits=None):
        return self._noisy(self._model.decode_rows(tokens, seqs, logits))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_after_rejection_at_every_depth(tree_target, tree_draft, temperature):
    """A noisy draft's 2,2,2 trees are rejected at every depth; after each step the target's cache
    is the text but its last token, no other sequence of either model holds a cell, and after a
    tree step the draft's sequence 0 holds a prefix of the text (the accepted branch)."""
    prompt = tree_target.chat_prompt([{"role": "user", "content": PROMPTS[0]}])
    depths = set()
    sampling = SamplingConfig(temperature=temperature, top_k=40, top_p=0.95, min_p=0.0)

    def check(context, step):
        if step.finish is None:
            assert tree_target.tokens == context[:-1]
            if step.branches > 1:   # after a chain the draft drops its rejected tail lazily, next step
                assert tree_draft.tokens == context[:len(tree_draft.tokens)]
        assert all(not s for s in tree_target.seqs[1:])
        assert all(not s for s in tree_draft.seqs[1:])
        if step.branches > 1 and step.n_accepted < step.n_drafted:
            depths.add(step.n_accepted)

    for seed in range(3):
        drafter = ModelDrafter(Noisy(tree_draft, 2.5, seed))
        run(tree_target, drafter, prompt, sampling, DecodeConfig(max_tokens=40, k=3, tree="2,2,2"),
            rng=np.random.default_rng(seed), check=check)
    assert {0, 1, 2} <= depths, f"rejections seen only at depths {sorted(depths)}"


def test_tree_verify_uses_one_target_pass_per_step(tree_target, tree_draft, monkeypatch):
    """Every step is one target evaluation whatever the tree's shape."""
    calls = []
    real = tree_target.eval_tree
    monkeypatch.setattr(tree_target, "eval_tree", lambda *a: calls.append(1) or real(*a))
    prompt = tree_target.chat_prompt([{"role": "user", "content": PROMPTS[1]}])
    _, steps = run(tree_target, ModelDrafter(tree_draft), prompt, GREEDY, DecodeConfig(max_tokens=24, k=3, tree="3,2"))
    assert len(calls) == sum(s.branches > 1 for s in steps) > 0
    assert max(s.n_nodes for s in steps) <= 3 + 6 + 6 and max(s.branches for s in steps) > 1


# -- the law at T = 1 ----------------------------------------------------------------------------
#
# On tiny random llama models (tests/tiny_gguf.py: llama.cpp runs them in well under a millisecond,
# so each case gets thousands of runs): the target, and a draft with the same weights at another
# scale (correlated with the target, often rejected). Everything else is the real path: the
# decoder, the drafters' trees, the engine's tree batches. Each run generates L = 3 tokens with a
# fixed k = 2, so its first step verifies a tree of depth 2; the statistics are test_exact_e2e's
# (`check`): Pearson chi-square of the first token against p_1, and the rank-class chi-square of
# every token emitted by a step that verified >= 2 depths, against its own p_i.

K = 2
L = 3
RUNS = 2000
TINY = dict(n_embd=32, n_ff=64, seed=0)


def rival_prompt(model) -> list[int]:
    """Token ids ending in a token A that the text followed by three different tokens before,
    those being the target's likeliest after the prompt itself (so that lookup's rivals carry
    real probability, and a wrong sibling rule shows): [bos, A, x, B, A, y, B, A, z, B, A]."""
    a, b = 7, 16
    top = [20, 30, 40]
    for _ in range(4):   # the rivals change the row they are taken from: a few rounds settle them
        ids = [1, a, top[0], b, a, top[1], b, a, top[2], b, a]
        model.truncate(0)
        row = model.eval(ids, logits_from=-1)[0]
        top = [int(t) for t in np.argsort(-row)[:3]]
    model.truncate(0)
    return [1, a, top[0], b, a, top[1], b, a, top[2], b, a]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(target, draft, the target's reference rows) of the tiny pair."""
    folder = tmp_path_factory.mktemp("tiny-tree")
    t_path = write_tiny_gguf(folder / "target.gguf", scale=0.8, **TINY)
    d_path = write_tiny_gguf(folder / "draft.gguf", scale=1.1, **TINY)
    with Model(ModelConfig(str(t_path), n_ctx=256, n_seq=WIDTH)) as t, \
            Model(ModelConfig(str(d_path), n_ctx=256, n_seq=WIDTH)) as d:
        prompts = {"model": t.tokenize(REPEATING), "lookup": rival_prompt(t)}
        yield t, d, {kind: Target(t, ids) for kind, ids in prompts.items()}


def tree_runs(target, draft, refs, kind: str, shape: str, n: int):
    """n runs as test_exact_e2e's `sample_runs` returns them (at the reference's own sampling),
    and how many opened with a tree."""
    prompt, cfg = refs[kind].prompt, refs[kind].cfg
    runs, trees = [], 0
    for r in range(n):
        drafter = ModelDrafter(draft) if kind == "model" else PromptLookup()
        tokens, verified, finish = [], [], None
        steps = list(generate_steps(target, drafter, prompt, cfg, DecodeConfig(max_tokens=L, k=K, tree=shape),
                                    rng=np.random.default_rng([11, r])))
        for step in steps:
            tokens += step.tokens
            verified += [step.n_drafted] * (len(step.tokens) + (step.finish == "stop"))
            finish = step.finish
        trees += steps[0].branches > 1
        runs.append((tokens, verified, finish))
    return runs, trees


@pytest.mark.parametrize("shape", ["2,2,2", "3,1,1,1", "4"])
@pytest.mark.parametrize("kind", ["model", "lookup"])
def test_tree_output_follows_the_target(tiny, kind, shape):
    target, draft, refs = tiny
    runs, trees = tree_runs(target, draft, refs, kind, shape, RUNS)
    assert trees >= 0.9 * RUNS, f"only {trees} of {RUNS} runs opened with a tree"
    result = law_check(refs[kind], runs)
    print(kind, shape, result)
    assert result["forbidden"] == 0
    assert result["tested"] >= RUNS
    assert result["rank"] < result["rank_crit"], f"not the target's law: {result}"
    assert result["first"].ok, f"first token: {result['first']}"
    assert result["pairs"].ok, f"first two tokens: {result['pairs']}"


@pytest.mark.parametrize("kind,shape", [("model", "2,2,2"), ("lookup", "4")])
def test_a_rule_that_skips_the_residual_update_fails(tiny, monkeypatch, kind, shape):
    """Teeth: the same statistics, with siblings tested against p instead of the residual."""
    target, draft, refs = tiny
    monkeypatch.setattr(localspec.decoding.decoder, "accept_tree_sampled", no_residual_update)
    runs, _ = tree_runs(target, draft, refs, kind, shape, RUNS)
    result = law_check(refs[kind], runs)
    print("no_residual_update", kind, shape, result)
    assert result["rank"] >= result["rank_crit"] or not result["first"].ok, f"the wrong rule passed: {result}"


def test_trees_near_the_end_of_the_context(tmp_path):
    """With few cells left the tree falls back to its first branch (the unified cache holds the
    text and every node), and the text stays plain greedy decoding's up to the context's end."""
    t_path = write_tiny_gguf(tmp_path / "t.gguf", scale=0.8, **TINY)
    d_path = write_tiny_gguf(tmp_path / "d.gguf", scale=1.1, **TINY)
    with Model(ModelConfig(str(t_path), n_ctx=40, n_seq=WIDTH)) as t, \
            Model(ModelConfig(str(d_path), n_ctx=40, n_seq=WIDTH)) as d:
        prompt = t.tokenize(REPEATING)[:24]
        plain, _ = run(t, None, prompt, GREEDY, DecodeConfig(max_tokens=64, k=0))
        tokens, steps = run(t, ModelDrafter(d), prompt, GREEDY, DecodeConfig(max_tokens=64, k=4, tree="4,2"))
    assert tokens == plain
    assert steps[-1].finish in ("context", "stop")
    assert any(s.branches > 1 for s in steps)


def test_a_rule_that_keeps_each_ranks_mass_fails_the_pair_check(tiny, monkeypatch):
    """The joint statistic's teeth: the rank classes and the first token cannot see `rest_collapsed`."""
    target, draft, refs = tiny
    monkeypatch.setattr(localspec.decoding.decoder, "accept_tree_sampled", rest_collapsed_tree)
    runs, _ = tree_runs(target, draft, refs, "model", "2,2,2", RUNS)
    result = law_check(refs["model"], runs)
    print("rest_collapsed_tree", result)
    assert not result["pairs"].ok, f"the wrong rule passed the pair check: {result}"
    # and it is the pair check that sees it: the others pass (the runs' rank classes are the exact
    # rule's own, draw for draw)
    assert result["rank"] < result["rank_crit"] and result["first"].ok, result


# -- untruncated, over several of Dense's blocks ------------------------------------------------------

UNTRUNCATED = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
WIDE_TOKENS = [*TOKENS, *(f"▁w{i}" for i in range(2800))]
"""3,073 ids: Dense rows span three of its 1,024-id blocks (the tree's q rows, their `without`
chains and the residuals cross block borders)."""


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-tree-wide")
    t_path = write_tiny_gguf(folder / "target.gguf", WIDE_TOKENS, scale=1.6, **TINY)
    d_path = write_tiny_gguf(folder / "draft.gguf", WIDE_TOKENS, scale=2.0, **TINY)
    with Model(ModelConfig(str(t_path), n_ctx=256, n_seq=WIDTH)) as t, \
            Model(ModelConfig(str(d_path), n_ctx=256, n_seq=WIDTH)) as d:
        yield t, d, {"model": Target(t, t.tokenize(REPEATING), UNTRUNCATED)}


@pytest.mark.parametrize("rule", ["exact", "no_residual_update"])
def test_untruncated_trees_over_several_blocks(wide, monkeypatch, rule):
    target, draft, refs = wide
    kinds = set()
    right = localspec.decoding.decoder.accept_tree_sampled
    chosen = right if rule == "exact" else no_residual_update

    def spy(tree, p, rng):
        kinds.add(type(p[0]).__name__)
        return chosen(tree, p, rng)
    monkeypatch.setattr(localspec.decoding.decoder, "accept_tree_sampled", spy)
    runs, trees = tree_runs(target, draft, refs, "model", "2,2", RUNS)
    result = law_check(refs["model"], runs)
    print(rule, f"{trees} trees", kinds, result)
    assert target.n_vocab > 2 * 1024 and kinds == {"Dense"} and trees >= 0.9 * RUNS
    if rule == "exact":
        assert result["forbidden"] == 0 and result["rank"] < result["rank_crit"]
        assert result["first"].ok and result["pairs"].ok, result
    else:
        assert result["rank"] >= result["rank_crit"] or not result["first"].ok or not result["pairs"].ok, result
