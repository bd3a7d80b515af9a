"""`localspec bench --concurrency 1,2,4`: plain batched decoding against speculation, at each number
of generations running at once, in one process.

At level c, c worker threads take the suite's prompts in turn (a finished generation's slot takes
the next prompt at once: continuous batching) in the slots of one `SlotPool`, so every decode of
the target holds the rows of up to c generations. Plain decoding batched this way is the baseline:
on a CPU or a GPU, c rows cost much less than c single decodes, and speculation's rows compete for
the same decode. Each level runs every variant (plain, then speculation at each -k), alternating
their order from round to round so that drift falls on all alike. Each run starts every generation
from an empty slot (no prefix reuse), and the slots' controllers (one per variant and slot) keep
what they learn for the whole bench, as a server's would.

Reported per level and variant: total tokens/s (every generated token over the wall time from the
first request's start to the last one's end), per-request decoding tokens/s at p50 and p99 (p99:
the slowest 1%), inter-token latency at p50 and p99 (a step of m tokens taking s seconds counts m
latencies of s/m), α, mean k, and the speedup over plain batched decoding at that level. At T = 0
every generation is compared with plain decoding's at concurrency 1: batching must not change it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from localspec.config import ConfigError, DecodeConfig, SamplingConfig
from localspec.decoding.decoder import generate_steps
from localspec.decoding.stats import RunStats, tree_label
from localspec.loading import controllers
from localspec.loading.pool import SlotPool
from .report import version

SCHEMA = "localspec.bench-concurrency/1"
MAX_LEVEL = 32


def parse_levels(value: str) -> list[int]:
    """'1,2,4' → [1, 2, 4]: each a number of generations at once, 1..MAX_LEVEL."""
    out = []
    for item in value.split(","):
        try:
            c = int(item.strip())
        except ValueError:
            raise ConfigError(f"--concurrency takes numbers like 1,2,4; got {item.strip()!r}") from None
        if not 1 <= c <= MAX_LEVEL:
            raise ConfigError(f"--concurrency levels must be between 1 and {MAX_LEVEL}, got {c}")
        if c not in out:
            out.append(c)
    return out


@dataclass
class Generation:
    """One request of a level's run."""

    prompt: int
    tokens: list[int]
    steps: list         # its decoder Steps, in order
    start: float        # when its worker took it
    end: float          # when its last step came
    first: float        # when its first token came


@dataclass(frozen=True)
class Variant:
    key: str            # "plain", or the speculative variant's "auto" / "4"
    k: int | None = None
    spec: bool = False


def run_level(pool: SlotPool, v: Variant, c: int, prompts: Sequence[list[int]], sampling: SamplingConfig,
              max_tokens: Sequence[int], tree, kept: dict, done: Callable[[], None]) -> tuple[list[Generation], float]:
    """Every prompt once, c at a time; returns the generations (in prompt order) and the wall
    seconds from the first start to the last end."""
    session = pool.session
    todo = list(range(len(prompts)))
    out: list[Generation | None] = [None] * len(prompts)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                i = todo.pop(0)
            prompt = prompts[i]
            slot = pool.acquire(prompt)
            try:
                pool.clear(slot)   # every generation starts empty: no variant reuses another's prefix
                drafter = pool.drafter(slot) if v.spec else None
                key = (v.key, slot)   # plain too: its steps tell the batch what plain delivers
                if key not in kept:
                    kept[key] = controllers.make(session, drafter, sampling.temperature, v.k if v.spec else 0,
                                                 warm=False)[0]
                ctl = kept[key]
                decode = DecodeConfig(max_tokens=max_tokens[i], k=v.k if v.spec else 0,
                                      k_max=controllers.k_max_for(v.k), tree=tree if v.spec else "off")
                steps, tokens, start, first = [], [], time.perf_counter(), None
                with pool.generating(slot, ctl):
                    for step in generate_steps(pool.targets[slot], drafter, prompt, sampling, decode, ctl):
                        steps.append(step)
                        tokens += step.tokens
                        if first is None and step.tokens:
                            first = time.perf_counter()
                end = time.perf_counter()
                out[i] = Generation(i, tokens, steps, start, end, first or end)
            except BaseException as e:   # ends the level: every worker stops taking prompts
                with lock:
                    errors.append(e)
                return
            finally:
                pool.release(slot)
            done()

    threads = [threading.Thread(target=worker, name=f"localspec-bench-{n}") for n in range(c)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:   # Ctrl-C reaches the main thread: every slot's next decode stops
        pool.cancel_all()
        for t in threads:
            t.join()
        raise
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return out, wall


def _pct(values, q) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def summarize(gens: list[Generation], wall: float) -> dict:
    total = RunStats.of(step for g in gens for step in g.steps)
    rates, itl = [], []
    for g in gens:
        decoding = g.end - g.first
        if len(g.tokens) > 1 and decoding > 0:
            rates.append((len(g.tokens) - 1) / decoding)
        own = RunStats.of(g.steps)
        for s, m in zip(own.step_seconds[1:], own.step_tokens[1:]):   # the first holds the prefill
            itl += [s / m] * m if m else []
    n = total.n_tokens
    return {
        "requests": len(gens),
        "tokens": n,
        "wall_seconds": wall,
        "tokens_per_second": n / wall if wall > 0 else None,
        "request_tokens_per_second": {"p50": _pct(rates, 50), "p99": _pct(rates, 1)},
        "itl_ms": {"p50": _pct(itl, 50) and 1e3 * _pct(itl, 50), "p99": _pct(itl, 99) and 1e3 * _pct(itl, 99)},
        "ttft_ms": {"p50": 1e3 * _pct([g.first - g.start for g in gens], 50),
                    "p99": 1e3 * _pct([g.first - g.start for g in gens], 99)},
        "alpha": total.alpha,
        "mean_k": total.k_sum / total.n_steps if total.n_steps else None,
        "tokens_per_pass": total.tokens_per_pass,
    }


def run_concurrency(session, prompts: list[list[int]], max_tokens: list[int], levels: Sequence[int],
                    sampling: SamplingConfig, ks: Sequence[int | None] = (None,), tree="off", repeat: int = 1,
                    warmup: bool = True, progress=None) -> dict:
    """Run the suite at each level (the session loaded with parallel >= max(levels)); the report."""
    width = session.target.n_seq // max(levels)
    pool = SlotPool(session, max(levels), width)
    variants = [Variant("plain")] + [Variant("auto" if k is None else str(k), k, True) for k in ks]
    kept: dict = {}
    total = len(levels) * repeat * len(variants) * len(prompts)
    count = [0]

    def done() -> None:
        count[0] += 1
        if progress:
            progress(count[0], total, "generations")

    if warmup:   # not counted: every variant once at the highest level, a few tokens each
        for v in variants:
            run_level(pool, v, max(levels), prompts[:max(levels)], sampling, [8] * len(prompts), tree, kept, lambda: None)
    results: dict = {}
    texts: dict = {}
    for c in levels:
        runs: dict[str, list] = {v.key: [] for v in variants}
        for r in range(repeat):
            order = variants if r % 2 == 0 else variants[::-1]
            for v in order:
                gens, wall = run_level(pool, v, c, prompts, sampling, max_tokens, tree, kept, done)
                runs[v.key].append((gens, wall))
                texts[(c, v.key, r)] = [g.tokens for g in gens]
        level = {}
        for v in variants:
            gens = [g for gs, _ in runs[v.key] for g in gs]
            level[v.key] = summarize(gens, sum(w for _, w in runs[v.key]))
        plain = level["plain"]["tokens_per_second"]
        for v in variants[1:]:
            s = level[v.key]["tokens_per_second"]
            level[v.key]["speedup"] = s / plain if s and plain else None
        results[str(c)] = level
    identical = None
    if sampling.greedy:   # every generation against plain decoding at the lowest level
        ref = texts[(levels[0], "plain", 0)]
        pairs = [(a, b) for key, gens in texts.items() for a, b in zip(gens, ref)]
        identical = {"same": sum(a == b for a, b in pairs), "of": len(pairs)}
    return {
        "schema": SCHEMA,
        "config": {**session.describe(), "levels": list(levels), "k": ["auto" if k is None else k for k in ks],
                   "tree": tree_label(tree), "repeat": repeat, "n_prompts": len(prompts), "n_ctx": session.n_ctx,
                   "threads": session.target.n_threads, **replace(sampling).record(),
                   "localspec_version": version("localspec")},
        "levels": results,
        "greedy_identical": identical,
        "batch_cost_ms": {str(b): 1e3 * t for b, t in sorted(pool.costs.verify.by_size.items())},
    }


def format_concurrency(report: dict) -> str:
    lines = [f"localspec bench --concurrency · {report['config']['target']}",
             f"{'c':>3} {'variant':<8} {'total t/s':>9} {'req t/s p50':>11} {'p99':>6} {'ITL ms p50':>10} "
             f"{'p99':>6} {'TTFT ms p50':>11} {'α':>5} {'mean k':>6} {'vs plain':>8}"]
    f = lambda x, fmt=".1f": "—" if x is None else format(x, fmt)  # noqa: E731
    for c, level in report["levels"].items():
        for key, s in level.items():
            lines.append(f"{c:>3} {key:<8} {f(s['tokens_per_second']):>9} {f(s['request_tokens_per_second']['p50']):>11} "
                         f"{f(s['request_tokens_per_second']['p99']):>6} {f(s['itl_ms']['p50']):>10} "
                         f"{f(s['itl_ms']['p99']):>6} {f(s['ttft_ms']['p50'], '.0f'):>11} {f(s['alpha'], '.2f'):>5} "
                         f"{f(s['mean_k'], '.2f'):>6} {f(s.get('speedup'), '.2f') + '×' if s.get('speedup') else '':>8}")
    same = report.get("greedy_identical")
    if same:
        lines.append(f"greedy text identical to plain at c = {report['config']['levels'][0]}: "
                     f"{same['same']} of {same['of']} generations")
    return "\n".join(lines)
