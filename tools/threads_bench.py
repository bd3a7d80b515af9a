"""`localspec generate`'s tokens/s with the default threads, --threads 1 and --threads 2, on a
machine with 0, 1 and 2 other cores kept busy by CPU hogs (issue 20: the default must fit the
machine as it is now).

    python tools/threads_bench.py [--rounds 3] [--loads 0 1 2] [--threads 1 2] [--max-tokens 128]
                                  [--prompt TEXT] [-- EXTRA GENERATE OPTIONS]

Run it on a machine with nothing else running: the hogs are the only other work it should see.
Each round visits every load, and at each load every thread setting, in an order rotated per
round, so a drift of the machine's speed hits them alike; the hogs (`python -c 'while 1: pass'`,
one per busy core) start before a load's runs and are killed after them. Every run is
`generate --json --temperature 0 --no-warm-start` (a record one run writes would change the next),
and its tokens/s is decode and prefill together, as generate reports it. The table shows the
median over rounds per cell, the thread count the default chose, and the default against the best
explicit setting at that load.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
HOG = "while 1: pass"


def generate(args, threads: int | None) -> dict:
    cmd = [sys.executable, "-m", "localspec", "generate", args.prompt, "--json", "--temperature", "0",
           "--no-warm-start", "--max-tokens", str(args.max_tokens), *args.extra]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if r.returncode != 0:
        raise SystemExit(f"error: generate failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout)


def start_hogs(n: int) -> list[subprocess.Popen]:
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]
    time.sleep(0.5 if n else 0.0)   # past the interpreters' start-up: a hog is a busy core by then
    return hogs


def stop(hogs: list[subprocess.Popen]) -> None:
    for h in hogs:
        h.kill()
    for h in hogs:
        h.wait()


def label(threads: int | None) -> str:
    return "default" if threads is None else f"--threads {threads}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--loads", type=int, nargs="+", default=[0, 1, 2], help="CPU hogs to run at each load")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="explicit --threads to compare")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one generate may take")
    p.add_argument("extra", nargs="*", help="more generate options, after --")
    args = p.parse_args()
    # A stopped run (Ctrl-C, `timeout`) must still kill its hogs: SIGTERM unwinds like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    settings: list[int | None] = [None, *args.threads]
    speed: dict[tuple[int, int | None], list[float]] = {}
    chosen: dict[int, set[int]] = {}
    for r in range(args.rounds):
        for load in args.loads:
            hogs = start_hogs(load)
            try:
                shift = (r + load) % len(settings)
                for threads in settings[shift:] + settings[:shift]:
                    out = generate(args, threads)
                    speed.setdefault((load, threads), []).append(out["tokens_per_second"])
                    if threads is None and out.get("threads") is not None:
                        chosen.setdefault(load, set()).add(out["threads"])
                    print(f"round {r + 1} · {load} hog(s) · {label(threads)}: "
                          f"{out['tokens_per_second']:.1f} tokens/s", file=sys.stderr, flush=True)
            finally:
                stop(hogs)
    med = {key: statistics.median(v) for key, v in speed.items()}
    head = ["CPU hogs (cores kept busy)", *map(label, settings), "default chose", "default / best explicit"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for load in args.loads:
        best = max(med[(load, t)] for t in args.threads)
        picks = ", ".join(f"{n} thread{'s' if n != 1 else ''}" for n in sorted(chosen.get(load, ()))) or "?"
        cells = [f"{med[(load, t)]:.1f}" for t in settings]
        print(f"| {load} | " + " | ".join(cells) + f" | {picks} | {med[(load, None)] / best:.2f}× |")
    print(f"\ntokens/s, median of {args.rounds} interleaved rounds; generate --max-tokens {args.max_tokens} "
          f"--temperature 0 --no-warm-start {' '.join(args.extra)}".rstrip())


if __name__ == "__main__":
    main()
