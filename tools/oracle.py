"""How much could choosing the drafter per step gain, at most, on this machine? (issue 11)

At T = 0 the output is plain greedy decoding, so for every position of every bench prompt we can
say afterwards how many tokens each drafter would have had accepted there: prompt lookup's
candidate (localspec.decoding.lookup.NGramStore, as `--drafter lookup` builds it) and the draft model's
greedy draft, both up to K tokens. With the verify and draft costs timed on this machine, a
dynamic programme then finds the fastest schedule of steps that knows all of that in advance:
lookup only, model only, either per step, and either or a lookup prefix extended by the model.
Such foresight is not available to a real drafter; the ratio between the schedules bounds what
any per-step choice can gain over the better single drafter.

    python tools/oracle.py collect [--max-tokens 128] [--out oracle.json]
    python tools/oracle.py bound oracle.json [--gpu-like]

`--gpu-like` replaces the timed costs by a GPU-like profile (verify nearly flat in the batch size,
a draft token at a tenth of a target pass) to see how the bound moves with the hardware.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

K = 12
LAG_CAP = 20


def collect(max_tokens: int, out: str) -> None:
    from localspec.bench.run import load_prompts
    from localspec.config import DecodeConfig, SamplingConfig
    from localspec.decoding.decoder import generate_steps
    from localspec.decoding.lookup import NGramStore
    from localspec.loading.session import LoadConfig, Session
    from localspec.tokens import common_prefix

    session = Session.load(LoadConfig(drafter="auto"))
    target, draft = session.target, session.draft
    greedy = SamplingConfig(temperature=0.0)
    verify, draft_cost = _time_costs(target, draft)
    rows = []
    for p in load_prompts(None):
        prompt = session.prompt_tokens(p.prompt, True, p.system)
        steps = generate_steps(target, None, prompt, greedy, DecodeConfig(max_tokens=max_tokens), None)
        out_tokens = [t for s in steps for t in s.tokens]
        text = prompt + out_tokens
        store = NGramStore()
        lookup, model = [], []
        draft.truncate(0)
        draft.eval(prompt[:-1])
        for i in range(len(out_tokens)):
            context = text[:len(prompt) + i]
            store.update(context)
            candidate, _ = store.candidate(context, K)
            lookup.append([len(candidate), common_prefix(candidate, out_tokens[i:])])
            draft.truncate(len(context) - 1)
            logits = draft.eval(context[-1:], logits_from=-1)
            proposal = []
            for j in range(K):
                proposal.append(int(logits[0].argmax()))
                if j < K - 1:
                    logits = draft.eval(proposal[-1:], logits_from=0)
            model.append(common_prefix(proposal, out_tokens[i:]))
        rows.append({"category": p.category, "n": len(out_tokens), "lookup": lookup, "model": model})
        print(p.category, len(out_tokens), "mean accepted: lookup", round(np.mean([x[1] for x in lookup]), 2),
              "model", round(np.mean(model), 2), flush=True)
    with open(out, "w") as f:
        json.dump({"verify": verify, "draft": draft_cost, "rows": rows}, f)


def _time_costs(target, draft) -> tuple[dict, dict]:
    """Median seconds of a target decode of b = 1..K+1 tokens and a draft decode of n tokens."""
    context = target.tokenize("The quick brown fox jumps over the lazy dog. " * 20)

    def timed(model, sizes, logits_from):
        model.truncate(0)
        model.eval(context[:-1])
        base, out = len(model.tokens), {}
        for b in sizes:
            runs = []
            for _ in range(7):
                model.truncate(base)
                start = time.perf_counter()
                model.eval(context[-1:] * b, logits_from=logits_from)
                runs.append(time.perf_counter() - start)
            out[b] = float(np.median(runs))
        return out

    return timed(target, range(1, K + 2), 0), timed(draft, (1, 2, 4, 8, 16), -1)


def bound(path: str, gpu_like: bool) -> None:
    with open(path) as f:
        data = json.load(f)
    verify = {int(b): t for b, t in data["verify"].items()}
    draft = {int(n): t for n, t in data["draft"].items()}
    if gpu_like:
        verify = {b: verify[1] * (1 + 0.01 * (b - 1)) for b in verify}
        draft = {n: 0.1 * verify[1] * (1 + 0.02 * (n - 1)) for n in draft}
    sizes = sorted(draft)
    first = lambda n: float(np.interp(n, sizes, [draft[x] for x in sizes]))  # noqa: E731
    kinds = {"lookup": {"lookup"}, "model": {"model"}, "either": {"lookup", "model"},
             "either+mixed": {"lookup", "model", "mixed"}}
    totals: dict[str, dict[str, float]] = {}
    for row in data["rows"]:
        cat = totals.setdefault(row["category"], {"n": 0.0, "plain": 0.0, **{k: 0.0 for k in kinds}})
        cat["n"] += row["n"]
        cat["plain"] += row["n"] * verify[1]
        for name, allowed in kinds.items():
            cat[name] += _fastest(row, allowed, verify, first, draft[1])
    overall = {key: sum(c[key] for c in totals.values()) for key in next(iter(totals.values()))}
    print(f"{'category':10s} " + " ".join(f"{k:>13s}" for k in ["plain", *kinds]) + "  (tokens/s; ratio to the better single)")
    for name, c in [*totals.items(), ("overall", overall)]:
        tps = {k: c["n"] / c[k] for k in ["plain", *kinds]}
        single = max(tps["lookup"], tps["model"])
        print(f"{name:10s} " + " ".join(f"{tps[k]:13.1f}" for k in ["plain", *kinds])
              + f"  either {tps['either'] / single:.2f}x, +mixed {tps['either+mixed'] / single:.2f}x")


def _fastest(row, allowed, verify, first, d1) -> float:
    """Seconds of the fastest schedule for one prompt, knowing every step's outcome in advance.
    State: position and how far the draft model is behind (its first decode reads that much)."""
    n = row["n"]
    best = np.zeros((n + K + 2, LAG_CAP + 1))
    for i in range(n - 1, -1, -1):
        offered, lookup_ok = row["lookup"][i]
        for lag in range(LAG_CAP + 1):
            behind = lambda a: min(lag + a + 1, LAG_CAP)  # noqa: E731
            options = [verify[1] + best[i + 1, behind(0)]]
            if "lookup" in allowed:
                for m in range(1, min(offered, K) + 1):
                    a = min(lookup_ok, m)
                    options.append(verify[m + 1] + best[min(i + a + 1, n), behind(a)])
            if "model" in allowed:
                for j in range(1, K + 1):
                    a = min(row["model"][i], j)
                    options.append(first(max(lag, 1)) + (j - 1) * d1 + verify[j + 1] + best[min(i + a + 1, n), 1])
            if "mixed" in allowed:
                for m in range(1, min(lookup_ok, offered, K - 1) + 1):
                    for j in range(1, K - m + 1):
                        a = m + (min(row["model"][i + m], j) if i + m < n else 0)
                        options.append(first(lag + m) + (j - 1) * d1 + verify[m + j + 1] + best[min(i + a + 1, n), 1])
            best[i, lag] = min(options)
    return float(best[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--max-tokens", type=int, default=128)
    c.add_argument("--out", default="oracle.json")
    b = sub.add_parser("bound")
    b.add_argument("path")
    b.add_argument("--gpu-like", action="store_true")
    args = parser.parse_args()
    if args.command == "collect":
        collect(args.max_tokens, args.out)
    else:
        bound(args.path, args.gpu_like)


if __name__ == "__main__":
    main()
