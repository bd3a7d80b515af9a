"""`localspec serve` at T > 0: per-request seeds, temperatures mixed in a row, reproducibility with
a fixed k whatever ran before, and the law of what a sampled request emits first.

The server is test_serve's (one in-process server on the embedded default pair); its -k is set per
test where a fixed k is needed. The law is checked against the target's own processed distribution,
computed directly with tests/law_helpers.py's `Target` (at its sampling options `CFG`, the ones
test_exact_e2e runs at), by law_helpers' Pearson chi-square.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from tests.law_helpers import CFG, REPEATING, Target, chi2_check
from tests.test_serve import plain_greedy, post, served, wait_idle  # noqa: F401 - served is the fixture

SAMPLED = {"temperature": CFG.temperature, "top_k": CFG.top_k, "top_p": CFG.top_p, "min_p": CFG.min_p}


@contextlib.contextmanager
def fixed_k(served, k: int):
    """The server as if started with `-k k` (its controllers are made anew for it, and after it)."""
    server = served.server
    wait_idle(served)
    saved = server.defaults, server._controllers
    server.defaults, server._controllers = replace(server.defaults, k=k), None
    try:
        yield
    finally:
        wait_idle(served)
        server.defaults, server._controllers = saved


def complete(served, body: dict) -> dict:
    r = post(served, "/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def text_of(served, body: dict) -> str:
    return complete(served, body)["choices"][0]["text"]


def test_a_seeded_request_with_a_fixed_k_gives_the_same_text_whatever_ran_before(served):
    """auto with -k 4 on a text lookup can copy: each step splits its 4 tokens between lookup and the
    model. The requests in between teach the controller other acceptance rates (a copy the model
    breaks off at T = 1.5, greedy text); the split must not read them, nor may the model's draws
    shift the acceptance draws."""
    body = {"prompt": REPEATING, "max_tokens": 32, "seed": 11, **SAMPLED}
    with fixed_k(served, 4):
        first = complete(served, body)
        for i, temperature in enumerate((1.5, 0.0, 1.5, 1.0, 1.5)):
            complete(served, {**body, "seed": 100 + i, "temperature": temperature, "top_k": 0, "top_p": 1.0})
            complete(served, {"prompt": f"Write a list of {i + 3} colours:", "max_tokens": 24, "seed": i, **SAMPLED})
        again = complete(served, body)
    assert first["usage"]["localspec"]["n_drafted"] > 0
    assert again["choices"][0]["text"] == first["choices"][0]["text"]


def test_per_request_seeds(served):
    body = {"prompt": "Once upon a time", "max_tokens": 12, **SAMPLED}
    with fixed_k(served, 3):
        a = complete(served, {**body, "seed": 1})
        assert text_of(served, {**body, "seed": 1}) == a["choices"][0]["text"]
        others = [text_of(served, {**body, "seed": s}) for s in (2, 3, 4)]
    assert a["usage"]["localspec"]["seed"] == 1
    assert len({a["choices"][0]["text"], *others}) == 4


def test_a_greedy_request_after_sampled_ones_is_exactly_greedy(served):
    for prompt in ("The three primary colours are", "A lighthouse is"):
        expected = plain_greedy(served, served.session.target.tokenize(prompt, True, True), 12)
        text_of(served, {"prompt": prompt, "max_tokens": 12, "seed": 5, **SAMPLED, "temperature": 1.5})
        assert text_of(served, {"prompt": prompt, "max_tokens": 12, "temperature": 0}) == expected


DRAWS = 200


def first_word(text: str) -> str:
    """What a two-token answer's law is checked on: its leading spaces and first run of word
    characters (" blue" of " blue." and " blue,"), a function of the answer, so its law is
    exact, and coarse enough for a few hundred draws to tell laws apart."""
    return re.match(r"\s*\w*", text).group()


def two_token_law(target, prompt: list[int], cfg=CFG, raw: dict | None = None) -> dict[str, float]:
    """The law of `first_word` of a two-token answer (max_tokens 2) under the target's own
    processed distribution at `cfg`: x1 ~ p(. | prompt), x2 ~ p(. | prompt, x1), an end of generation
    ending it early. Of the text, not the tokens, because the server answers text; summing over
    every pair (x1, x2) keeps it exact. `raw`: the target's logit rows by prefix, shared by laws at
    other temperatures (see `Target`)."""
    ref = Target(target, prompt, cfg, raw)
    law: Counter = Counter()
    p1 = ref.rows([], 1)[0]
    for x1, w1 in zip(p1.ids.tolist(), (p1.weights / p1.total).tolist()):
        if x1 == ref.end:   # Target merges every end-of-generation id into this one
            law[""] += w1
            continue
        p2 = ref.rows([x1], 2)[1]
        for x2, w2 in zip(p2.ids.tolist(), (p2.weights / p2.total).tolist()):
            tail = b"" if x2 == ref.end else target.piece(x2)
            law[first_word((target.piece(x1) + tail).decode("utf-8", "replace"))] += w1 * w2
    return law


def law_check(law: dict[str, float], words: list[str]):
    cells = sorted(law)
    counts = Counter(words)
    observed = np.array([counts[c] for c in cells] + [sum(n for w, n in counts.items() if w not in law)])
    return chi2_check(observed, np.array([law[c] for c in cells] + [0.0]))


PROMPT = "My favourite colour is"


@pytest.fixture(scope="module")
def drawn(served):
    """DRAWS answers of max_tokens 2 at CFG, seeds of their own, as first words. With -k 4 the first
    step drafts its one token (all the room there is): the first token comes through the
    acceptance rule, the second is the verify pass's own."""
    prompt = served.session.target.tokenize(PROMPT, True, True)
    with fixed_k(served, 4):
        answers = [complete(served, {"prompt": prompt, "max_tokens": 2, "seed": 1000 + i, **SAMPLED})
                   for i in range(DRAWS)]
    assert sum(a["usage"]["localspec"]["n_drafted"] for a in answers) >= DRAWS * 0.9
    return prompt, [first_word(a["choices"][0]["text"]) for a in answers]


@pytest.fixture(scope="module")
def raw_rows() -> dict:
    """The target's logit rows after PROMPT, by prefix: both laws below read the same ones."""
    return {}


def test_sampled_answers_follow_the_targets_law(served, drawn, raw_rows):
    prompt, words = drawn
    wait_idle(served)   # the reference evaluates on the server's own target
    result = law_check(two_token_law(served.session.target, prompt, raw=raw_rows), words)
    assert result.ok, f"not the target's law: {result}"


def test_the_law_check_tells_another_temperature(served, drawn, raw_rows):
    """Teeth: the same draws fail against the law at T = 0.7 (what a server that dropped the
    request's temperature for a default of 0.7 would follow)."""
    prompt, words = drawn
    wait_idle(served)
    result = law_check(two_token_law(served.session.target, prompt, replace(CFG, temperature=0.7), raw_rows), words)
    print(result)
    assert not result.ok, f"the law at T = 0.7 passed: {result}"
