"""Host milliseconds per step with a grammar: `python tools/grammar_host.py [smollm2|gemma]`.

Plain and speculative (the session's drafter) generations of the bench's json prompts, each
unconstrained and under its schema, at T = 0, at the default sampling (T = 0.8, top-k 40, top-p
0.95, min-p 0.05) and untruncated (T = 1, top-k 0, top-p 1, min-p 0: every id asked); prints the
target-side host ms per step and per verified row, and the draft side's per drafted token.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from localspec.bench.run import load_prompts
from localspec.config import DecodeConfig, SamplingConfig
from localspec.decoding.decoder import generate_steps
from localspec.decoding.stats import RunStats
from localspec.engine.grammar import schema_grammar
from localspec.loading import defaults
from localspec.loading.session import LoadConfig, Session

CONFIGS = {"T=0": SamplingConfig(temperature=0.0), "default": SamplingConfig(),
           "untruncated": SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)}


def main(which: str = "smollm2", max_tokens: int = 96) -> None:
    if which == "gemma":
        t, d = defaults.gemma_target_path(), defaults.gemma_draft_path()
    else:
        t, d = defaults.default_target_path(), defaults.default_draft_path()
    s = Session.load(LoadConfig(str(t), str(d), "auto", n_ctx=1024, threads=2))
    prompts = [p for p in load_prompts() if p.schema]
    chat = s.chat_or_raw(True, print)
    print(f"{which}: {s.target.n_vocab} ids; ms: target host per step / per verified row, draft host per drafted token")
    for name, base in CONFIGS.items():
        for drafter in (None, "auto"):
            for constrained in (False, True):
                st = RunStats()
                for i, p in enumerate(prompts):
                    cfg = replace(base, seed=i, grammar=schema_grammar(p.schema) if constrained else "")
                    s.target.reset()
                    steps = generate_steps(s.target, s.make_drafter(drafter) if drafter else None,
                                           s.prompt_tokens(p.prompt, chat), cfg, DecodeConfig(max_tokens=max_tokens))
                    for step in steps:
                        st.add(step)
                h = st.host()
                f = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
                print(f"{name:12} {drafter or 'plain':6} {'schema' if constrained else 'free':6} "
                      f"{f(h['target_ms_per_step'])} / {f(h['target_ms_per_row'])} / {f(h['draft_ms_per_token'])}"
                      f"  ({st.n_tokens} tokens, {st.n_steps} steps, α {f(st.alpha)})")
    s.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", nargs="?", default="smollm2", choices=("smollm2", "gemma"),
                    help="the built-in pair to measure (default smollm2)")
    main(ap.parse_args().which)
