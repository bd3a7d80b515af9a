"""Running totals over decoder steps: α, draft efficiency, tokens per target pass, speed, latency
percentiles.

Tokens per target pass = generated tokens / the target passes that put at least one token into the
output. A pass that ends the generation may put none there: it produced only the end-of-generation
token (never shown), or a stop string cut all it made, perhaps with tokens of earlier passes. Such
a pass is not counted (and neither is an earlier one whose tokens a stop string all took back), so
plain decoding always reads exactly 1.0 — not 0.75 for a 3-token reply that ended on its 4th pass.

α is the per-token acceptance probability, the α of E(α, k) = (1 − α^(k+1)) / (1 − α): accepted /
tested draft positions, where a step tests its drafted positions up to and including the first
rejection (the rule stops there). Draft efficiency is accepted / drafted: it also counts the
positions after a rejection, drafted but never tested, so it is lower than α whenever a rejection
comes before the last drafted position. Every report shows α with this one definition.

A draft tree (a step with `branches` > 1) counts in α and by position by its depth: `n_drafted` is
the tree's depth, `n_accepted` the accepted depth. `tree()` adds what only trees have: how many
steps verified one, their nodes per verify, their accepted depth, and acceptance by sibling rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .decoder import Step


SOURCE_LETTER = {"model": "M", "lookup": "L", "mixed": "X", "plain": "P"}
"""Short names of who served a step, for tables: M draft model, L prompt lookup, X lookup extended
by the model, P plain."""


def served(drafters: dict) -> str:
    """Share of steps each source served (`RunStats.drafters`), e.g. "M62 L30 P8"."""
    return " ".join(f"{SOURCE_LETTER.get(s, s)}{100 * d['share']:.0f}" for s, d in drafters.items()) or "—"


def tree_label(setting: str | tuple[int, ...]) -> str:
    """A `--tree` setting as the outputs write it: "off", "auto" or its shape, e.g. "3,2,1,1"."""
    return ",".join(map(str, setting)) if isinstance(setting, tuple) else str(setting)


def positions_tested(n_drafted: int, n_accepted: int) -> int:
    """Draft positions the acceptance rule tried in one step: the accepted ones, plus the first
    rejection unless every drafted position was accepted."""
    return n_accepted + (1 if n_accepted < n_drafted else 0)


@dataclass
class RunStats:
    """Accumulates `Step`s. α = accepted / tested positions (see the module docstring); draft
    efficiency = accepted / drafted; tokens per step = tokens per target pass (generated tokens /
    `n_passes`)."""

    n_tokens: int = 0
    n_steps: int = 0
    n_passes: int = 0   # passes with a token in the output: what tokens per pass divides by
    n_drafted: int = 0
    n_accepted: int = 0
    n_tested: int = 0   # drafted positions up to and including each step's first rejection
    n_from_draft: int = 0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_python: float = 0.0
    t_draft_host: float = 0.0
    k_sum: int = 0
    # Steps that drafted nothing (k = 0): their count and seconds, to price a plain step taken by
    # the speculative path against one of plain decoding.
    n_plain_steps: int = 0
    t_plain_steps: float = 0.0
    finish: str | None = None
    # Acceptance by draft position i (1-based): how often position i was drafted / accepted.
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    # Inter-token latency samples: a step of m tokens taking s seconds gives m samples of s / m.
    step_seconds: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    # Output tokens of each pass counted in n_passes, in order: a stop string takes back the last ones.
    pass_tokens: list[int] = field(default_factory=list)
    # Who served each step ("plain", "model", "lookup", "mixed"), and accepted draft tokens by
    # whom proposed them ("model", "lookup").
    sources: list[str] = field(default_factory=list)
    accepted_from: dict[str, int] = field(default_factory=dict)
    steps_by: dict[str, int] = field(default_factory=dict)
    tokens_by: dict[str, int] = field(default_factory=dict)
    # Draft nodes verified (every node of a tree, the drafted tokens of a chain); the steps that
    # verified a tree (more than one branch), their nodes and accepted depth; and per sibling rank
    # (0 = first choice), the proposals the rule tried and accepted, over all steps.
    n_nodes: int = 0
    tree_steps: int = 0
    tree_nodes: int = 0
    tree_depth: int = 0
    rank_tried: list[int] = field(default_factory=list)
    rank_accepted: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, steps) -> "RunStats":
        """The stats of `steps`, added in order (a run's, or several runs' together)."""
        stats = cls()
        for step in steps:
            stats.add(step)
        return stats

    def add(self, step: Step) -> None:
        # A stop string may take back tokens of earlier passes (step.withdrawn): they are not output.
        made = len(step.tokens) - step.withdrawn
        self.n_tokens += made
        self.n_steps += 1
        if step.tokens:
            self.n_passes += 1
            self.pass_tokens.append(len(step.tokens))
        back = step.withdrawn
        while back and self.pass_tokens:
            # Withdrawn tokens are the output's last ones; a pass left with none no longer counts.
            take = min(back, self.pass_tokens[-1])
            back -= take
            self.pass_tokens[-1] -= take
            if not self.pass_tokens[-1]:
                self.pass_tokens.pop()
                self.n_passes -= 1
        self.n_drafted += step.n_drafted
        self.n_accepted += step.n_accepted
        self.n_tested += positions_tested(step.n_drafted, step.n_accepted)
        self.n_from_draft += sum(step.from_draft)
        self._add_tree(step)
        source = step.source or "plain"
        self.sources.append(source)
        self.steps_by[source] = self.steps_by.get(source, 0) + 1
        self.tokens_by[source] = self.tokens_by.get(source, 0) + max(made, 0)
        for kind in step.kinds():
            if kind != "target":
                self.accepted_from[kind] = self.accepted_from.get(kind, 0) + 1
        self.t_draft += step.t_draft
        self.t_verify += step.t_verify
        self.t_python += step.t_python
        self.t_draft_host += step.t_draft_host
        self.k_sum += step.k
        if step.k == 0:
            self.n_plain_steps += 1
            self.t_plain_steps += step.t_draft + step.t_verify + step.t_python
        if step.n_drafted > len(self.drafted_at):
            grow = step.n_drafted - len(self.drafted_at)
            self.drafted_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(step.n_drafted):
            self.drafted_at[i] += 1
            if i < step.n_accepted:
                self.accepted_at[i] += 1
        self.step_seconds.append(step.t_draft + step.t_verify + step.t_python)
        self.step_tokens.append(max(made, 0))
        if step.finish:
            self.finish = step.finish

    def _add_tree(self, step: Step) -> None:
        nodes = step.n_nodes or step.n_drafted   # a chain's nodes are its drafted tokens
        self.n_nodes += nodes
        if step.branches > 1:
            self.tree_steps += 1
            self.tree_nodes += nodes
            self.tree_depth += step.n_accepted
        for rank, accepted in step.sibling_trials:
            if rank >= len(self.rank_tried):
                grow = rank + 1 - len(self.rank_tried)
                self.rank_tried += [0] * grow
                self.rank_accepted += [0] * grow
            self.rank_tried[rank] += 1
            self.rank_accepted[rank] += bool(accepted)

    @property
    def seconds(self) -> float:
        """Decoding time (prefill excluded)."""
        return self.t_draft + self.t_verify + self.t_python

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance: accepted / tested positions (None when nothing was drafted)."""
        return self.n_accepted / self.n_tested if self.n_tested else None

    @property
    def draft_efficiency(self) -> float | None:
        """Accepted / drafted tokens (None when nothing was drafted): the share of drafting work
        that ended up in the output. Not α: it also counts positions after a rejection."""
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def tokens_per_pass(self) -> float | None:
        """Tokens per target pass (see the module docstring); None when no pass emitted a token."""
        return self.n_tokens / self.n_passes if self.n_passes else None

    tokens_per_step = tokens_per_pass   # the old name, kept one release

    @property
    def tokens_per_second(self) -> float | None:
        return self.n_tokens / self.seconds if self.seconds > 0 else None

    @property
    def mean_accepted(self) -> float | None:
        """Mean accepted draft tokens per step that drafted something."""
        drafting = self.drafted_at[0] if self.drafted_at else 0  # steps that drafted ≥ 1 token
        return self.n_accepted / drafting if drafting else None

    def host(self) -> dict:
        """Host time (everything in a step outside llama.cpp's decode calls), in two parts: the
        target side (processing the verified rows, acceptance, bookkeeping) per step and per
        verified row, and the draft side (turning each drafted row into a token) per drafted token."""
        rows = self.n_steps + self.n_nodes  # each step verifies its draft nodes plus one
        ms = lambda t, n: 1000 * t / n if n else None  # noqa: E731
        return {
            "target_seconds": self.t_python,
            "draft_seconds": self.t_draft_host,
            "target_ms_per_step": ms(self.t_python, self.n_steps),
            "target_ms_per_row": ms(self.t_python, rows),
            "draft_ms_per_token": ms(self.t_draft_host, self.n_nodes),   # a tree drafts every node
        }

    @property
    def verify_ms_per_step(self) -> float | None:
        """Mean milliseconds of the target's decode per step."""
        return 1000 * self.t_verify / self.n_steps if self.n_steps else None

    @property
    def plain_step_ms(self) -> float | None:
        """Mean milliseconds of a step that drafted nothing (k = 0)."""
        return 1000 * self.t_plain_steps / self.n_plain_steps if self.n_plain_steps else None

    def drafters(self) -> dict[str, dict]:
        """Per source of steps (plain, model, lookup, mixed): how many steps it served, their
        share of all steps, and the tokens it made (accepted draft tokens plus the target's)."""
        order = sorted(self.steps_by, key=lambda s: -self.steps_by[s])
        return {s: {"steps": self.steps_by[s], "share": self.steps_by[s] / self.n_steps,
                    "tokens": self.tokens_by[s]} for s in order}

    def acceptance_by_position(self) -> list[float]:
        """Per draft position i: share of the steps that drafted position i in which it (and so
        every position before it) was accepted."""
        return [a / d for a, d in zip(self.accepted_at, self.drafted_at) if d]

    def acceptance_by_rank(self) -> list[float | None]:
        """Per sibling rank r = 0, 1, …: accepted / tried proposals of that rank (None: never tried).
        Rank 0 is a chain's every proposal and a tree's first choice; rank r is tried only after
        the r siblings before it were rejected."""
        return [a / t if t else None for a, t in zip(self.rank_accepted, self.rank_tried)]

    def tree(self, setting: str | tuple[int, ...] | None = None) -> dict:
        """Draft trees: `tree_steps` (steps that verified more than one branch), `mean_nodes` (draft
        nodes per verify) and `mean_accepted_depth` over those steps (None without one), and
        `acceptance_by_rank`; with `setting` (the `--tree` value) first, as `setting`."""
        mean = lambda x: x / self.tree_steps if self.tree_steps else None  # noqa: E731
        return ({} if setting is None else {"setting": tree_label(setting)}) | {
            "tree_steps": self.tree_steps,
            "mean_nodes": mean(self.tree_nodes),
            "mean_accepted_depth": mean(self.tree_depth),
            "acceptance_by_rank": self.acceptance_by_rank(),
        }

    def latency_percentiles(self, qs=(50, 99)) -> dict[str, float | None]:
        """Inter-token latency percentiles in seconds."""
        if not self.step_tokens or not sum(self.step_tokens):
            return {f"p{q}": None for q in qs}
        per_token = np.repeat(
            np.array(self.step_seconds) / np.maximum(self.step_tokens, 1), self.step_tokens
        )
        return {f"p{q}": float(np.percentile(per_token, q)) for q in qs}

    def summary(self) -> dict:
        return {
            "n_tokens": self.n_tokens,
            "n_steps": self.n_steps,
            "n_passes": self.n_passes,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "n_tested": self.n_tested,
            "alpha": self.alpha,
            "draft_efficiency": self.draft_efficiency,
            "tokens_per_pass": self.tokens_per_pass,
            "tokens_per_step": self.tokens_per_pass,   # the old name of tokens_per_pass, kept one release
            "tokens_per_second": self.tokens_per_second,
            "seconds": self.seconds,
            "mean_k": self.k_sum / self.n_steps if self.n_steps else None,
            "time_split": {"draft": self.t_draft, "verify": self.t_verify, "python": self.t_python},
            "host": self.host(),
            "verify_ms_per_step": self.verify_ms_per_step,
            "plain_step_ms": self.plain_step_ms,
            "finish": self.finish,
            "drafters": self.drafters(),
            "accepted_from": dict(self.accepted_from),
        }
