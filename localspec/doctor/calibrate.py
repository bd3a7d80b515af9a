"""Timed calibration for `localspec doctor`: how much a verify of b tokens costs on this machine,
what drafting costs, how often each drafter's tokens are accepted (α), and from those the predicted
speedup for every k — the numbers doctor's recommendation is made from."""

from __future__ import annotations

import time
from contextlib import closing
from typing import Callable, Sequence

import numpy as np

from localspec.config import DecodeConfig, SamplingConfig
from localspec.decoding.controller import ALPHA_PRIOR, ALPHA_PRIOR_WEIGHT, KController, expected_tokens
from localspec.decoding.decoder import generate_steps
from localspec.decoding.drafters import PromptLookup
from localspec.decoding.model_drafter import ModelDrafter
from localspec import machine
from localspec.decoding.stats import positions_tested
from localspec.loading.controllers import k_max_for

CAL_K = 4             # fixed draft length while measuring acceptance
K_MAX = k_max_for(None)   # largest k considered for the recommendation: generate's adaptive bound
VERIFY_SIZES = (1, 2, 4, 8)

CHAT_PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Write a short story about a robot who learns to paint.",
    "Give five tips for staying focused when working from home.",
)
LOOKUP_PROMPT = """Rename the variable `total` to `running_sum` in this code. Reply with the whole updated code only.

```python
def summarize(values):
    total = 0
    count = 0
    for value in values:
        if value is None:
            continue
        total += value
        count += 1
    mean = total / count if count else 0.0
    print(f"total={total} count={count} mean={mean:.2f}")
    return total, count, mean
```"""


def typical(xs: Sequence[float]) -> float:
    """The lower quartile of repeated timings: other processes only ever add time, and on a shared
    machine the median of a few runs mostly measures them."""
    return float(np.percentile(xs, 25))


def verify_curve(target, prompt: Sequence[int], seconds: float) -> dict[int, list[float]]:
    """Seconds of each target.eval of b tokens (all logits returned), b in VERIFY_SIZES, the sizes
    interleaved so that load changes hit them alike."""
    target.sync(list(prompt))
    base = len(target.tokens)
    block = (list(prompt) * 8)[:max(VERIFY_SIZES)]
    times: dict[int, list[float]] = {b: [] for b in VERIFY_SIZES}
    end = time.perf_counter() + seconds
    while min(len(t) for t in times.values()) < 2 or time.perf_counter() < end:
        for b in VERIFY_SIZES:
            t0 = time.perf_counter()
            target.eval(block[:b], logits_from=0)
            times[b].append(time.perf_counter() - t0)
            target.truncate(base)
        if min(len(t) for t in times.values()) >= 50:
            break
    return times


def run_drafter(target, drafter, prompts: Sequence[list[int]], sampling: SamplingConfig,
                seconds: float, k: int, min_steps: int = 3) -> list:
    """Steps of generate_steps at fixed k, cycling through the prompts until the time is up — but
    at least `min_steps` steps that drafted something (plain steps for k = 0), so a slow or busy
    machine still yields numbers (giving up after 4 × min_steps steps)."""
    steps: list = []
    end = time.perf_counter() + seconds
    rng = np.random.default_rng(0)

    def more() -> bool:
        if time.perf_counter() < end:
            return True
        useful = sum(1 for s in steps if s.n_drafted or not k)
        return useful < min_steps and len(steps) < 4 * min_steps

    for i in range(20):
        prompt = prompts[i % len(prompts)]
        decode = DecodeConfig(max_tokens=max(1, min(256, target.n_ctx - len(prompt) - 1)), k=k, k_max=max(k, 1))
        controller = KController(max(k, 1), fixed_k=k)
        with closing(generate_steps(target, drafter, prompt, sampling, decode, controller, rng)) as gen:
            for step in gen:
                steps.append(step)
                if not more():
                    break
        if not more():
            break
    return steps


def summarize_steps(steps: list) -> dict:
    """α as localspec.decoding.stats defines it (accepted / tested positions; positions after a rejection
    are untested): `alpha` as measured, the same number generate and bench report, and
    `alpha_estimate` shrunk toward the controller's prior (what the predictions use); `draft_efficiency` (accepted / drafted); coverage (share of steps that
    drafted anything), draft seconds per token and measured tokens/s."""
    drafted = [s for s in steps if s.n_drafted]
    trials = sum(positions_tested(s.n_drafted, s.n_accepted) for s in drafted)
    hits = sum(s.n_accepted for s in drafted)
    n_drafted = sum(s.n_drafted for s in drafted)
    secs = sum(s.t_draft + s.t_verify + s.t_python for s in steps)
    per_tok = [s.t_draft / s.n_drafted for s in drafted[1:] or drafted]
    return {
        "steps": len(steps), "tokens": sum(len(s.tokens) for s in steps),
        "n_drafted": n_drafted, "n_accepted": hits, "n_tested": trials,
        # the controller's prior, worth two trials: a dozen lucky hits do not make α = 1
        "alpha": hits / trials if trials else None,
        "alpha_estimate": (hits + ALPHA_PRIOR * ALPHA_PRIOR_WEIGHT) / (trials + ALPHA_PRIOR_WEIGHT) if trials else None,
        "draft_efficiency": hits / n_drafted if n_drafted else None,
        "coverage": len(drafted) / len(steps) if steps else None,
        "draft_cost": typical(per_tok) if per_tok else None,
        "measured_tokens_per_second": sum(len(s.tokens) for s in steps) / secs if secs > 0 else None,
    }


def _curve(points: dict[int, float]) -> Callable[[int], float]:
    """t_verify(b): linear between measured sizes, the last slope beyond them. A bigger batch never
    costs less, so a dip is noise: adjacent violators are pooled (isotonic regression)."""
    bs = np.array(sorted(points), dtype=float)
    blocks: list[list[float]] = []  # [mean, count]
    for t in (points[int(b)] for b in bs):
        blocks.append([t, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    ts = np.repeat([m for m, _ in blocks], [n for _, n in blocks])
    slope = max((ts[-1] - ts[-2]) / (bs[-1] - bs[-2]), 0.0) if len(bs) > 1 else 0.0
    return lambda b: float(np.interp(b, bs, ts)) if b <= bs[-1] else float(ts[-1] + slope * (b - bs[-1]))


def overhead_model(steps: list) -> tuple[float, float]:
    """Python seconds per step ≈ a + c·n_drafted (sampling k+1 rows, acceptance)."""
    by_n: dict[int, list[float]] = {}
    for s in steps:
        by_n.setdefault(s.n_drafted, []).append(s.t_python)
    xs = sorted(by_n)
    ys = [typical(by_n[x]) for x in xs]
    if len(xs) < 2:
        return (ys[0] if ys else 0.0), 0.0
    c, a = np.polyfit(xs, ys, 1)
    return max(float(a), 0.0), max(float(c), 0.0)


def predict(alpha: float | None, coverage: float, t_draft: float, t_verify, overhead) -> list[float]:
    """Speedup vs plain for k = 0..K_MAX: E(α,k)/(k·t_draft + t_verify(k+1) + overhead(k)), where a
    step without a draft (coverage < 1, prompt lookup) is a plain step."""
    a, c = overhead
    plain_cost = t_verify(1) + a
    out = []
    for k in range(K_MAX + 1):
        if alpha is None or k == 0:
            out.append(1.0)
            continue
        e = coverage * expected_tokens(alpha, k) + (1 - coverage)
        cost = coverage * (k * t_draft + t_verify(k + 1) + a + c * k) + (1 - coverage) * plain_cost
        out.append(float(e / cost * plain_cost))
    return out


def calibrate(target, draft, drafters: Sequence[str], sampling: SamplingConfig, seconds: float,
              chat: Callable[[str], list[int]]) -> dict:
    """Measure the verify curve, plain decoding and each drafter at k = CAL_K within ~`seconds`."""
    started = time.perf_counter()
    cpus_before = machine.sample()
    deadline = started + seconds
    shares = {"verify": 0.2, "plain": 0.15, **{d: {"model": 0.4, "lookup": 0.25}[d] for d in drafters}}

    def slot(phase: str) -> float:
        """This phase's share of the time left (phases that overran shrink the later ones)."""
        total = shares.pop(phase)
        return max(deadline - time.perf_counter(), 0.0) * total / (total + sum(shares.values()))

    phases: dict[str, float] = {}

    def timed(phase: str, fn: Callable[[float], object]):
        t0 = time.perf_counter()
        out = fn(slot(phase))
        phases[phase] = round(time.perf_counter() - t0, 2)
        return out

    prompts = [chat(p) for p in CHAT_PROMPTS]
    samples = timed("verify", lambda sec: verify_curve(target, prompts[0], sec))
    plain = timed("plain", lambda sec: run_drafter(target, None, prompts, sampling, sec, 0))
    measured = {}
    for name in drafters:
        drafter, ps = (ModelDrafter(draft), prompts) if name == "model" else (PromptLookup(), [chat(LOOKUP_PROMPT)])
        measured[name] = timed(name, lambda sec: run_drafter(target, drafter, ps, sampling, sec, CAL_K))
    everything = plain + [s for steps in measured.values() for s in steps]
    for s in everything:  # the decoding steps timed the same thing: a verify of n_drafted + 1 tokens
        samples.setdefault(s.n_drafted + 1, []).append(s.t_verify)
    curve = {b: typical(samples[b]) for b in sorted(samples)}
    # spread: the largest upper/lower quartile ratio of repeated timings; near 1 on a quiet machine
    spread = max(float(np.percentile(t, 75) / max(np.percentile(t, 25), 1e-9))
                 for t in samples.values() if len(t) > 1)
    t_verify, overhead = _curve(curve), overhead_model(everything)
    plain_stats = summarize_steps(plain)
    result = {
        "seconds": round(time.perf_counter() - started, 2), "phase_seconds": phases, "k": CAL_K,
        "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k,
                     "top_p": sampling.top_p, "min_p": sampling.min_p},
        "verify_cost": {str(b): t for b, t in curve.items()},
        "python_overhead": {"per_step": overhead[0], "per_draft_token": overhead[1]},
        "verify_spread": spread,
        "plain": {"tokens_per_second": plain_stats["measured_tokens_per_second"], "steps": len(plain)},
        "drafters": {},
        "warnings": [],
    }
    if spread > 1.5:
        result["warnings"].append(f"timings vary a lot (upper/lower quartile {spread:.1f}×): the machine is busy")
    for name, steps in measured.items():
        stats = summarize_steps(steps)
        t_draft = stats["draft_cost"] or 0.0
        model = predict(stats["alpha_estimate"], stats["coverage"] or 0.0, t_draft, t_verify, overhead)
        plain_tps = plain_stats["measured_tokens_per_second"]
        meas = (stats["measured_tokens_per_second"] / plain_tps
                if plain_tps and stats["measured_tokens_per_second"] else None)
        pred = model[CAL_K]
        # The model gives the shape over k; its level is anchored to the speedup actually measured
        # at k = CAL_K (typical-case timings miss costs that a real run pays on both sides).
        scale = meas / pred if meas and pred > 0 else 1.0
        speedups = [model[0]] + [v * scale for v in model[1:]]
        best = int(np.argmax(speedups))
        stats.update(
            measured_speedup=meas, model_scale=scale, predicted_speedup_by_k=speedups, best_k=best,
            predicted_speedup=speedups[best],
        )
        result["drafters"][name] = stats
        if stats["n_tested"] < 40:   # α's sample: the tested positions, not the drafted ones
            result["warnings"].append(f"{name}: only {stats['n_tested']} tested draft positions, so α is rough")
        if meas and not 0.67 < pred / meas < 1.5:
            result["warnings"].append(f"{name}: the cost model predicted {pred:.2f}× at k={CAL_K} but "
                                      f"{meas:.2f}× was measured; predictions are scaled to the measurement")
    # Whether other work took the cores the threads needed while this ran: then every timing above
    # is slower than this machine, and `doctor` does not record them (`diagnose`).
    run = machine.usage(cpus_before)
    result["machine"] = run.as_dict(target.n_threads) | {"busy": machine.loaded(run, target.n_threads)}
    if result["machine"]["busy"]:
        result["warnings"].append(f"{result['machine']['busy']} while calibrating: the timings are slower "
                                  "than this machine's")
    if result["warnings"]:
        result["warnings"].append("rerun on an idle machine, with more --seconds, before trusting the numbers")
    return result


def chat_tokens(target) -> Callable[[str], list[int]]:
    """Text → prompt tokens: the target's chat template when it has one, else the raw text."""
    def tokens(text: str) -> list[int]:
        if target.chat_template:
            try:
                return target.chat_prompt([{"role": "user", "content": text}])
            except Exception:  # noqa: BLE001 - an unusual template: fall back to raw text
                pass
        return target.tokenize(text, add_special=True)
    return tokens
