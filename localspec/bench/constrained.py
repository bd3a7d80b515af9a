"""`localspec bench --constraints`: speculation on JSON extraction, with and without the schema.

Each prompt that carries a JSON schema (the built-in suite's `json` category) runs five ways,
interleaved in one process (the order rotates every round, so no way always follows another):
plain and speculative decoding unconstrained, plain under the schema, and speculation under the
schema with the draft's rows masked by it and with only the target's rows masked. The report gives
each way's α, tokens per target pass and tokens/s, and speculation's speed against plain decoding
under the same constraint.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Callable, Sequence

from localspec.config import ConfigError, DecodeConfig, SamplingConfig
from localspec.decoding.decoder import generate_steps
from localspec.decoding.stats import RunStats
from localspec.engine.grammar import schema_grammar
from localspec.loading import controllers

WAYS = (
    # (key, constrained, speculative, draft masked)
    ("plain", False, False, True),
    ("spec", False, True, True),
    ("plain+schema", True, False, True),
    ("spec+schema, draft masked", True, True, True),
    ("spec+schema, draft unmasked", True, True, False),
)
BASELINE = {"spec": "plain", "spec+schema, draft masked": "plain+schema", "spec+schema, draft unmasked": "plain+schema"}


def run_constraints(session, prompts: Sequence[list[int]], schemas: Sequence[dict | None], max_tokens: Sequence[int],
                    sampling: SamplingConfig, k: int | None, tree, repeat: int, warmup: bool,
                    progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Run every prompt with a schema in each of WAYS, `repeat` rounds; returns the report."""
    chosen = [i for i, s in enumerate(schemas) if s is not None]
    if not chosen:
        raise ConfigError("--constraints needs prompts with a JSON schema: the built-in suite's json category "
                          "(--category json), or \"schema\" objects in --prompts")
    grammars = {i: schema_grammar(schemas[i]) for i in chosen}
    ctl = {key: controllers.make(session, session.make_drafter(), sampling.temperature, k, warm=False)[0]
           for key, _, spec, _ in WAYS if spec}
    stats = {key: RunStats() for key, *_ in WAYS}
    seconds = {key: 0.0 for key, *_ in WAYS}
    valid = {key: [0, 0] for key, *_ in WAYS}
    total = len(WAYS) * (len(chosen) * repeat + (1 if warmup else 0))
    done = 0

    def one(way, i: int, r: int, counted: bool) -> None:
        nonlocal done
        key, constrained, spec, masked = way
        if progress:
            progress(done, total, f"{key} #{i + 1}")
        cfg = replace(sampling, seed=(sampling.seed or 0) + 1000 * r + i,
                      grammar=grammars[i] if constrained else "", grammar_name="schema" if constrained else "")
        decode = DecodeConfig(max_tokens=max_tokens[i], k=k if spec else 0, k_max=controllers.k_max_for(k),
                              tree=tree if spec else "off", mask_draft=masked)
        drafter = session.make_drafter() if spec else None
        target = session.target
        target.reset()
        target.sync(prompts[i][:-1])
        if drafter is not None and session.draft is not None:
            session.draft.reset()
            session.draft.sync(prompts[i][:-1])
        t0 = time.perf_counter()
        steps = list(generate_steps(target, drafter, prompts[i], cfg, decode, ctl.get(key)))
        t1 = time.perf_counter()
        done += 1
        if counted:
            for s in steps:
                stats[key].add(s)
            seconds[key] += t1 - t0
            valid[key][1] += 1
            valid[key][0] += _parses(target.detokenize([t for s in steps for t in s.tokens]))

    if warmup:
        for way in WAYS:
            one(way, chosen[0], -1, False)
    for r in range(repeat):
        for n, i in enumerate(chosen):
            turn = (r * len(chosen) + n) % len(WAYS)
            for way in WAYS[turn:] + WAYS[:turn]:
                one(way, i, r, True)
    rows = {}
    for key, *_ in WAYS:
        st = stats[key]
        rate = st.n_tokens / seconds[key] if seconds[key] else None
        rows[key] = {"alpha": st.alpha, "tokens_per_pass": st.n_tokens / st.n_passes if st.n_passes else None,
                     "tokens_per_s": rate, "tokens": st.n_tokens, "mean_k": st.k_sum / st.n_steps if st.n_steps else 0.0,
                     "valid_json": valid[key][0], "runs": valid[key][1]}
    for key, base in BASELINE.items():
        a, b = rows[key]["tokens_per_s"], rows[base]["tokens_per_s"]
        rows[key]["vs_plain"] = a / b if a and b else None
    return {"prompts": len(chosen), "repeat": repeat, "temperature": sampling.temperature, "ways": rows}


def _parses(text: str) -> int:
    try:
        json.loads(text)
        return 1
    except ValueError:
        return 0


def format_constraints(report: dict) -> str:
    lines = [f"JSON extraction, {report['prompts']} prompts × {report['repeat']}, T = {report['temperature']:g}",
             "", "| way | α | tokens/pass | tokens/s | × plain (same constraint) | mean k | parses as JSON |",
             "|---|---|---|---|---|---|---|"]
    for key, row in report["ways"].items():
        f = lambda v, spec="{:.3f}": "—" if v is None else spec.format(v)  # noqa: E731
        lines.append(f"| {key} | {f(row['alpha'])} | {f(row['tokens_per_pass'], '{:.2f}')} | "
                     f"{f(row['tokens_per_s'], '{:.1f}')} | {f(row.get('vs_plain'), '{:.2f}×')} | "
                     f"{row['mean_k']:.2f} | {row['valid_json']}/{row['runs']} |")
    return "\n".join(lines)
