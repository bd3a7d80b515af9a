"""The measurements of the device check (tools/gpu_check.sh), in one process so that each model
loads once and every ratio comes from the same interleaved rounds.

    python tools/gpu_bench.py --target F16.gguf --self-draft Q4_0.gguf --small-draft 1B.gguf
                              [--quant Q4_0.gguf] [--tokens 128] [--rounds 2] [--out report.json]

1. plain: localspec's plain decoding against llama-cpp-python's `Llama.generate` on the same
   file, at T = 0 and at T = 1 (top-k 40, top-p 0.95, min-p 0.05), on the target and on --quant;
2. the cost of a decode of n rows, repeated (graphs replay) and alternating with one-row decodes;
3. speculation on the target with each draft (its quantized self, the small model), T = 0 and 1,
   chains and --tree auto, stable shapes on and off: tokens/s against plain decoding in the same
   round, alpha, tokens per pass, verify ms per step, the rows padding added;
4. greedy identity: every T = 0 variant's text against plain greedy (the first divergence and the
   plain row's gap between its two best logits there: a near-tie or not).
Each round visits every variant once, in an order rotated per round. Random-weight models (the
device check's) make noise for text: costs are real, acceptance is what such models give.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localspec.config import DecodeConfig, ModelConfig, SamplingConfig  # noqa: E402
from localspec.decoding.controller import KController  # noqa: E402
from localspec.decoding.decoder import generate_steps  # noqa: E402
from localspec.decoding.model_drafter import ModelDrafter  # noqa: E402
from localspec.decoding.stats import RunStats  # noqa: E402
from localspec.engine import Model  # noqa: E402
from localspec.engine.reference import ReferenceModel  # noqa: E402
from localspec.engine.shapes import Shapes  # noqa: E402

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a binary search works, step by step, with an example in Python.",
]
SAMPLINGS = {"T=0": SamplingConfig(temperature=0.0, seed=1), "T=1": SamplingConfig(temperature=1.0, seed=1)}
N_CTX = 2048


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def load(path: str, n_seq: int = 1, gpu_layers: int = -1) -> Model:
    t0 = time.perf_counter()
    m = Model(ModelConfig(path, n_ctx=N_CTX, n_gpu_layers=gpu_layers, n_seq=n_seq))
    log(f"loaded {Path(path).name} (n_seq {n_seq}) in {time.perf_counter() - t0:.1f} s")
    return m


def stable(models, on: bool) -> None:
    for m in models:
        m.shapes = Shapes() if on else None


def timed(target, drafter, prompt, sampling, tokens, controller=None, tree="off"):
    """(tokens, seconds of decoding, steps): prefill excluded, as bench counts."""
    target.truncate(0)
    target.sync(prompt[:-1])
    if drafter is not None:
        drafter.prepare(prompt)   # the drafter's own prefill, outside the clock too
    t0 = time.perf_counter()
    steps = list(generate_steps(target, drafter, prompt, sampling, DecodeConfig(max_tokens=tokens, tree=tree),
                                controller=controller))
    seconds = time.perf_counter() - t0
    return [t for step in steps for t in step.tokens], seconds, steps


def plain_vs_reference(path: str, prompts_text, tokens: int, rounds: int, threads: int) -> dict:
    """localspec plain against Llama.generate on one file, both loaded, interleaved."""
    model = load(path)
    ref = ReferenceModel(path, n_ctx=N_CTX, threads=threads or model.n_threads)
    prompts = [model.tokenize(p) for p in prompts_text]
    rows = {}
    for name, s in SAMPLINGS.items():
        ours, theirs = [], []
        for r in range(rounds + 1):   # round 0 warms up
            for prompt in prompts:
                out, secs, _ = timed(model, None, prompt, s, tokens)
                got, _, dec = ref.generate(prompt, tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                           min_p=s.min_p, seed=r)
                if r:
                    ours.append(len(out) / secs)
                    theirs.append(len(got) / dec)
        rows[name] = {"localspec_tps": float(np.median(ours)), "llama_generate_tps": float(np.median(theirs)),
                      "ratio": float(np.median(ours) / np.median(theirs))}
        log(f"{Path(path).name} {name}: localspec {rows[name]['localspec_tps']:.1f} t/s, "
            f"Llama.generate {rows[name]['llama_generate_tps']:.1f} t/s, {rows[name]['ratio']:.3f}x")
    ref.close()
    model.close()
    return rows


def decode_curve(path: str, sizes=(1, 2, 4, 8, 16, 32, 64), reps: int = 24) -> dict:
    """ms of one decode of n rows (every row's logits, as a verify) after a 512-token text: run
    `reps` times in a row (a GPU backend's graphs replay from the third on), and alternating with
    one-row decodes (each shape change costs a graph that is never replayed)."""
    model = load(path)
    text = (model.tokenize(" ".join(PROMPTS)) * 64)[:512]
    model.sync(text)
    base = len(model.tokens)
    out = {}
    for n in sizes:
        rows = text[:n]
        steady, alternating = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            model.eval(rows, logits_from=0)
            steady.append(time.perf_counter() - t0)
            model.truncate(base)
        for _ in range(reps):
            model.eval(rows[:1], logits_from=0)
            model.truncate(base)
            t0 = time.perf_counter()
            model.eval(rows, logits_from=0)
            alternating.append(time.perf_counter() - t0)
            model.truncate(base)
        out[n] = {"steady_ms": 1e3 * float(np.median(steady[4:])), "alternating_ms": 1e3 * float(np.median(alternating[4:]))}
        log(f"{Path(path).name} decode of {n} rows: steady {out[n]['steady_ms']:.2f} ms, "
            f"alternating with 1-row decodes {out[n]['alternating_ms']:.2f} ms")
    model.close()
    return out


def near_tie_gap(target, prompt, plain, other) -> dict | None:
    if other == plain:
        return None
    i = next((j for j in range(min(len(plain), len(other))) if plain[j] != other[j]), min(len(plain), len(other)))
    target.truncate(0)
    text = [*prompt, *plain[:i]]
    row = np.array(target.eval(text, logits_from=len(text) - 1)[-1])
    target.truncate(0)
    top = np.sort(row)[-2:]
    return {"at": i, "gap": float(top[1] - top[0])}


def speculation(target_path: str, drafts: dict[str, str], tokens: int, rounds: int) -> dict:
    """Every speculative variant on the target against plain decoding, interleaved."""
    target = load(target_path, n_seq=DecodeConfig(tree="auto").n_seq)
    models = {name: load(path, n_seq=DecodeConfig(tree="auto").n_seq) for name, path in drafts.items()}
    prompts = [target.tokenize(p) for p in PROMPTS]
    variants = [("plain", None, "off", False), ("plain", None, "off", True)]
    for name in drafts:
        for tree in ("off", "auto"):
            for shapes in (False, True):
                variants.append((name, name, tree, shapes))
    results: dict = {}
    plain_text: dict = {}
    for sname, sampling in SAMPLINGS.items():
        controllers = {v: KController(DecodeConfig().k_max) for v in variants}
        acc = {v: {"tokens": 0, "seconds": 0.0, "steps": [], "padded": 0, "texts": []} for v in variants}
        for r in range(rounds + 1):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in order:
                draft_name, model_name, tree, shapes = v
                draft_model = models.get(model_name)
                stable([target] + ([draft_model] if draft_model else []), shapes)
                for i, prompt in enumerate(prompts):
                    drafter = ModelDrafter(draft_model, target.n_vocab) if draft_model else None
                    s = replace(sampling, seed=1000 * r + i)
                    out, secs, steps = timed(target, drafter, prompt, s, tokens,
                                             controllers[v] if drafter is not None else None, tree)
                    if r == 0:
                        continue   # warm-up: the controllers learn, nothing is counted
                    a = acc[v]
                    a["tokens"] += len(out)
                    a["seconds"] += secs
                    a["steps"] += steps
                    a["texts"].append(out)
                if r:   # stable() made the counters afresh for this visit
                    acc[v]["padded"] += sum(m.shapes.padded for m in (target, draft_model)
                                            if m is not None and m.shapes is not None)
        stable([target, *models.values()], False)
        base = {shapes: acc[("plain", None, "off", shapes)] for shapes in (False, True)}
        for v in variants:
            a = acc[v]
            stats = RunStats.of(a["steps"])
            tps = a["tokens"] / a["seconds"] if a["seconds"] else 0.0
            plain_tps = base[False]["tokens"] / base[False]["seconds"]
            row = {"tps": tps, "vs_plain": tps / plain_tps, "alpha": stats.alpha, "tokens_per_pass": stats.tokens_per_pass,
                   "verify_ms_per_step": stats.verify_ms_per_step, "host": stats.host(),
                   "mean_k": stats.k_sum / stats.n_steps if stats.n_steps else None, "padded_rows": a["padded"],
                   "tree_steps": sum(st.branches > 1 for st in a["steps"])}
            key = f"{sname} {v[0]} tree={v[2]} stable={'on' if v[3] else 'off'}"
            if sname == "T=0":
                if v[0] == "plain" and not v[3]:
                    plain_text = a["texts"]
                elif a["texts"]:
                    gaps = [near_tie_gap(target, prompts[j % len(prompts)], plain_text[j], a["texts"][j])
                            for j in range(min(len(plain_text), len(a["texts"])))]
                    row["greedy_equal"] = sum(g is None for g in gaps)
                    row["greedy_runs"] = len(gaps)
                    row["divergences"] = [g for g in gaps if g is not None]
            results[key] = row
            log(f"{key}: {tps:.1f} t/s, {row['vs_plain']:.2f}x plain, alpha {_f(row['alpha'])}, "
                f"tok/pass {_f(row['tokens_per_pass'])}, verify {_f(row['verify_ms_per_step'])} ms, mean k {_f(row['mean_k'])}, "
                f"padded {row['padded_rows']}, tree steps {row['tree_steps']}"
                + (f", greedy equal {row.get('greedy_equal')}/{row.get('greedy_runs')}" if 'greedy_runs' in row else ""))
    target.close()
    for m in models.values():
        m.close()
    return results


def _f(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--self-draft", required=True)
    ap.add_argument("--small-draft")
    ap.add_argument("--quant", help="a second file for the plain comparison (default: --self-draft)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="Llama.generate's threads (default: localspec's)")
    ap.add_argument("--skip", action="append", default=[], help="plain | curve | spec")
    ap.add_argument("--out", default="gpu_bench.json")
    args = ap.parse_args()
    report: dict = {"tokens": args.tokens, "rounds": args.rounds}
    t0 = time.perf_counter()

    def save() -> None:
        report["seconds"] = time.perf_counter() - t0
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))

    if "plain" not in args.skip:
        report["plain"] = {}
        for path in dict.fromkeys([args.target, args.quant or args.self_draft]):
            report["plain"][Path(path).name] = plain_vs_reference(path, PROMPTS, args.tokens, args.rounds, args.threads)
            save()
    if "curve" not in args.skip:
        report["decode_curve"] = {Path(p).name: decode_curve(p) for p in dict.fromkeys([args.target, args.self_draft])}
        save()
    if "spec" not in args.skip:
        drafts = {"self-draft": args.self_draft}
        if args.small_draft:
            drafts["small-draft"] = args.small_draft
        report["speculation"] = speculation(args.target, drafts, args.tokens, args.rounds)
        save()
    save()


if __name__ == "__main__":
    main()
