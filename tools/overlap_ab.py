"""Drafting while the target verifies, on and off, in one interleaved run over an RPC target.

    python tools/overlap_ab.py HOST:PORT THREADS ROUNDS

Per round and prompt (4 chat prompts, greedy, 128 tokens): plain, the draft model and auto, each
without drafting ahead (`DecodeConfig.overlap=False`) and as a run decides it (None: on where the
target's first passes leave a core free, `decoding.overlap.Judge`); one controller per arm across
prompts, as `bench` keeps one per suite. Prints tokens/s, the ratio to plain, and how many texts
equal plain's. The worker: `localspec worker`, behind `tools/latency_proxy.py` for added latency.
"""

from __future__ import annotations

import sys
import time

from localspec.config import DecodeConfig, ModelConfig, SamplingConfig, Placement
from localspec.engine import Model, connect_workers
from localspec.decoding.decoder import generate_steps
from localspec.decoding.model_drafter import ModelDrafter
from localspec.decoding.auto import AutoDrafter
from localspec.decoding.controller import KController
from localspec.loading.defaults import default_draft_path, default_target_path

PROMPTS = ["Tell me about lighthouses.", "Write a Python function that reverses a string.",
           "How do I make a cup of tea?", "Explain what a binary search does."]


def main() -> None:
    ep, threads, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    connect_workers((ep,))
    T = Model(ModelConfig(str(default_target_path()), 2048, threads, placement=Placement(rpc=(ep,))))
    D = Model(ModelConfig(str(default_draft_path()), 2048, threads))
    G = SamplingConfig(temperature=0.0)
    arms = {"plain": (None, False), "model": ("model", False), "model+ov": ("model", None), "auto": ("auto", False), "auto+ov": ("auto", None)}
    tot = {a: [0, 0.0] for a in arms}
    same = {a: 0 for a in arms}
    ctl = {a: KController(12) for a in arms}   # one controller per arm across prompts (as bench's suite scope)
    for _ in range(rounds):
        for text in PROMPTS:
            p = T.chat_prompt([{"role": "user", "content": text}])
            ref = None
            for a, (kind, ov) in arms.items():
                d = None if kind is None else ModelDrafter(D) if kind == "model" else AutoDrafter(ModelDrafter(D))
                t0 = time.perf_counter()
                steps = list(generate_steps(T, d, p, G, DecodeConfig(max_tokens=128, overlap=ov), controller=ctl[a]))
                dt = time.perf_counter() - t0
                toks = [t for s in steps for t in s.tokens]
                ref = toks if ref is None else ref
                same[a] += toks == ref
                tot[a][0] += len(toks)
                tot[a][1] += dt
    print("threads", threads, "rounds", rounds)
    base = tot["plain"][0] / tot["plain"][1]
    for a in arms:
        tps = tot[a][0] / tot[a][1]
        print(f"{a:9s} {tps:6.1f} t/s  {tps/base:.2f}x  same-as-plain {same[a]}/{rounds*len(PROMPTS)}")


if __name__ == "__main__":
    main()
