"""What a stale warm-start record costs a run: a cold run writes a true record for a pair; then,
per spoiling and seed, a `--no-warm-start` run and a run started from the spoiled record, back to
back, and their tokens/s, the draft model's steps and the draft cost saved afterwards.

    python tools/stale_records.py [--temperature 0] [--seeds 1 2] [--max-tokens 256] [--threads 2]
                                  [--prompt TEXT] [--only NAME] [--repeats N] [--show-steps]
                                  [-- EXTRA GENERATE OPTIONS]

The spoilings (also what tests/test_stale_records.py runs): every cost 10x too slow (`slow10`); a
drafter that "never pays" (drafting and catch-ups 30x dearer, α 0.1); an erratic record (every
timing off by up to 5x either way, α 0.3, weight 0.35); and a real record from a busy hour
(`loaded_hour`, tests/records/loaded-hour.json). At --temperature 0 both runs write the same
text, so their ratio is the record's whole cost; at T > 0 they sample different texts. It runs in a
cache directory of its own (the model files linked in), so the user's records are not touched.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

PROMPT = "Write a short story about a lighthouse keeper."


def _scaled(d: dict, f) -> dict:
    return {n: t * f(n) for n, t in d.items()}


def _alpha(m: dict, alpha: float) -> None:
    """Every band's α (and its rates by position) set to `alpha`."""
    for band in m.get("alpha", {}).values():
        band |= {"alpha": alpha, "by_position": [alpha] * len(band.get("by_position", []))}


def slow10(rec: dict) -> dict:
    m = rec["drafters"]["model"]
    rec["verify"] = _scaled(rec["verify"], lambda n: 10)
    for field in ("draft_by_n", "first_decode"):
        m[field] = _scaled(m.get(field, {}), lambda n: 10)
    m["draft_cost"] *= 10
    m["resume_cost"] = (m.get("resume_cost") or 0.01) * 10
    return rec


def never_pays(rec: dict) -> dict:
    m = rec["drafters"]["model"]
    for field in ("draft_by_n", "first_decode"):
        m[field] = _scaled(m.get(field, {}), lambda n: 30)
    m["draft_cost"] *= 30
    m["resume_cost"] = 1.0
    _alpha(m, 0.1)
    return rec


def erratic(rec: dict) -> dict:
    rng = np.random.default_rng(7)
    off = lambda n: float(np.exp(rng.uniform(-np.log(5), np.log(5))))   # noqa: E731
    m = rec["drafters"]["model"]
    rec["verify"] = _scaled(rec["verify"], off)
    for field in ("draft_by_n", "first_decode"):
        m[field] = _scaled(m.get(field, {}), off)
    m["draft_cost"] *= off(0)
    m["resume_cost"] = (m.get("resume_cost") or 0.01) * off(0)
    _alpha(m, 0.3)
    rec["weight"] = 0.35
    return rec


REAL = Path(__file__).resolve().parent.parent / "tests" / "records" / "loaded-hour.json"


def loaded_hour(rec: dict) -> dict:
    """Not a spoiling but a real record, written while other work shared a 2-core CPU (verify
    2.6-8x too slow, drafting 46 ms a token, long drafts dearer per token than short ones, no
    first-decode line): its costs and α, under this run's key."""
    return json.loads(REAL.read_text()) | {"key": rec["key"]}


SPOILINGS = (slow10, never_pays, erratic, loaded_hour)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--temperature", default="0")
    ap.add_argument("--seeds", nargs="+", default=["1", "2"])
    ap.add_argument("--max-tokens", default="256")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--repeats", type=int, default=1, help="cold/spoiled pairs per seed, in alternating order")
    ap.add_argument("--show-steps", action="store_true", help="print each run's drafter per step (p/m/l)")
    ap.add_argument("--only", choices=[f.__name__ for f in SPOILINGS], action="append",
                    help="run only these records (repeatable)")
    ap.add_argument("extra", nargs="*", help="more `localspec generate` options, after --")
    a = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="localspec-stale-")
    env = {k: v for k, v in os.environ.items() if k != "LOCALSPEC_NO_WARM_START"} | {"LOCALSPEC_CACHE": cache}
    home = Path(os.environ.get("LOCALSPEC_CACHE") or Path.home() / ".cache" / "localspec")
    for f in home.glob("*.gguf"):   # the embedded target, made once: not made again
        os.symlink(f, Path(cache) / f.name)
    args = [a.prompt, "--max-tokens", a.max_tokens, "--threads", a.threads, "--json", *a.extra]

    def gen(*more: str) -> dict:
        out = subprocess.run(["localspec", "generate", *args, *more], capture_output=True, text=True, env=env)
        return json.loads(out.stdout)

    for t in sorted({a.temperature, "1"}):   # the record's sampled band too, which the spoilings set
        gen("--seed", "9", "--temperature", t)
    (path,) = (Path(cache) / "controller").glob("*.json")
    true = json.loads(path.read_text())
    for spoil in [f for f in SPOILINGS if not a.only or f.__name__ in a.only]:
        for seed in a.seeds:
            ratios = []
            for r in range(a.repeats):   # pairs in alternating order: a phase change hits both sides
                runs = {}
                for side in (("cold", "spoiled") if r % 2 == 0 else ("spoiled", "cold")):
                    if side == "cold":
                        runs[side] = gen("--seed", seed, "--temperature", a.temperature, "--no-warm-start")
                    else:
                        path.write_text(json.dumps(spoil(json.loads(json.dumps(true))) | {"saved": time.time()}))
                        runs[side] = gen("--seed", seed, "--temperature", a.temperature)
                        saved = json.loads(path.read_text())["drafters"]["model"]["draft_cost"]
                        path.write_text(json.dumps(true))
                warm, cold = runs["spoiled"], runs["cold"]
                steps = warm["step_drafters"]
                ratios.append(warm["tokens_per_second"] / cold["tokens_per_second"])
                print(f"{spoil.__name__:10s} seed {seed}: spoiled {warm['tokens_per_second']:.1f} t/s, model on "
                      f"{steps.count('model')}/{len(steps)} steps, first at {steps.index('model') if 'model' in steps else None}"
                      f" | cold {cold['tokens_per_second']:.1f} t/s, model on {cold['step_drafters'].count('model')}/"
                      f"{len(cold['step_drafters'])} | ratio {ratios[-1]:.2f} | saved draft cost {saved * 1e3:.1f} ms "
                      f"(true {true['drafters']['model']['draft_cost'] * 1e3:.1f})", flush=True)
                if a.show_steps:
                    for name, run in (("spoiled", warm), ("cold", cold)):
                        print(f"  {name:7s} " + "".join(x[0] for x in run["step_drafters"]), flush=True)
            if a.repeats > 1:
                print(f"{spoil.__name__:10s} seed {seed}: median ratio {float(np.median(ratios)):.2f} of {a.repeats} pairs",
                      flush=True)

if __name__ == "__main__":
    main()
