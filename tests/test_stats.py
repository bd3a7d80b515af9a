"""RunStats: α is accepted / tested draft positions (the per-token probability of
E(α, k) = (1 − α^(k+1)) / (1 − α)); draft efficiency is accepted / drafted. Synthetic steps only."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.decoding.controller import expected_tokens
from localspec.decoding.decoder import Step
from localspec.decoding.stats import RunStats, positions_tested


def step(n_drafted: int, n_accepted: int) -> Step:
    """A step that drafted `n_drafted` and accepted `n_accepted`, plus the target's own token."""
    return Step(tokens=tuple(range(n_accepted + 1)), from_draft=(True,) * n_accepted + (False,),
                k=n_drafted, n_drafted=n_drafted, n_accepted=n_accepted,
                t_draft=0.001 * n_drafted, t_verify=0.01, t_python=0.0)


def stats_of(*steps: Step) -> RunStats:
    st = RunStats()
    for s in steps:
        st.add(s)
    return st


def test_a_rejection_is_tested_and_the_positions_after_it_are_not():
    # 4 drafted, 1 accepted: position 1 accepted, position 2 rejected, positions 3 and 4 never tested
    assert positions_tested(4, 1) == 2
    st = stats_of(step(4, 1))
    assert (st.n_drafted, st.n_accepted, st.n_tested) == (4, 1, 2)
    assert st.alpha == pytest.approx(1 / 2)
    assert st.draft_efficiency == pytest.approx(1 / 4)


def test_a_fully_accepted_step_tests_every_drafted_position():
    assert positions_tested(4, 4) == 4
    st = stats_of(step(4, 4))
    assert st.n_tested == 4 and st.alpha == 1.0 and st.draft_efficiency == 1.0


def test_a_rejection_at_the_first_position_tests_one():
    assert positions_tested(5, 0) == 1
    st = stats_of(step(5, 0))
    assert st.n_tested == 1 and st.alpha == 0.0 and st.draft_efficiency == 0.0


def test_totals_over_steps_and_the_summary_keys():
    st = stats_of(step(4, 1), step(4, 4), step(0, 0), step(3, 0))
    assert (st.n_drafted, st.n_accepted, st.n_tested) == (11, 5, 2 + 4 + 0 + 1)
    assert st.alpha == pytest.approx(5 / 7)
    assert st.draft_efficiency == pytest.approx(5 / 11)
    assert st.draft_efficiency < st.alpha
    s = st.summary()
    assert s["n_tested"] == 7 and s["alpha"] == st.alpha and s["draft_efficiency"] == st.draft_efficiency


def test_nothing_drafted_gives_no_alpha_and_no_efficiency():
    st = stats_of(step(0, 0), step(0, 0))
    assert st.n_tested == 0 and st.alpha is None and st.draft_efficiency is None
    assert RunStats().summary()["alpha"] is None and RunStats().summary()["draft_efficiency"] is None


@pytest.mark.parametrize("a", [0.5, 0.8, 0.95])
def test_alpha_recovers_an_iid_acceptance_probability_and_draft_efficiency_does_not(a):
    """Each drafted position is accepted with probability a, independently, until the first
    rejection: α converges to a, and E(α, k) matches the tokens per pass; accepted / drafted does
    neither (it converges to E[accepted] / k, below a)."""
    rng = np.random.default_rng(1)
    k, n = 8, 20000
    st = RunStats()
    for _ in range(n):
        hits = rng.random(k) < a
        n_acc = k if hits.all() else int(np.argmin(hits))   # accepted prefix up to the first miss
        st.add(step(k, n_acc))
    assert st.alpha == pytest.approx(a, abs=0.01)
    assert st.tokens_per_step == pytest.approx(expected_tokens(st.alpha, k), rel=0.02)
    efficiency = (expected_tokens(a, k) - 1) / k   # E[accepted] / k
    assert st.draft_efficiency == pytest.approx(efficiency, abs=0.01)
    assert st.draft_efficiency < a - 0.02
    assert abs(st.tokens_per_step - expected_tokens(st.draft_efficiency, k)) > 0.1


# -- tokens per target pass: a pass that put no token into the output is not counted ----------


def last(tokens: tuple, finish: str, n_drafted: int = 0, n_accepted: int = 0, withdrawn: int = 0) -> Step:
    """The final step of a generation, as the decoder yields it: `tokens` is what it emitted (the
    end-of-generation token and what a stop string cut are not emitted)."""
    return Step(tokens=tokens, from_draft=(True,) * min(n_accepted, len(tokens)) + (False,) * (len(tokens) - n_accepted),
                k=n_drafted, n_drafted=n_drafted, n_accepted=n_accepted, t_draft=0.0, t_verify=0.01,
                t_python=0.0, finish=finish, withdrawn=withdrawn)


@pytest.mark.parametrize("ending", [
    last((), "stop"),                  # the 4th pass produced only the end-of-generation token
    last((9,), "length"),              # max tokens: the last pass emitted its one token
    last((9,), "stop"),                # a stop string began inside the last token: it is kept
    last((), "stop"),                  # a stop string began exactly at the last token: cut whole
    last((), "stop", withdrawn=2),     # a stop string began two tokens back: they are taken back
], ids=["eog", "max_tokens", "stop-kept", "stop-cut", "stop-withdrew-2"])
def test_plain_decoding_reads_exactly_one_token_per_pass(ending):
    st = stats_of(step(0, 0), step(0, 0), step(0, 0), ending)
    assert st.n_steps == 4   # every target evaluation is still a step
    assert st.n_tokens == 3 + len(ending.tokens) - ending.withdrawn
    assert st.tokens_per_step == 1.0
    assert st.summary()["tokens_per_step"] == 1.0


def test_speculative_passes_count_the_tokens_they_put_in_the_output():
    # 3 + 1 + 2 tokens, then a pass that accepted 2 drafts whose bonus token was end-of-generation
    # (2 tokens emitted), then the same run ending on a pass that produced only EOG.
    body = [step(2, 2), step(2, 0), step(3, 1)]
    st = stats_of(*body, last((5, 6), "stop", n_drafted=3, n_accepted=2))
    assert st.tokens_per_step == pytest.approx(8 / 4)
    st = stats_of(*body, last((), "stop", n_drafted=3, n_accepted=0))
    assert st.tokens_per_step == pytest.approx(6 / 3) and st.n_steps == 4
    # A stop string that took back tokens of earlier passes: a pass left with none is not counted.
    for withdrawn, tokens, passes in [(1, 5, 3), (2, 4, 2), (3, 3, 1)]:
        st = stats_of(*body, last((), "stop", n_drafted=3, n_accepted=0, withdrawn=withdrawn))
        assert (st.n_tokens, st.n_passes) == (tokens, passes)
        assert st.tokens_per_step == pytest.approx(tokens / passes)


def test_a_reply_of_nothing_but_end_of_generation_has_no_tokens_per_pass():
    st = stats_of(last((), "stop"))
    assert st.n_tokens == 0 and st.n_steps == 1 and st.tokens_per_step is None
