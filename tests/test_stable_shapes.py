"""Stable decode shapes (engine/shapes.py): the sizes a model pads to, a padded decode's rows and
cache, and the output unchanged with both models padding: greedy equal to plain decoding (chains
and trees) and, at T = 1, the target's law (test_exact_e2e's statistics, with a wrong rule that
must fail them under padding too)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import llama_cpp as C
import localspec.decoding.decoder
from localspec.config import DecodeConfig, ModelConfig, Placement
from localspec.decoding.decoder import generate_steps
from localspec.decoding.drafters import PromptLookup
from localspec.decoding.model_drafter import ModelDrafter
from localspec.engine import Model
from localspec.engine.shapes import SHRINK_AFTER, TOP, Shapes, bucket
from tests.law_helpers import CFG as CFG_T1, NEAR_TIE, REPEATING, Target, always_accept, near_tie_gap
from tests.test_decoding import GREEDY, N_GREEDY, PROMPTS, chat
from tests.test_exact_e2e import K, check, make_drafter

PADDED = Placement(stable_shapes="on")
GREEDY_PROMPTS = PROMPTS[:5]   # half of test_decoding's: the suite's time (divergences allowed: 1, not 2)


# -- the sizes -----------------------------------------------------------------------------------

def test_sizes_grow_at_once_and_shrink_only_after_a_run_of_small_requests():
    s = Shapes()
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 33)] == [1, 2, 4, 8, 8, 16, 64]
    assert s.rows(1, True) == 1
    assert s.rows(5, True) == 8          # a verify of 5 rows: padded to 8
    assert s.rows(1, True) == 8          # a plain step between verifies keeps the shape
    assert s.rows(7, True) == 8
    for _ in range(SHRINK_AFTER - 1):
        assert s.rows(2, True) == 8
    assert s.rows(2, True) == 2          # a run of small requests: the size follows them down
    assert s.rows(TOP + 1, True) == TOP + 1   # a prompt is never padded, and moves nothing
    assert s.size == 2
    assert s.rows(30, False) == 30       # a long read wanting its last row only: as it is
    assert s.size == 2
    assert s.rows(3, False) == 4         # a short one (a draft's catch-up) moves the size


def test_off_unless_asked_on_a_machine_without_cuda(model_paths):
    with Model(ModelConfig(str(model_paths[1]), n_ctx=256)) as m:
        assert m.shapes is None
    with Model(ModelConfig(str(model_paths[1]), n_ctx=256, placement=PADDED)) as m:
        assert m.shapes is not None


# -- a padded decode -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def padded_target(model_paths):
    with Model(ModelConfig(str(model_paths[0]), n_ctx=1024, n_seq=4, placement=PADDED)) as m:
        yield m


@pytest.fixture(scope="module")
def padded_draft(model_paths):
    with Model(ModelConfig(str(model_paths[1]), n_ctx=1024, n_seq=4, placement=PADDED)) as m:
        yield m


def _cells_end(model: Model, seq: int = 0) -> int:
    """One past the highest position sequence `seq` holds in llama.cpp's memory."""
    return int(C.llama_memory_seq_pos_max(model._mem, seq)) + 1


def test_a_padded_decode_returns_the_rows_asked_and_keeps_only_the_text(padded_target, target):
    prompt = chat(target, PROMPTS[0])
    block = prompt[-5:]
    target.sync(prompt[:-5])
    want = np.array(target.eval(block, logits_from=0))
    target.truncate(0)
    padded_target.reset()
    padded_target.shapes.size = 16   # a verify of 5 rows becomes 16
    padded_target.sync(prompt[:-5])
    got = padded_target.eval(block, logits_from=0)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert padded_target.tokens == prompt and _cells_end(padded_target) == len(prompt)
    # a catch-up wanting its last row only
    padded_target.truncate(len(prompt) - 2)
    last = padded_target.eval(prompt[-2:], logits_from=-1)
    assert last.shape == (1, want.shape[1])
    np.testing.assert_allclose(last[0], want[-1], rtol=1e-4, atol=1e-4)
    assert _cells_end(padded_target) == len(prompt)
    padded_target.reset()


def test_a_padded_tree_keeps_its_rows_and_the_accepted_path_only(padded_target, target):
    prompt = chat(target, PROMPTS[1])
    tokens, parents = [prompt[-1], 11, 12, 13], [-1, 0, 0, 1]
    padded_target.reset()
    padded_target.shapes.size = 8
    padded_target.sync(prompt[:-1])
    rows = padded_target.eval_tree(tokens, parents)
    assert rows.shape[0] == len(tokens)
    assert _cells_end(padded_target) == len(prompt) + 1   # sequence 0: the root and its first leaf
    assert _cells_end(padded_target, 1) == len(prompt) + 2
    target.sync(prompt[:-1])
    chain = np.array(target.eval([prompt[-1], 11, 13], logits_from=0))
    target.truncate(0)
    np.testing.assert_allclose(rows[[0, 1, 3]], chain, rtol=1e-4, atol=1e-4)
    padded_target.keep_path([0, 1, 3])
    assert padded_target.tokens == [*prompt[:-1], prompt[-1], 11, 13]
    assert _cells_end(padded_target) == len(prompt) + 2
    assert all(not held for held in padded_target.seqs[1:])
    padded_target.reset()


# -- the output is unchanged ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_greedy(target):
    """Plain greedy continuations, computed unpadded."""
    out = {}
    for text in GREEDY_PROMPTS:
        steps = generate_steps(target, None, chat(target, text), GREEDY, DecodeConfig(max_tokens=N_GREEDY, k=0))
        out[text] = [t for s in steps for t in s.tokens]
    return out


@pytest.mark.parametrize("kind,tree", [("model", "off"), ("lookup", "off"), ("model", "2,2")])
def test_greedy_with_both_models_padded_is_plain_greedy(padded_target, padded_draft, target, plain_greedy, kind, tree):
    """Equal to plain greedy decoding up to near-ties: llama.cpp rounds a row a little differently
    in a batch of another size (F32 too), and a divergence must be at such a tie (counted)."""
    drafted, gaps = 0, []
    for text in GREEDY_PROMPTS:
        padded_target.reset()
        padded_draft.reset()
        drafter = ModelDrafter(padded_draft) if kind == "model" else PromptLookup()
        prompt = chat(padded_target, text)
        steps = list(generate_steps(padded_target, drafter, prompt, GREEDY,
                                    DecodeConfig(max_tokens=N_GREEDY, tree=tree, k=4 if tree != "off" else None)))
        gap = near_tie_gap(SimpleNamespace(target=target), GREEDY, prompt, plain_greedy[text],
                           [t for s in steps for t in s.tokens])
        if gap is not None:
            gaps.append(gap)
            assert gap < NEAR_TIE, f"{kind} {tree}: left plain decoding {gap:.4f} from a tie ({text!r})"
        drafted += sum(s.n_drafted for s in steps)
    print(f"near-tie report (stable shapes, {kind} {tree}): {len(gaps)} of {len(GREEDY_PROMPTS)} prompts diverged {gaps}")
    assert len(gaps) <= 1
    assert drafted > 0
    assert padded_target.shapes.padded > 0 and (kind == "lookup" or padded_draft.shapes.padded > 0)


RUNS = 150


def _runs(target, draft, n, seed=3):
    prompt = target.tokenize(REPEATING)
    runs = []
    for r in range(n):
        tokens, verified, finish = [], [], None
        for step in generate_steps(target, make_drafter("sharp", draft), prompt, CFG_T1, DecodeConfig(max_tokens=5, k=K),
                                   rng=np.random.default_rng([seed, r])):
            tokens += step.tokens
            verified += [step.n_drafted] * (len(step.tokens) + (step.finish == "stop"))
            finish = step.finish
        runs.append((tokens, verified, finish))
    return runs


@pytest.fixture(scope="module")
def law_reference(target):
    return Target(target, target.tokenize(REPEATING), CFG_T1)


def test_t1_law_with_both_models_padded(padded_target, padded_draft, law_reference):
    padded_target.reset()
    padded_draft.reset()
    before = padded_target.shapes.padded
    result = check(law_reference, _runs(padded_target, padded_draft, RUNS))
    print(result)
    assert padded_target.shapes.padded > before
    assert result["tested"] >= 1.5 * RUNS and result["forbidden"] == 0
    assert result["rank"] < result["rank_crit"], f"not the target's law: {result}"
    assert result["first"].ok, f"first token: {result['first']}"


def test_a_wrong_rule_still_fails_under_padding(padded_target, padded_draft, law_reference, monkeypatch):
    monkeypatch.setattr(localspec.decoding.decoder, "accept_sampled", always_accept)
    result = check(law_reference, _runs(padded_target, padded_draft, 60))
    assert result["rank"] >= result["rank_crit"], f"always_accept passed: {result}"


# -- near the context's end: the padding must fit the shared cache's cells -------------------------

END_CTX = 256   # llama.cpp's own size here (it pads to 256): the cache has exactly these cells


@pytest.fixture(scope="module")
def near_end(model_paths):
    with Model(ModelConfig(str(model_paths[0]), n_ctx=END_CTX, n_seq=4, placement=PADDED)) as t, \
            Model(ModelConfig(str(model_paths[1]), n_ctx=END_CTX, n_seq=4, placement=PADDED)) as d:
        assert C.llama_n_ctx(t._ctx) == END_CTX == t.n_ctx
        yield t, d


def long_prompt(model: Model, n: int) -> list[int]:
    text = model.tokenize(" ".join(["The lighthouse keeper climbed the stairs and lit the lamp."] * 40))
    return text[:n]


def test_a_padded_tree_at_the_contexts_end_fits_the_cells(near_end, target):
    """A 2,2 tree (7 rows with its root) after 249 cached tokens: padded to 8 rows it would need
    257 cells of 256, though sequence 0's positions end at 252. Decoded unpadded instead."""
    t, _ = near_end
    prompt = long_prompt(t, END_CTX - 6)
    tokens, parents = [prompt[-1], 11, 12, 13, 14, 15, 16], [-1, 0, 0, 1, 1, 2, 2]
    t.reset()
    t.shapes.size = 8
    t.sync(prompt[:-1])
    rows = t.eval_tree(tokens, parents)
    assert rows.shape[0] == len(tokens)
    target.sync(prompt[:-1])
    chain = np.array(target.eval([prompt[-1], 11, 13], logits_from=0))
    target.truncate(0)
    np.testing.assert_allclose(rows[[0, 1, 3]], chain, rtol=1e-4, atol=1e-4)
    t.keep_path([0, 1, 3])
    assert t.tokens == [*prompt, 11, 13] and _cells_end(t) == len(prompt) + 2
    t.reset()


@pytest.mark.parametrize("tree", ["2,2", "off"])
def test_a_generation_with_trees_runs_to_the_contexts_end(near_end, target, tree):
    """Ends with finish "context", greedy output plain greedy's (up to a counted near-tie)."""
    t, d = near_end
    prompt = long_prompt(t, END_CTX - 40)
    plain = [x for s in generate_steps(target, None, prompt, GREEDY, DecodeConfig(max_tokens=END_CTX - len(prompt)))
             for x in s.tokens]
    t.reset()
    d.reset()
    steps = list(generate_steps(t, ModelDrafter(d), prompt, GREEDY, DecodeConfig(max_tokens=10_000, tree=tree, k=4)))
    out = [x for s in steps for x in s.tokens]
    assert steps[-1].finish == "context" and len(prompt) + len(out) == END_CTX
    assert sum(s.branches > 1 for s in steps) > 0 or tree == "off"
    gap = near_tie_gap(SimpleNamespace(target=target), GREEDY, prompt, plain, out)
    assert gap is None or gap < NEAR_TIE, f"left plain decoding {gap:.4f} from a tie"
    t.reset()
    d.reset()
