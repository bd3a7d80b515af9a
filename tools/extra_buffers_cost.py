"""What loading without llama.cpp's extra CPU buffers costs (what localspec does where AMX faults):
`localspec generate` with LOCALSPEC_EXTRA_BUFFERS=1 and =0, alternating, on each model given, and
the median tokens/s of each with their ratio.

    python tools/extra_buffers_cost.py [--rounds 5] [--max-tokens 128] [--threads 2] [--drafter none]
                                       [--model NAME_OR_PATH ...]

Each run's prompt is ~450 tokens, so the prefill (batched products) is timed too. Defaults: the
Gemma-3-270M Q4_K_M draft as a target (its Q4_K weights are repacked for AVX2 where
the extra buffers are on) and the SmolLM2 Q4_1 draft (Q4_1 has no repacked layout for AVX2: a
control that should read ~1.00 on a CPU without AMX, where AMX would take it). Decoding is plain unless --drafter says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess

from localspec.loading.defaults import embedded_path

PROMPT = "Once upon a time, in a lighthouse by a cold northern sea, there lived"   # raw text that goes on
LONG = " ".join(["The keeper wrote the weather in the log, trimmed the wick and wound the clock."] * 24) + " " + PROMPT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", default="128")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--drafter", default="none")
    ap.add_argument("--model", action="append", help="GGUF path or embedded name (repeatable)")
    a = ap.parse_args()
    models = a.model or ["gemma3-270m-q4_k_m", "smollm2-135m-q4_1"]
    for name in models:
        path = name if os.path.exists(name) else str(embedded_path(name))
        speeds: dict[str, list[float]] = {"1": [], "0": []}
        prefill: dict[str, list[float]] = {"1": [], "0": []}
        for r in range(a.rounds):
            for value in (("1", "0") if r % 2 == 0 else ("0", "1")):
                out = subprocess.run(
                    ["localspec", "generate", LONG, "--target", path, "--drafter", a.drafter, "--raw",
                     "--temperature", "0", "--max-tokens", a.max_tokens, "--threads", a.threads, "--json"],
                    capture_output=True, text=True, check=True,
                    env=dict(os.environ, LOCALSPEC_EXTRA_BUFFERS=value, LOCALSPEC_NO_WARM_START="1"))
                report = json.loads(out.stdout)
                if not report["n_tokens"]:
                    raise SystemExit(f"{path}: generated nothing (an end of text at once); try another model")
                speeds[value].append(report["tokens_per_second"])
                prefill[value].append(report["n_prompt_tokens"] / report["prefill_seconds"])
        on, off = statistics.median(speeds["1"]), statistics.median(speeds["0"])
        print(f"{os.path.basename(path)}: extra buffers on {on:.1f} t/s, off {off:.1f} t/s, "
              f"off/on {off / on:.3f} (medians of {a.rounds}; on {[round(x, 1) for x in speeds['1']]}, "
              f"off {[round(x, 1) for x in speeds['0']]}); prefill of {report['n_prompt_tokens']} tokens: on "
              f"{statistics.median(prefill['1']):.0f} t/s, off {statistics.median(prefill['0']):.0f} t/s, off/on "
              f"{statistics.median(prefill['0']) / statistics.median(prefill['1']):.3f}", flush=True)


if __name__ == "__main__":
    main()
