"""Concurrent generations (engine.slots, loading.pool): batching changes when decodes run, never
what a generation computes.

- Greedy: on the F32 target, each of several generations run at once (their decodes batched in
  one llama_decode per step) equals the same generation run alone, token for token, with the
  draft model (adaptive k) and with prompt lookup.
- The seed: at T = 1 with a fixed k, a seeded generation gives the same text alone and beside
  three others.
- The law at T = 1, on the tiny llama pair of test_tree_decode: a generation that shares every
  step's decodes with three others (their own prompts, drafters, seeds) is checked with
  test_exact_e2e's statistics against the target alone, 2,000 runs; the same runs with the
  residual replaced by p (a wrong rule) must fail, so the test can see a broken law here. The same
  law where each run reuses the cache its slot's last run left, in the non-unified cache serve
  uses, and with 2,2 draft trees in slots of four sequences.
- The batcher: one target decode per step holds every generation's rows; a cancelled slot's
  request fails at its next decode while the others go on.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

import localspec.decoding.decoder
from localspec.config import DecodeConfig, ModelConfig, SamplingConfig
from localspec.decoding.controller import KController
from localspec.decoding.decoder import generate_steps
from localspec.decoding.drafters import PromptLookup
from localspec.decoding.model_drafter import ModelDrafter
from localspec.engine import Cancelled, Model
from localspec.engine.slots import Batcher, Slot
from localspec.loading.pool import SlotPool
from localspec.loading.session import LoadConfig, Session
from tests.law_helpers import CFG, REPEATING, Target, residual_is_p
from tests.test_exact_e2e import check as law_check
from tests.tiny_gguf import write_tiny_gguf

GREEDY = SamplingConfig(temperature=0.0)
TEXTS = ["Write a Python function that reverses a string.", "What is the capital of France? Explain why.",
         "List five fruits and their colours.", "Count from 1 to 20, separated by commas."]


@pytest.fixture(scope="module")
def pooled(model_paths):
    """The embedded pair loaded for 4 slots (and the pool over it)."""
    target, draft = model_paths
    session = Session.load(LoadConfig(str(target), str(draft), "auto", n_ctx=512, threads=2, parallel=4))
    yield SlotPool(session, 4)
    session.close()


def generate(pool: SlotPool, prompt, sampling, decode, kind: str | None, seed: int = 0,
             start: threading.Barrier | None = None) -> list[int]:
    """One generation in a free slot of `pool`, from the calling thread; with `start`, it begins
    only once every thread of that barrier takes part in the batch (none decodes alone first)."""
    slot = pool.acquire(prompt)
    try:
        pool.clear(slot)
        controller = KController(decode.k_max, fixed_k=decode.k)
        drafter = pool.drafter(slot, kind) if kind else None
        with pool.generating(slot, controller):
            if start is not None:
                start.wait(60)
            steps = generate_steps(pool.targets[slot], drafter, prompt, sampling, decode, controller,
                                   np.random.default_rng(seed))
            return [t for s in steps for t in s.tokens]
    finally:
        pool.release(slot)


def together(pool: SlotPool, jobs, aligned: bool = False) -> list[list[int]]:
    """Run every (prompt, sampling, decode, kind, seed) job in its own thread at once; `aligned`:
    none starts before all take part (else a thread may finish a step before another joins, as
    requests arriving at different times do)."""
    out: list = [None] * len(jobs)
    errors: list = []
    start = threading.Barrier(len(jobs)) if aligned else None

    def run(i, job):
        try:
            out[i] = generate(pool, *job, start=start)
        except BaseException as e:   # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return out


@pytest.mark.parametrize("kind", ["auto", "lookup"])
def test_greedy_generations_run_together_equal_each_run_alone(pooled, kind):
    prompts = [pooled.session.prompt_tokens(t, True) for t in TEXTS]
    decode = DecodeConfig(max_tokens=40)
    alone = [generate(pooled, p, GREEDY, decode, kind) for p in prompts]
    plain = [generate(pooled, p, GREEDY, decode, None) for p in prompts]
    before = pooled.batcher.decodes
    both = together(pooled, [(p, GREEDY, decode, kind, 0) for p in prompts])
    assert both == alone == plain
    # batched: far fewer decodes than the 4 generations made alone (each step one target decode
    # for all, drafts batched too)
    assert pooled.batcher.decodes - before < sum(len(a) for a in alone)


def test_a_seeded_generation_is_the_same_beside_others(pooled):
    prompts = [pooled.session.prompt_tokens(t, True) for t in TEXTS]
    decode = DecodeConfig(max_tokens=32, k=3)
    sampled = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95, seed=None)
    alone = [generate(pooled, p, sampled, decode, "model", seed=100 + i) for i, p in enumerate(prompts)]
    both = together(pooled, [(p, sampled, decode, "model", 100 + i) for i, p in enumerate(prompts)])
    assert both == alone


def test_one_target_decode_per_step_holds_every_generation(pooled):
    prompts = [pooled.session.prompt_tokens(t, True) for t in TEXTS]
    rows: list[int] = []
    seen = pooled.batcher.on_decode

    def spy(model, n, logit_rows, seconds):
        if model is pooled.session.target:
            rows.append(n)
        seen(model, n, logit_rows, seconds)
    pooled.batcher.on_decode = spy
    try:
        out = together(pooled, [(p, GREEDY, DecodeConfig(max_tokens=24, k=0), None, 0) for p in prompts],
                       aligned=True)
    finally:
        pooled.batcher.on_decode = seen
    # plain steps: one row per running generation (one token each; an end of generation, a step)
    per = [len(o) + (len(o) < 24) for o in out]
    steps = [r for r in rows if r <= 4]
    assert sum(steps) == sum(per), rows
    assert len(steps) == max(per), rows   # no step of one ran while another waited
    assert steps == sorted(steps, reverse=True), rows


def test_a_cancelled_slot_fails_at_its_next_decode_and_the_others_go_on(pooled):
    prompts = [pooled.session.prompt_tokens(t, True) for t in TEXTS[:2]]
    decode = DecodeConfig(max_tokens=30, k=0)
    alone = generate(pooled, prompts[1], GREEDY, decode, None)
    cancel = threading.Event()
    result: dict = {}

    def victim():
        slot = pooled.acquire(prompts[0])
        pooled.targets[slot].abort_when = cancel
        try:
            pooled.clear(slot)
            with pooled.generating(slot):
                for n, step in enumerate(generate_steps(pooled.targets[slot], None, prompts[0], GREEDY, decode)):
                    if n == 3:
                        cancel.set()
        except Cancelled as e:
            result["cancelled"] = str(e)
        finally:
            pooled.targets[slot].abort_when = None
            pooled.release(slot)
            result["held"] = len(pooled.targets[slot].tokens)
    t = threading.Thread(target=victim)
    t.start()
    other = generate(pooled, prompts[1], GREEDY, decode, None)
    t.join(60)
    assert "stopped between decodes" in result["cancelled"]
    assert other == alone


def test_a_slot_keeps_its_sequences_to_itself(model_paths):
    with Model(ModelConfig(str(model_paths[0]), n_ctx=256, n_seq=4)) as m:
        b = Batcher([m])
        a, c = Slot(m, b, 0, 2, 64), Slot(m, b, 1, 2, 64)
        with b.taking_part():
            a.eval([1, 2, 3])
            c.eval([4, 5])
            c.copy_seq(0, 1)
            assert m.seqs == [[1, 2, 3], [], [4, 5], [4, 5]]
            a.keep_seq(0)
            assert m.seqs[2:] == [[4, 5], [4, 5]]
            with pytest.raises(Exception, match="context full"):
                a.eval(list(range(100)))
            assert m.seqs[0] == [1, 2, 3]


# -- the law at T = 1 ----------------------------------------------------------------------------

K = 2
L = 3
RUNS = 2000
TINY = dict(n_embd=32, n_ff=64, seed=0)
OTHERS = ([1, 5, 9, 13, 17], [1, 40, 41, 42], [1, 7, 16, 7, 16, 7])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(target, draft, the target alone's rows), or for a `cache` mode its (target, draft):
    "unified" (4 slots of one sequence), "split" (llama.cpp's non-unified cache, serve's own
    without trees), "trees" (4 slots of 4 sequences in one unified cache)."""
    folder = tmp_path_factory.mktemp("tiny-concurrent")
    t_path = write_tiny_gguf(folder / "target.gguf", scale=0.8, **TINY)
    d_path = write_tiny_gguf(folder / "draft.gguf", scale=1.1, **TINY)
    modes = {"unified": dict(n_seq=4), "split": dict(n_seq=4, unified=False), "trees": dict(n_seq=16)}
    with contextlib.ExitStack() as stack:
        pairs = {mode: tuple(stack.enter_context(Model(ModelConfig(str(path), n_ctx=4 * 128, **kw)))
                             for path in (t_path, d_path)) for mode, kw in modes.items()}
        alone = stack.enter_context(Model(ModelConfig(str(t_path), n_ctx=128)))
        yield (*pairs["unified"], Target(alone, alone.tokenize(REPEATING)), pairs)


def shared_runs(target, draft, ref: Target, n: int, tree: str = "off", reuse: bool = False):
    """n runs of the measured generation in slot 0 while slots 1-3 generate all along; `reuse`:
    each run starts on the cache the last one left (its prompt found there, the rest cut), as a
    server's next request in the same slot does."""
    batcher = Batcher([draft, target])
    width = target.n_seq // 4
    slots = [(Slot(target, batcher, i, width, 128), Slot(draft, batcher, i, width, 128)) for i in range(4)]
    decode = DecodeConfig(max_tokens=L, k=K, tree=tree)
    done = threading.Event()
    shared = [0, 0]   # target decodes of the measured generation: with others, in all

    def others(i):
        t, d = slots[i]
        r = 0
        with batcher.taking_part():
            while not done.is_set():
                r += 1
                t.reset(), d.reset()
                list(generate_steps(t, ModelDrafter(d), OTHERS[i - 1], CFG, decode, rng=np.random.default_rng([i, r])))
    threads = [threading.Thread(target=others, args=(i,)) for i in (1, 2, 3)]
    for th in threads:
        th.start()
    runs = []
    t, d = slots[0]
    try:
        with batcher.taking_part():
            for r in range(n):
                if not reuse:
                    t.reset(), d.reset()
                tokens, verified, finish = [], [], None
                for step in generate_steps(t, ModelDrafter(d), ref.prompt, CFG, decode, rng=np.random.default_rng([11, r])):
                    tokens += step.tokens
                    verified += [step.n_drafted] * (len(step.tokens) + (step.finish == "stop"))
                    finish = step.finish
                runs.append((tokens, verified, finish))
    finally:
        done.set()
        for th in threads:
            th.join(60)
    return runs, batcher


def test_a_generation_sharing_its_batches_follows_the_target_alone(tiny):
    target, draft, ref, _ = tiny
    runs, batcher = shared_runs(target, draft, ref, RUNS)
    result = law_check(ref, runs)
    print(result, "decodes", batcher.decodes, "shared", batcher.shared)
    # each run's steps (a draft decode and a verify at least) share decodes with the others
    assert batcher.shared >= 2 * RUNS, "the generations did not share their decodes"
    assert result["forbidden"] == 0 and result["tested"] >= RUNS
    assert result["rank"] < result["rank_crit"], f"not the target's law: {result}"
    assert result["first"].ok, f"first token: {result['first']}"
    assert result["pairs"].ok, f"first two tokens: {result['pairs']}"


@pytest.mark.parametrize("cache,tree", [("split", "off"), ("trees", "2,2")])
def test_a_reused_slot_sharing_its_batches_follows_the_target_alone(tiny, cache, tree):
    """The same law where each run reuses its slot's cache (a cached prefix), in serve's
    non-unified cache, and with draft trees inside the slots (every slot drafting trees)."""
    target, draft = tiny[3][cache]
    ref = tiny[2]
    runs, batcher = shared_runs(target, draft, ref, RUNS, tree=tree, reuse=True)
    result = law_check(ref, runs)
    print(cache, tree, result, "decodes", batcher.decodes, "shared", batcher.shared)
    assert batcher.shared >= 2 * RUNS, "the generations did not share their decodes"
    assert result["forbidden"] == 0 and result["tested"] >= RUNS
    assert result["rank"] < result["rank_crit"], f"not the target's law: {result}"
    assert result["first"].ok and result["pairs"].ok, result


def test_a_wrong_rule_sharing_its_batches_fails(tiny, monkeypatch):
    """Teeth: the same runs, resampling from p instead of the residual after a rejection."""
    target, draft, ref, _ = tiny
    monkeypatch.setattr(localspec.decoding.decoder, "accept_sampled", residual_is_p)
    runs, _ = shared_runs(target, draft, ref, RUNS)
    result = law_check(ref, runs)
    print("residual_is_p", result)
    assert result["rank"] >= result["rank_crit"] or not result["first"].ok, f"the wrong rule passed: {result}"


def test_a_request_goes_to_the_slot_holding_most_of_its_prompt(pooled):
    prompts = [pooled.session.prompt_tokens(t, True) for t in TEXTS[:2]]
    decode = DecodeConfig(max_tokens=4, k=0)
    generate(pooled, prompts[0], GREEDY, decode, None)
    held = [i for i in range(4) if pooled.cached(i)[:len(prompts[0]) - 1] == prompts[0][:-1]]
    assert len(held) == 1
    follow_up = prompts[0] + [1, 2, 3]
    assert pooled.acquire(follow_up) == held[0]
    try:
        other = pooled.acquire(prompts[1])
        assert other is not None and other != held[0]
        pooled.release(other)
    finally:
        pooled.release(held[0])


# -- the options ---------------------------------------------------------------------------------

from typer.testing import CliRunner   # noqa: E402

from localspec.cli.app import app   # noqa: E402

runner = CliRunner()


@pytest.mark.parametrize("args, needle", [
    (["serve", "--parallel", "0"], "--parallel must be between 1 and"),
    (["serve", "--parallel", "33"], "--parallel must be between 1 and"),
    (["bench", "--concurrency", "1,x"], "--concurrency takes numbers like 1,2,4"),
    (["bench", "--concurrency", "0"], "--concurrency levels must be between 1 and"),
    (["bench", "--concurrency", "2", "--compare", "llama-cpp-python"], "--compare runs one generation at a time"),
])
def test_bad_concurrency_options_are_one_error_line_and_exit_2(args, needle):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in result.output, err
    assert needle in err
