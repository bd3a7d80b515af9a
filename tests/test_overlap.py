"""Drafting while the target verifies (`decoding.overlap`): the thread is always joined, greedy
output stays plain greedy's, and sampled output keeps the target's law where drafts made ahead are
used (with a wrong-row control that must fail the same statistic)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import localspec.decoding.decoder
from localspec.config import DecodeConfig, SamplingConfig
from localspec.decoding import overlap
from localspec.decoding.auto import AutoDrafter
from localspec.decoding.decoder import generate_steps
from localspec.decoding.model_drafter import ModelDrafter
from tests.law_helpers import CFG, REPEATING
from localspec import machine
from tests.test_exact_e2e import Scaled, check, reference  # noqa: F401 - `reference` is a fixture

GREEDY = SamplingConfig(temperature=0.0)
PROMPTS = ["Tell me about lighthouses.", "Write a haiku about autumn rain.", "How do I make a cup of tea?",
           "List five fruits and their colours."]


# ---- the thread ---------------------------------------------------------------------------------

def test_overlapped_returns_the_verify_and_drafts_until_it_is_done():
    ticks = []

    def ahead(done):
        while not done():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    result, at, past = overlapped_run(lambda: (time.sleep(0.03), "rows")[1], ahead)
    assert result == "rows" and len(ticks) >= 5 and ticks[-1] <= at and 0 <= past < 0.02


def overlapped_run(verify, ahead):
    return overlap.overlapped(verify, ahead)


def test_the_verify_error_is_raised_after_the_drafting():
    seen = []

    def verify():
        time.sleep(0.01)
        raise ValueError("decode failed")

    def ahead(done):
        while not done():
            time.sleep(0.001)
        seen.append("drafting ended")

    with pytest.raises(ValueError, match="decode failed"):
        overlap.overlapped(verify, ahead)
    assert seen == ["drafting ended"]


def test_a_ctrl_c_while_drafting_waits_for_the_decode():
    """The target's cache must not be touched (rolled back by the decoder's `finally`) while its
    decode still runs in the thread."""
    finished = threading.Event()

    def verify():
        time.sleep(0.05)
        finished.set()

    def ahead(done):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        overlap.overlapped(verify, ahead)
    assert finished.is_set()


# ---- the judge: overlap only where the target's decodes leave a core free ------------------------

@pytest.mark.parametrize("other,cpus,verdict", [(0.1, 1, True), (1.9, 2, False), (0.9, 2, True), (None, 2, True)])
def test_the_judge_overlaps_where_a_core_stays_free(monkeypatch, other, cpus, verdict):
    """A worker on this machine keeps the draft's cores busy while it decodes (other ≈ 1.9 of 2):
    drafting beside it slowed both (overlapping lost 10-35 % there). Separate machines: other ≈ 0.
    Without /proc/stat (other None) nothing tells, and a target on RPC workers overlaps."""
    monkeypatch.setattr(machine, "usage", lambda before: machine.Usage(0.05, 0.0, other))
    monkeypatch.setattr(machine, "usable_cpus", lambda: cpus)
    judge = overlap.Judge()
    for i in range(overlap.JUDGED):
        assert judge.watch(lambda: "rows") == "rows"
        if other is not None and i < overlap.JUDGED - 1:
            assert judge.verdict is None
    assert judge.verdict is verdict


def test_a_target_keeps_its_verdict_across_generations():
    class Target:
        pass
    t = Target()
    assert overlap.Judge.of(t) is overlap.Judge.of(t) and overlap.Judge.of(Target()) is not overlap.Judge.of(t)


# ---- greedy: plain greedy's text, drafts made ahead used ------------------------------------------

class Spy:
    """Counts the tokens each proposal took from `draft_ahead`."""

    def __init__(self, drafter):
        self.drafter, self.ahead = drafter, []
        real = drafter.propose

        def propose(*a, **kw):
            d = real(*a, **kw)
            self.ahead.append(d.n_ahead)
            return d
        drafter.propose = propose


def chat(model, text):
    return model.chat_prompt([{"role": "user", "content": text}])


@pytest.mark.parametrize("kind", ["model", "auto"])
def test_greedy_with_overlap_is_plain_greedy(target, draft, kind):
    used = 0
    for text in PROMPTS[:2]:
        prompt = chat(target, text)
        plain = [t for s in generate_steps(target, None, prompt, GREEDY, DecodeConfig(max_tokens=48)) for t in s.tokens]
        model = ModelDrafter(draft)
        spy = Spy(model)
        drafter = model if kind == "model" else AutoDrafter(model)
        steps = list(generate_steps(target, drafter, prompt, GREEDY, DecodeConfig(max_tokens=48, k=4, overlap=True)))
        assert [t for s in steps for t in s.tokens] == plain, text
        used += sum(spy.ahead)
    assert used > 0, "no draft made ahead was used: the test would prove nothing"


def test_overlap_is_off_by_default_for_a_local_target(target, draft):
    spy = Spy(ModelDrafter(draft))
    list(generate_steps(target, spy.drafter, chat(target, PROMPTS[0]), GREEDY, DecodeConfig(max_tokens=32, k=4)))
    assert not target.remote and sum(spy.ahead) == 0


# ---- sampled: the target's law ----------------------------------------------------------------------

K, L, AHEAD = 2, 10, 3


def in_turn(verify, ahead):
    """`overlapped` without the thread, drafting AHEAD tokens ahead: the runs are then reproducible
    by seed whatever the machine's speed (the law cannot depend on the threads: drafting ahead
    draws from the drafting stream alone, before the target's rows are seen)."""
    calls = iter(range(10**6))
    ahead(lambda: next(calls) >= AHEAD)
    return verify(), time.perf_counter(), 0.0


def runs_with_overlap(target, draft, n: int, seed: int = 2):
    """n runs of L tokens drafting K with the sharpened draft (test_exact_e2e's `Scaled`: the real
    draft agrees with the target too well for a wrong row to show in a few hundred runs)."""
    prompt = target.tokenize(REPEATING)
    runs, ahead = [], 0
    for r in range(n):
        model = ModelDrafter(Scaled(draft))
        spy = Spy(model)
        tokens, verified, finish = [], [], None
        for step in generate_steps(target, model, prompt, CFG, DecodeConfig(max_tokens=L, k=K, overlap=True),
                                   rng=np.random.default_rng([seed, r])):
            tokens += step.tokens
            verified += [step.n_drafted] * (len(step.tokens) + (step.finish == "stop"))
            finish = step.finish
        runs.append((tokens, verified, finish))
        ahead += sum(spy.ahead)
    return runs, ahead


def misaligned(real):
    """An off-by-one: each token drafted ahead verified against the row before its own."""
    def take(drafter, context, k, grammar, rng):
        saved = drafter._ahead
        tokens, rows = real(drafter, context, k, grammar, rng)
        if tokens and rows:
            rows = saved.rows[:len(tokens)]
        return tokens, rows
    return take


# The control's power, measured: its rank statistic 27.9 at 150 runs (critical 21.8), 300 runs here.
@pytest.mark.parametrize("wrong,n", [(False, 200), (True, 300)], ids=["law", "misaligned-rows"])
def test_sampled_output_with_drafts_made_ahead_follows_the_target(target, draft, reference, monkeypatch, wrong, n):  # noqa: F811
    monkeypatch.setattr(localspec.decoding.decoder, "overlapped", in_turn)
    if wrong:
        monkeypatch.setattr(overlap, "take_ahead", misaligned(overlap.take_ahead))
    runs, ahead = runs_with_overlap(target, draft, n)
    assert ahead >= n, f"drafts made ahead were used for {ahead} tokens in {n} runs: too few to test"
    result = check(reference(), runs)
    print("misaligned" if wrong else "law", ahead, result)
    if wrong:
        assert result["rank"] >= result["rank_crit"] or not result["first"].ok or not result["pairs"].ok, result
    else:
        assert result["forbidden"] == 0
        assert result["rank"] < result["rank_crit"], f"not the target's law: {result}"
        assert result["first"].ok and result["pairs"].ok, result


OVER_A_WORKER = """
import json, sys
from localspec.config import DecodeConfig, ModelConfig, Placement, SamplingConfig
from localspec.decoding.decoder import generate_steps
from localspec.decoding.model_drafter import ModelDrafter
from localspec.engine import Model, connect_workers
target_path, draft_path, endpoint, texts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
greedy, out = SamplingConfig(temperature=0.0), []
connect_workers((endpoint,))
with Model(ModelConfig(target_path, 1024)) as local, Model(ModelConfig(draft_path, 1024)) as draft, \\
        Model(ModelConfig(target_path, 1024, placement=Placement(rpc=(endpoint,)))) as remote:
    for text in texts:
        prompt = local.chat_prompt([{"role": "user", "content": text}])
        plain = [t for s in generate_steps(local, None, prompt, greedy, DecodeConfig(max_tokens=40)) for t in s.tokens]
        drafter, ahead = ModelDrafter(draft), []
        propose = drafter.propose
        drafter.propose = lambda *a, **kw: (d := propose(*a, **kw), ahead.append(d.n_ahead))[0]
        steps = generate_steps(remote, drafter, prompt, greedy, DecodeConfig(max_tokens=40, k=4, overlap=True))
        out.append({"same": [t for s in steps for t in s.tokens] == plain, "ahead": sum(ahead), "remote": remote.remote})
print(json.dumps(out))
"""


def test_over_a_worker_the_overlapped_text_is_the_local_text(model_paths):
    """The thread's decode on a real RPC target (the network, llama.cpp's RPC backend) while the
    draft drafts on: the greedy text is the local one, and drafts made ahead were used. Forced on:
    the judge would find the shared cores busy here. In a process of its own: a worker registered
    in this one would be asked for by later loads after it stopped, and llama.cpp aborts then."""
    import json
    import subprocess
    import sys

    from tests.test_rpc import Worker

    w = Worker()
    try:
        done = subprocess.run([sys.executable, "-c", OVER_A_WORKER, str(model_paths[0]), str(model_paths[1]),
                               w.endpoint, json.dumps(PROMPTS[:2])], capture_output=True, text=True, timeout=300)
    finally:
        w.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(r["same"] and r["remote"] for r in runs), runs
    assert sum(r["ahead"] for r in runs) > 0, runs


# ---- slots: never overlapped -------------------------------------------------------------------------

@pytest.mark.parametrize("asked", [True, None])
def test_a_generation_on_a_slot_never_drafts_ahead(target, draft, monkeypatch, asked):
    """serve --parallel: a slot's decodes go through the Batcher, which counts each generation as
    one thread; a verify thread would let another slot's draft decode overwrite the logits this
    thread reads. Off even when asked, and over RPC (`remote` passes through to the slot)."""
    from localspec.engine.slots import Batcher, Slot

    def refused(verify, ahead):
        raise AssertionError("a slot's verify ran in a thread")
    monkeypatch.setattr(localspec.decoding.decoder, "overlapped", refused)
    monkeypatch.setattr(target, "remote", True)
    batcher = Batcher([draft, target])
    on_target, on_draft = Slot(target, batcher, 0, 1, 1024), Slot(draft, batcher, 0, 1, 1024)
    assert on_target.remote   # passed through: the judge would overlap it
    prompt = chat(target, PROMPTS[0])
    plain = [t for s in generate_steps(target, None, prompt, GREEDY, DecodeConfig(max_tokens=24)) for t in s.tokens]
    with batcher.taking_part():
        steps = list(generate_steps(on_target, ModelDrafter(on_draft), prompt, GREEDY,
                                    DecodeConfig(max_tokens=24, k=4, overlap=asked)))
    on_target.reset()
    on_draft.reset()
    assert [t for s in steps for t in s.tokens] == plain
    assert sum(s.n_drafted for s in steps) > 0


# ---- reproducibility: the text for a seed does not depend on how far drafting ahead got -----------------

def ahead_by(n: int):
    """`overlapped` without the thread, drafting ahead until n tokens (the guess among them)."""
    def run(verify, ahead):
        calls = iter(range(10**6))
        ahead(lambda: next(calls) >= n)
        return verify(), time.perf_counter(), 0.0
    return run


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_seed_gives_the_same_text_however_far_drafting_ahead_got(target, draft, monkeypatch, seed):
    """A fixed k and seed give the same text (docs/design.md, Reproducibility), whether the target's
    decode returned before the guess (0), or after some or all of a proposal's tokens were drafted
    ahead: the tokens after the guess draw what the next proposal would have drawn."""
    prompt = target.tokenize(REPEATING)
    texts, used = {}, {}
    for n in (0, 2, 3, 5, overlap.AHEAD_MAX + 4):
        monkeypatch.setattr(localspec.decoding.decoder, "overlapped", ahead_by(n))
        spy = Spy(ModelDrafter(draft))
        steps = generate_steps(target, spy.drafter, prompt, CFG, DecodeConfig(max_tokens=40, k=3, overlap=True),
                               rng=np.random.default_rng(seed))
        texts[n] = [t for s in steps for t in s.tokens]
        used[n] = sum(spy.ahead)
    assert all(text == texts[0] for text in texts.values()), texts
    assert used[0] == 0 and used[overlap.AHEAD_MAX + 4] > 0, used


# ---- take_ahead: keyed on the text; lag counts what the text holds ---------------------------------

def drafted_ahead(draft, n_ahead: int = 6):
    """A drafter whose greedy chain of 3 after a prompt was drafted past by n_ahead tokens."""
    drafter = ModelDrafter(draft)
    context = chat(draft, PROMPTS[2])
    drafter.prepare(context)
    chain = drafter.propose(context, 3, GREEDY, np.random.default_rng(0))
    assert len(chain.tokens) == 3
    calls = iter(range(100))
    drafter.draft_ahead(context, chain, GREEDY, np.random.default_rng(0), np.random.default_rng(1),
                        lambda: next(calls) >= n_ahead)
    assert drafter._ahead is not None and len(drafter._ahead.tokens) == n_ahead
    return drafter, context, chain.tokens, drafter._ahead.tokens[0]


def test_drafts_made_ahead_are_used_only_after_the_text_they_followed(draft):
    drafter, context, chain, guess = drafted_ahead(draft)
    other = chain[1] + 1
    # the same length, the guess last, but the chain's second token rejected: another text
    wrong = [*context, chain[0], other, chain[2], guess]
    assert overlap.take_ahead(drafter, wrong, 3, None, np.random.default_rng(0)) == ([], [])
    drafter, context, chain, guess = drafted_ahead(draft)
    tokens, _ = overlap.take_ahead(drafter, [*context, *chain, guess], 3, None, np.random.default_rng(0))
    assert len(tokens) == 3 and drafter._ahead is None


def test_drafts_made_ahead_are_dropped_once_the_drafting_stream_drew(draft):
    drafter, context, chain, guess = drafted_ahead(draft)
    stream = np.random.default_rng(0)
    stream.random()   # a proposal drew since (a tree's, say): the draws made ahead are not the next
    assert overlap.take_ahead(drafter, [*context, *chain, guess], 3, None, stream) == ([], [])


def test_lag_counts_the_text_the_cache_lacks_while_drafts_made_ahead_are_held(draft):
    """Plain or lookup steps went on after the drafts made ahead: the cache lacks their 5 tokens,
    the bonus token and the chain's last, as it would had nothing been drafted ahead."""
    drafter, context, chain, guess = drafted_ahead(draft, 8)
    assert drafter.lag([*context, *chain, guess, 7, 8, 9, 10, 11]) == 7
