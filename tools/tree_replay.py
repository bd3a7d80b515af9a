"""What would draft trees gain over chains where verifying more rows costs (almost) nothing? (issue 22)

At T = 0 the output is plain greedy decoding whatever the drafter or the tree, so every variant
generates the same text; what differs is how many tokens each target pass yields and what the
pass verified. This runs the real decoder on the bench suite's prompts with chains and with fixed
tree shapes (the draft model's top tokens as siblings, prompt lookup's rival continuations) and
records per step: tokens emitted, rows verified, rows each draft level decoded. Then it prices
every step under cost profiles, in units of one target pass of one row:

- `measured`: this machine's own t_verify(b) and draft decode t(w), timed here first;
- `gpu-like`: verify nearly flat (1 + 0.002 (b - 1)), a draft decode at a tenth of a pass
  (0.1 (1 + 0.01 (w - 1))), as tools/oracle.py's GPU-like profile;
- `rpc-5ms`: the target on a worker 5 ms away each way: each pass pays 10 ms of round trips on top
  of the measured compute (the draft stays local).

and prints tokens per pass and modelled tokens/s, tree against chain, per drafter, shape and
category.

    python tools/tree_replay.py [--max-tokens 96] [--k 4] [--category chat --category code-edit]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

SHAPES = ["off", "2", "2,2", "3,1", "4"]


def timed_costs(target, draft, reps: int = 15) -> tuple[dict[int, float], dict[int, float]]:
    """Median seconds of one target decode of b rows and one draft decode of w rows, here."""
    base = list(range(200, 330))
    out = []
    for m, sizes in ((target, (1, 2, 3, 5, 9, 17, 33)), (draft, (1, 2, 4, 8))):
        m.sync(base)
        times = {}
        for b in sizes:
            ts = []
            for _ in range(reps):
                t = time.perf_counter()
                m.eval([5] * b, logits_from=0)
                ts.append(time.perf_counter() - t)
                m.truncate(len(base))
            times[b] = float(np.median(ts))
        out.append(times)
    return out[0], out[1]


def interp(table: dict[int, float], n: int) -> float:
    xs = sorted(table)
    return float(np.interp(n, xs, [table[x] for x in xs]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--category", action="append", default=None)
    args = ap.parse_args()

    from localspec.bench.run import load_prompts
    from localspec.config import DecodeConfig, SamplingConfig
    from localspec.decoding.decoder import generate_steps
    from localspec.decoding.drafters import PromptLookup
    from localspec.decoding.model_drafter import ModelDrafter
    from localspec.loading.session import LoadConfig, Session

    session = Session.load(LoadConfig(drafter="auto", n_seq=8))
    target, draft = session.target, session.draft
    t_verify, t_draft = timed_costs(target, draft)
    unit = t_verify[1]
    profiles = {
        "measured": (lambda b: interp(t_verify, b) / unit, lambda w: interp(t_draft, w) / unit),
        "gpu-like": (lambda b: 1 + 0.002 * (b - 1), lambda w: 0.1 * (1 + 0.01 * (w - 1))),
        "rpc-5ms": (lambda b: (interp(t_verify, b) + 0.010) / unit, lambda w: interp(t_draft, w) / unit),
    }
    greedy = SamplingConfig(temperature=0.0)
    prompts = [p for p in load_prompts(None) if not args.category or p.category in args.category]
    # (drafter, shape, category) -> list of steps (tokens, rows, draft level widths)
    steps = defaultdict(list)
    texts = {}
    diverged = runs = 0
    for p in prompts:
        prompt = session.prompt_tokens(p.prompt, True, p.system)
        for kind in ("model", "lookup"):
            for shape in SHAPES:
                drafter = ModelDrafter(draft) if kind == "model" else PromptLookup()
                out = []
                for s in generate_steps(target, drafter, prompt, greedy,
                                        DecodeConfig(max_tokens=args.max_tokens, k=args.k, tree=shape)):
                    out += s.tokens
                    levels = _levels(s, kind, shape)
                    steps[kind, shape, p.category].append((len(s.tokens), 1 + s.n_nodes, levels))
                texts.setdefault(p.prompt, out)
                # the same text but where a near-tie flips (batch shapes round differently)
                diverged += out != texts[p.prompt]
                runs += 1
    print(f"timed here: t_verify(b) ms {({b: round(1e3 * t, 1) for b, t in t_verify.items()})}, "
          f"draft decode(w) ms {({w: round(1e3 * t, 1) for w, t in t_draft.items()})}")
    print(f"k = {args.k}, T = 0, {len(prompts)} prompts, {args.max_tokens} tokens each; "
          f"{diverged} of {runs} runs differ from the first run of their prompt (near-ties)")
    header = f"{'drafter':8} {'category':10} {'shape':6} {'tok/pass':>8} " + " ".join(f"{n + ' ×chain':>16}" for n in profiles)
    print(header)
    for kind in ("model", "lookup"):
        for cat in sorted({p.category for p in prompts}):
            chain = _price(steps[kind, "off", cat], profiles)
            for shape in SHAPES:
                got = _price(steps[kind, shape, cat], profiles)
                ratios = " ".join(f"{got[n] / chain[n]:16.3f}" for n in profiles)
                print(f"{kind:8} {cat:10} {shape:6} {got['tok/pass']:8.2f} {ratios}")


def _levels(step, kind: str, shape: str) -> list[int]:
    """Rows of each draft decode of the step: the first decode reads the last token or two (as a
    chain's does), then one decode per level above the deepest (a full tree of the shape: at T = 0
    every node has its children, the draft's top tokens); lookup decodes nothing."""
    from localspec.decoding.controller.trees import level_sizes

    if kind != "model" or step.n_drafted == 0:
        return []
    widths = [1] * step.n_drafted if shape == "off" or step.branches == 1 else \
        level_sizes(tuple(int(x) for x in shape.split(",")), step.n_drafted)
    return [1] + widths[:-1]


def _price(rows, profiles) -> dict[str, float]:
    tokens = sum(r[0] for r in rows)
    out = {"tok/pass": tokens / max(len(rows), 1)}
    for name, (verify, draft) in profiles.items():
        seconds = sum(verify(b) + sum(draft(w) for w in levels) for _, b, levels in rows)
        out[name] = tokens / seconds
    return out


if __name__ == "__main__":
    main()
