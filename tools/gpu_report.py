"""report.md of the device check (tools/gpu_check.sh) from the files its run left in OUT:
steps.tsv, log.txt, llama-bench.json, gpu_bench.json, concurrency.json.

    python tools/gpu_report.py OUT > OUT/report.md
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _f(x, fmt="{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def steps(out: Path) -> list[str]:
    lines = ["| step | rc | seconds |", "|---|---|---|"]
    for row in (out / "steps.tsv").read_text().splitlines() if (out / "steps.tsv").exists() else []:
        name, rc, secs = (row.split("\t") + ["", ""])[:3]
        lines.append(f"| {name} | {rc} | {secs} |")
    return lines


def crashes(out: Path) -> list[str]:
    """The end of the output of every localspec step that failed (a crash's stack among it)."""
    log = (out / "log.txt").read_text(errors="replace") if (out / "log.txt").exists() else ""
    failed = [r.split("\t")[0] for r in (out / "steps.tsv").read_text().splitlines()
              if r.split("\t")[1] not in ("0", "skipped")] if (out / "steps.tsv").exists() else []
    lines = []
    for name in failed:
        m = re.search(rf"BEGIN {re.escape(name)} .*?\n(.*?)\[\d+s\] END {re.escape(name)}", log, re.S)
        if m:
            tail = m.group(1).strip().splitlines()[-40:]
            lines += [f"**{name}** (last lines):", "```", *tail, "```", ""]
    return lines


def cost_curve(out: Path) -> list[str]:
    data = _load(out / "llama-bench.json")
    if not data:
        return ["(no llama-bench results)"]
    by_model: dict = {}
    for r in data:
        key = (Path(r.get("model_filename", "?")).name, r.get("n_depth", 0))
        m = by_model.setdefault(key, {})
        if r.get("n_gen"):
            m["tg"] = 1e3 / r["avg_ts"]
        elif r.get("n_prompt"):
            m[r["n_prompt"]] = 1e3 * r["n_prompt"] / r["avg_ts"]
    sizes = sorted({n for m in by_model.values() for n in m if n != "tg"})
    lines = ["| model | depth | tg step ms | tg t/s | " + " | ".join(f"{n} rows" for n in sizes) + " |",
             "|---|---|---|---|" + "---|" * len(sizes)]
    for (name, depth), m in sorted(by_model.items()):
        tg = m.get("tg")
        cells = [_f(m[n] / tg, "{:.2f}×") if tg and n in m else "—" for n in sizes]
        lines.append(f"| {name} | {depth} | {_f(tg)} | {_f(1e3 / tg if tg else None, '{:.1f}')} | " + " | ".join(cells) + " |")
    return lines


def tg_rate(out: Path, name: str, depth: int = 0) -> float | None:
    for r in _load(out / "llama-bench.json") or []:
        if Path(r.get("model_filename", "")).name == name and r.get("n_gen") and r.get("n_depth", 0) == depth:
            return r["avg_ts"]
    return None


def bench(out: Path) -> list[str]:
    data = _load(out / "gpu_bench.json")
    if not data:
        return ["(no gpu_bench results)"]
    lines = []
    if data.get("plain"):
        lines += [f"Plain decoding, {data['tokens']} tokens, {data['rounds']} rounds (medians):", "",
                  "| model | sampling | localspec t/s | Llama.generate t/s | × Llama.generate | llama-bench tg t/s (depth 0) | × tg |",
                  "|---|---|---|---|---|---|---|"]
        for name, rows in data["plain"].items():
            tg = tg_rate(out, name)
            for s, r in rows.items():
                lines.append(f"| {name} | {s} | {r['localspec_tps']:.1f} | {r['llama_generate_tps']:.1f} | "
                             f"{r['ratio']:.3f} | {_f(tg, '{:.1f}')} | {_f(r['localspec_tps'] / tg if tg else None, '{:.3f}')} |")
        lines.append("")
    if data.get("decode_curve"):
        lines += ["One decode of n rows (all logits) at depth 512, ms: repeated / alternating with 1-row decodes:", "",
                  "| model | " + " | ".join(f"{n}" for n in next(iter(data["decode_curve"].values()))) + " |",
                  "|---|" + "---|" * len(next(iter(data["decode_curve"].values())))]
        for name, curve in data["decode_curve"].items():
            lines.append(f"| {name} | " + " | ".join(f"{c['steady_ms']:.2f} / {c['alternating_ms']:.2f}"
                                                     for c in curve.values()) + " |")
        lines.append("")
    if data.get("speculation"):
        lines += ["Speculation on the target (k auto, one controller per variant; same rounds as plain):", "",
                  "| sampling | draft | tree | stable shapes | t/s | × plain | α | tokens/pass | mean k | verify ms/step | padded rows | tree steps | greedy = plain |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for key, r in data["speculation"].items():
            s, draft, tree, shapes = key.split(" ")
            greedy = f"{r['greedy_equal']}/{r['greedy_runs']}" if "greedy_runs" in r else ""
            if r.get("divergences"):
                greedy += " (gaps " + ", ".join(f"{d['gap']:.3f}@{d['at']}" for d in r["divergences"]) + ")"
            lines.append(f"| {s} | {draft} | {tree.split('=')[1]} | {shapes.split('=')[1]} | {r['tps']:.1f} | "
                         f"{r['vs_plain']:.2f} | {_f(r['alpha'])} | {_f(r['tokens_per_pass'])} | {_f(r.get('mean_k'))} | "
                         f"{_f(r['verify_ms_per_step'])} | {r['padded_rows']} | {r.get('tree_steps', '')} | {greedy} |")
    return lines


def concurrency(out: Path) -> list[str]:
    data = _load(out / "concurrency.json")
    if not data:
        return ["(no concurrency results)"]
    lines = ["| level | variant | tokens/s | speedup | α | tokens/pass | itl p50 ms |", "|---|---|---|---|---|---|---|"]
    for level, variants in data.get("levels", {}).items():
        for name, v in variants.items():
            lines.append(f"| {level} | {name} | {_f(v.get('tokens_per_second'), '{:.1f}')} | {_f(v.get('speedup'))} | "
                         f"{_f(v.get('alpha'))} | {_f(v.get('tokens_per_pass'))} | {_f((v.get('itl_ms') or {}).get('p50'), '{:.1f}')} |")
    return lines


def peer(out: Path) -> list[str]:
    log = (out / "log.txt").read_text(errors="replace") if (out / "log.txt").exists() else ""
    m = re.search(r"BEGIN speculative-simple.*?\n(.*?)END speculative-simple", log, re.S)
    if not m:
        return ["(not run)"]
    keep = [ln for ln in m.group(1).splitlines() if re.search(r"decoded|speed|accept|n_draft|n_predict|t/s", ln)]
    return ["```", *keep[-12:], "```"]


def main(out: str) -> None:
    o = Path(out)
    head = (o / "log.txt").read_text(errors="replace").splitlines()[:1] if (o / "log.txt").exists() else []
    parts = ["# Device check", "", *head, "", "## Steps", "", *steps(o), "", *crashes(o),
             "## A verify of N rows against one steady decode step (llama-bench)", "", *cost_curve(o), "",
             "## localspec", "", *bench(o), "", "## Concurrency (bench --concurrency 1,4,16)", "", *concurrency(o), "",
             "## llama.cpp's llama-speculative-simple (k = 8, T = 0)", "", *peer(o), ""]
    print("\n".join(parts))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", metavar="OUT", help="the folder a run of tools/gpu_check.sh left its files in")
    main(ap.parse_args().out)
