"""`localspec bench`'s report: per-group summaries of the runs, the analytic bound, and the table.

`bench.run_bench` runs the suite and hands its runs here; nothing here times or loads anything.
Runs are `bench.Run` records (variant, prompt, repeat, tokens, steps, timings), read by field.
"""

from __future__ import annotations

import textwrap

from importlib import metadata

import numpy as np

from localspec.decoding.controller import expected_tokens
from localspec.decoding.stats import RunStats, positions_tested, served
from localspec.loading.controllers import k_max_for

TREE_SUFFIX = "+tree"
"""A tree variant's key: its chain twin's key and this (`auto+tree`, `model:4+tree`, `2+tree`)."""


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _local_summary(runs: list) -> dict:
    st = RunStats.of(s for run in runs for s in run.steps)
    decode = sum(r.decode for r in runs)
    prefill = sum(r.prefill for r in runs)
    n_prompt = sum(r.n_prompt for r in runs)
    lat = st.latency_percentiles()
    return {
        "n_runs": len(runs),
        "n_tokens": st.n_tokens,
        "n_steps": st.n_steps,
        "decode_seconds": decode,
        "tokens_per_second": _ratio(st.n_tokens, decode),
        "tokens_per_pass": st.tokens_per_pass,
        "tokens_per_step": st.tokens_per_pass,   # the old name, kept one release
        "prefill_seconds": prefill,
        "n_prompt_tokens": n_prompt,
        "prefill_tokens_per_second": _ratio(n_prompt, prefill),
        "latency_ms": {q: None if t is None else 1000 * t for q, t in lat.items()},
        "time_split": {"draft": st.t_draft, "verify": st.t_verify, "python": st.t_python,
                       "outside": max(decode - st.seconds, 0.0)},
        "host": st.host(),
        "verify_ms_per_step": st.verify_ms_per_step,
        "plain_step_ms": st.plain_step_ms,
        "n_plain_steps": st.n_plain_steps,
        "_stats": st,
    }


def _bound(spec: list, plain: list, fixed_k: int | None, k_max: int) -> dict | None:
    """E(k)·t_plain / (k·t_draft + t_verify(k+1)) from this group's measurements. E(k) = 1 + Σ_{i≤k} s_i
    with s_i the measured share of drafted position i that was accepted (the controller's model);
    `speedup_iid` uses E(α,k) = (1 − α^(k+1)) / (1 − α) instead, which assumes independent
    positions, with α = accepted / tested positions (that formula's per-token probability).
    t_plain = mean plain target pass, t_draft per drafted token, t_verify(b) the mean at each
    measured batch size (interpolated between them, never extrapolated). A fixed k is evaluated at
    k (or the longest draft measured, if drafts were always shorter); "auto" at its best k."""
    t_plain = [s.t_verify for r in plain for s in r.steps]
    drafting = [s for r in spec for s in r.steps if s.n_drafted]
    n_drafted = sum(s.n_drafted for s in drafting)
    if not t_plain or not n_drafted:
        return None
    t1 = float(np.mean(t_plain))
    tested = sum(positions_tested(s.n_drafted, s.n_accepted) for s in drafting)
    alpha = sum(s.n_accepted for s in drafting) / tested
    t_draft = sum(s.t_draft for s in drafting) / n_drafted
    by_b: dict[int, list[float]] = {}
    reached = np.zeros(max(s.n_drafted for s in drafting))
    accepted = np.zeros_like(reached)
    for s in drafting:
        by_b.setdefault(s.n_drafted + 1, []).append(s.t_verify)
        reached[: s.n_drafted] += 1
        accepted[: s.n_accepted] += 1
    survive = accepted / reached
    xs = [1, *sorted(by_b)]
    ys = [t1, *(float(np.mean(by_b[b])) for b in xs[1:])]
    top = min(xs[-1] - 1, k_max)
    ks = [fixed_k if fixed_k in range(1, top + 1) else top] if fixed_k is not None else range(1, top + 1)
    best = None
    for k in ks:
        t_v = float(np.interp(k + 1, xs, ys))
        cost = (k * t_draft + t_v) / t1
        e = 1.0 + float(survive[:k].sum())
        if best is None or e / cost > best["speedup"]:
            best = {"speedup": e / cost, "speedup_iid": expected_tokens(alpha, k) / cost, "k": k,
                    "expected_tokens": e, "alpha": alpha, "t_plain_ms": 1000 * t1,
                    "t_draft_ms": 1000 * t_draft, "t_verify_ms": 1000 * t_v}
    return best


def _median_speedup(spec: list, plain: list) -> float | None:
    """Median over prompts (and repeats) of spec t/s ÷ plain t/s of the same prompt: unlike the
    ratio of totals, one run hit by a burst of other load barely moves it."""
    rate = lambda r: _ratio(len(r.tokens), r.decode)  # noqa: E731
    by = {(r.prompt, r.repeat): rate(r) for r in plain}
    pairs = [_ratio(rate(r), by.get((r.prompt, r.repeat))) for r in spec]
    pairs = [x for x in pairs if x is not None]
    return float(np.median(pairs)) if pairs else None


def _matches(runs: list, plain_by: dict, greedy: bool) -> float | None:
    """Fraction of runs whose output equals the plain run of the same prompt (temperature 0 only)."""
    pairs = [(r.tokens, plain_by.get((r.prompt, r.repeat))) for r in runs]
    pairs = [(a, b) for a, b in pairs if b is not None]
    if not greedy or not pairs:
        return None
    return sum(a == b for a, b in pairs) / len(pairs)


def group(runs: list, variants: list, members: set[int], greedy: bool) -> dict:
    mine = [r for r in runs if r.prompt in members]
    of = lambda v: [r for r in mine if r.variant == v]  # noqa: E731
    plain_runs = of(variants[0])
    plain_by = {(r.prompt, r.repeat): r.tokens for r in plain_runs}
    plain = _local_summary(plain_runs)
    spec: dict[str, dict] = {}
    for v in variants:
        if v.kind != "spec":
            continue
        s = _local_summary(of(v))
        st: RunStats = s["_stats"]
        s.update({
            "k": "auto" if v.k is None else v.k,
            "alpha": st.alpha,
            "draft_efficiency": st.draft_efficiency,
            "acceptance_by_position": st.acceptance_by_position(),
            "mean_accepted": st.mean_accepted,
            "mean_k": st.k_sum / st.n_steps if st.n_steps else None,
            "n_drafted": st.n_drafted,
            "n_accepted": st.n_accepted,
            "n_tested": st.n_tested,
            "drafting_step_fraction": _ratio(st.drafted_at[0] if st.drafted_at else 0, st.n_steps),
            "speedup": _ratio(s["tokens_per_second"], plain["tokens_per_second"]),
            "speedup_median": _median_speedup(of(v), plain_runs),
            "bound": _bound(of(v), plain_runs, v.k, k_max_for(v.k)),
            "greedy_match": _matches(of(v), plain_by, greedy),
            "drafters": st.drafters(),
            "accepted_from": dict(st.accepted_from),
            "tree": st.tree(v.tree),
            "chain": v.chain,
        })
        chain_runs = [r for r in mine if r.variant.kind == "spec" and r.variant.key == v.chain]
        s["against_chain"] = _against_chain(s, spec.get(v.chain), of(v), chain_runs)
        spec[v.key] = s
    reference = None
    if any(v.kind == "reference" for v in variants):
        reference = {}
        for v in variants:
            if v.kind != "reference":
                continue
            rr = of(v)
            n = sum(len(r.tokens) for r in rr)
            decode, prefill = sum(r.decode for r in rr), sum(r.prefill for r in rr)
            tps = _ratio(n, decode)
            reference[v.key] = {
                "n_runs": len(rr),
                "n_tokens": n,
                "decode_seconds": decode,
                "tokens_per_second": tps,
                "prefill_seconds": prefill,
                "lookup_tokens": v.k,
                "greedy_match": _matches(rr, plain_by, greedy),
                "localspec_speedup": {"plain": _ratio(plain["tokens_per_second"], tps),
                                      **{key: _ratio(x["tokens_per_second"], tps) for key, x in spec.items()}},
            }
    for s in (plain, *spec.values()):
        del s["_stats"]
    return {"n_prompts": len({r.prompt for r in plain_runs}), "plain": plain, "spec": spec, "reference": reference}


def _against_chain(s: dict, chain: dict | None, runs: list, chain_runs: list) -> dict | None:
    """A tree variant (`s`, its `runs`) against its chain twin, run beside it on the same prompts
    and seeds; None for a chain (`chain` None)."""
    if chain is None:
        return None
    return {
        "tokens_per_second": _ratio(s["tokens_per_second"], chain["tokens_per_second"]),
        "tokens_per_second_median": _median_speedup(runs, chain_runs),
        "tokens_per_pass": _ratio(s["tokens_per_pass"], chain["tokens_per_pass"]),
    }


def run_json(run, prompts: list) -> dict:
    alpha = efficiency = None
    if run.variant.kind == "spec":
        st = RunStats.of(run.steps)
        alpha, efficiency = st.alpha, st.draft_efficiency
    return {
        "prompt": run.prompt,
        "category": prompts[run.prompt].category,
        "repeat": run.repeat,
        "variant": run.variant.name,
        "n_prompt_tokens": run.n_prompt,
        "n_tokens": len(run.tokens),
        "n_steps": len(run.steps) if run.steps else None,
        "prefill_seconds": run.prefill,
        "decode_seconds": run.decode,
        "tokens_per_second": _ratio(len(run.tokens), run.decode),
        "alpha": alpha,
        "draft_efficiency": efficiency,
        "finish": run.finish,
    }


def _f(x, fmt: str = ".1f", none: str = "—") -> str:
    return none if x is None else format(x, fmt)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def _groups(report: dict):
    yield from report["categories"].items()
    yield "overall", report["overall"]


def format_report(report: dict) -> str:
    from pathlib import Path

    c = report["config"]
    name = lambda p: Path(p).name if p else "—"  # noqa: E731
    temp = "greedy (T=0)" if c["temperature"] == 0 else (
        f"T={c['temperature']:g} top-k {c['top_k']} top-p {c['top_p']:g} min-p {c['min_p']:g}")
    lines = [
        f"localspec bench · target {name(c['target'])} · draft {name(c['draft'])} · drafter {c['drafter']}",
        f"{temp} · seed {c['seed']} · max {c['max_tokens']} tokens · {c['n_prompts']} prompts × {c['repeat']} · "
        f"{c['threads']} thread{'' if c['threads'] == 1 else 's'} · {'chat template' if c['chat'] else 'raw prompts'}",
    ]
    lines += _verdict(report)
    for key in report["overall"]["spec"]:
        lines += ["", "speculative " + variant_label(key, c["drafter"], c.get("tree"))]
        rows = [["category", "n", "α", "tok/pass", "steps by", "plain t/s", "spec t/s", "speedup (median)",
                 "bound (k)"]]
        costs = [["category", "draft eff", "acc len", "p50/p99 ms", "draft/verify/py %", "verify ms/step", "host ms/step (/row)", "draft host ms/tok"]]
        for group, g in _groups(report):
            s, p = g["spec"][key], g["plain"]
            b = s["bound"]
            ts = s["time_split"]
            total = sum(ts.values()) or 1.0
            split = "/".join(f"{100 * ts[x] / total:.0f}" for x in ("draft", "verify")) + \
                f"/{100 * (ts['python'] + ts['outside']) / total:.0f}"
            lat = s["latency_ms"]
            rows.append([
                group, str(g["n_prompts"]), _f(s["alpha"], ".3f"), _f(s["tokens_per_pass"], ".2f"),
                served(s["drafters"]), _f(p["tokens_per_second"]), _f(s["tokens_per_second"]),
                f"{_f(s['speedup'], '.2f')}× ({_f(s['speedup_median'], '.2f')}×)",
                "—" if b is None else f"{b['speedup']:.2f}× ({b['k']})",
            ])
            costs.append([
                group, _f(s["draft_efficiency"], ".3f"), _f(s["mean_accepted"], ".2f"),
                f"{_f(lat['p50'])}/{_f(lat['p99'])}", split, _f(s["verify_ms_per_step"], ".2f"),
                f"{_f(s['host']['target_ms_per_step'], '.2f')} ({_f(s['host']['target_ms_per_row'], '.3f')})",
                _f(s["host"]["draft_ms_per_token"], ".3f"),
            ])
        lines += _table(rows) + [""] + _table(costs)
        o = report["overall"]
        s = o["spec"][key]
        lines.append("acceptance by position: " + (" ".join(f"{a:.2f}" for a in s["acceptance_by_position"]) or "—"))
        match = "" if s["greedy_match"] is None else f" · identical to plain: {100 * s['greedy_match']:.0f}% of runs"
        lines.append(f"plain step: {_f(o['plain']['plain_step_ms'], '.2f')} ms in plain runs (host "
                     f"{_f(o['plain']['host']['target_ms_per_step'], '.2f')} ms), "
                     f"{_f(s['plain_step_ms'], '.2f')} ms when the speculative path decodes plainly "
                     f"({s['n_plain_steps']} of {s['n_steps']} steps)")
        lines.append(f"mean k {_f(s['mean_k'], '.2f')} · plain p50/p99 {_f(o['plain']['latency_ms']['p50'])}/"
                     f"{_f(o['plain']['latency_ms']['p99'])} ms · prefill {_prefill(o['plain'])} plain, "
                     f"{_prefill(s)} spec{match}")
    lines += _auto_table(report)
    lines += _tree_table(report)
    ref = report["overall"]["reference"]
    if ref:
        lines += ["", f"llama-cpp-python (Llama.generate, same GGUF and threads; lookup = LlamaPromptLookupDecoding, "
                      f"num_pred_tokens {c['reference_lookup_tokens']})"]
        keys = list(report["overall"]["spec"])
        head = ["category", "lcp t/s", "lcp+lookup t/s", "localspec plain t/s"]
        for key in keys:
            head += [f"k={key} t/s", "× lcp", "× lcp+lookup"]
        rows = [head]
        for group, g in _groups(report):
            r = g["reference"]
            row = [group, _f(r["plain"]["tokens_per_second"]), _f(r["lookup"]["tokens_per_second"]),
                   _f(g["plain"]["tokens_per_second"])]
            for key in keys:
                row += [_f(g["spec"][key]["tokens_per_second"]),
                        _f(r["plain"]["localspec_speedup"][key], ".2f") + "×",
                        _f(r["lookup"]["localspec_speedup"][key], ".2f") + "×"]
            rows.append(row)
        lines += _table(rows)
    notes = ["α = accepted / tested draft positions (a step tests up to its first rejection), the per-token "
             "acceptance of E(α, k); draft eff = accepted / drafted, lower because positions after a rejection are "
             "drafted but never tested.",
             "steps by: share of target passes whose draft came from M (draft model), L (prompt lookup), X (lookup "
             "extended by the model), P (none: plain).",
             "t/s = generated tokens / decode seconds (prefill excluded); speedup = spec t/s ÷ plain t/s in this run "
             "(median: of the per-prompt ratios); bound = E(k)·t_plain / (k·t_draft + t_verify(k+1)) from the "
             "measured acceptance and costs."]
    lines += [""] + [line for note in notes for line in textwrap.wrap(note, WIDTH)]
    return "\n".join(lines)


WIDTH = 118   # the prose fits a 120-column terminal (and the tables do, two per variant)


def variant_label(key: str, drafter: str, tree: str | None = None) -> str:
    if key.endswith(TREE_SUFFIX):   # a tree variant: its chain twin's label, and the tree setting
        return f"{variant_label(key.removesuffix(TREE_SUFFIX), drafter)} · tree {tree}"
    if drafter == "auto":   # keys are "model", "lookup", "auto", or those with ":k"
        name, _, k = key.partition(":")
        return f"{name}, k={k or 'auto'}" + ("" if k else " (adaptive, one controller across the suite)")
    return f"k={key}" + (" (adaptive, one controller across the suite)" if key == "auto" else "")


def _auto_table(report: dict) -> list[str]:
    """auto against each drafter alone, per category: the comparison that says whether the
    per-step choice pays."""
    keys = report["overall"]["spec"]
    pairs = [(k, k.replace("auto", "model"), k.replace("auto", "lookup")) for k in keys
             if k.partition(":")[0] == "auto"]
    lines: list[str] = []
    for auto, model, lookup in pairs:
        if model not in keys or lookup not in keys:
            continue
        # "× best single" alone reads as a win when every speculative variant lost to plain
        # decoding: "× plain" stands next to it.
        rows = [["category", "plain t/s", "model t/s", "lookup t/s", "auto t/s", "× best single", "× plain",
                 "× model", "auto steps by"]]
        for group, g in _groups(report):
            a, m, lk = g["spec"][auto], g["spec"][model], g["spec"][lookup]
            best = max(m["tokens_per_second"] or 0.0, lk["tokens_per_second"] or 0.0)
            rows.append([group, _f(g["plain"]["tokens_per_second"]), _f(m["tokens_per_second"]),
                         _f(lk["tokens_per_second"]), _f(a["tokens_per_second"]),
                         _f(_ratio(a["tokens_per_second"], best), ".2f") + "×", _f(a["speedup"], ".2f") + "×",
                         _f(_ratio(a["tokens_per_second"], m["tokens_per_second"]), ".2f") + "×",
                         served(a["drafters"])])
        lines += ["", f"auto against each drafter alone ({auto})"] + _table(rows)
    return lines


def _tree_table(report: dict) -> list[str]:
    """Each tree variant against its chain twin, per category: whether the trees paid."""
    lines: list[str] = []
    for key, s in report["overall"]["spec"].items():
        chain = s.get("chain")
        if chain is None:
            continue
        rows = [["category", "chain t/s", "tree t/s", "× chain (median)", "chain tok/pass", "tree tok/pass",
                 "× chain", "tree steps", "nodes/verify", "accepted depth"]]
        for group, g in _groups(report):
            t, ch = g["spec"][key], g["spec"][chain]
            vs, tr = t["against_chain"], t["tree"]
            if not tr["tree_steps"]:   # no step verified a tree: nothing behind a tree-vs-chain ratio
                rows.append([group, _f(ch["tokens_per_second"]), _f(t["tokens_per_second"]), "—",
                             _f(ch["tokens_per_pass"], ".2f"), _f(t["tokens_per_pass"], ".2f"), "—",
                             f"0/{t['n_steps']}", "—", "—"])
                continue
            rows.append([group, _f(ch["tokens_per_second"]), _f(t["tokens_per_second"]),
                         f"{_f(vs['tokens_per_second'], '.2f')}× ({_f(vs['tokens_per_second_median'], '.2f')}×)",
                         _f(ch["tokens_per_pass"], ".2f"), _f(t["tokens_per_pass"], ".2f"),
                         _f(vs["tokens_per_pass"], ".2f") + "×", f"{tr['tree_steps']}/{t['n_steps']}",
                         _f(tr["mean_nodes"], ".1f"), _f(tr["mean_accepted_depth"], ".2f")])
        ranks = " ".join(_f(a, ".2f") for a in s["tree"]["acceptance_by_rank"]) or "—"
        lines += ["", f"tree against chain ({key} against {chain}; tree steps = steps that verified more than "
                      "one branch, nodes and accepted depth over those)"] + _table(rows)
        lines.append(f"acceptance by sibling rank (0 = first choice): {ranks}")
    return lines


def _verdict(report: dict) -> list[str]:
    """The report's lead: the best variant against plain overall, then the others; when every one was
    slower, one plain line naming them all (the ratios are easy to misread where speculation loses)."""
    drafter = report["config"]["drafter"]
    ran = [(s["speedup"], key if drafter == "auto" else f"{drafter} k={key}")
           for key, s in report["overall"]["spec"].items() if s["speedup"] is not None]
    if ran and max(ran)[0] < 1:
        listed = ", ".join(f"{name} {x:.2f}× plain" for x, name in ran)
        return ["", f"speculation lost: {listed} (overall tokens/s: plain decoding was faster in this run)"]
    if not ran:
        return []
    (best, name), *rest = sorted(ran, key=lambda r: -r[0])
    others = "; then " + ", ".join(f"{n} {x:.2f}×" for x, n in rest) if rest else ""
    return ["", f"best: {name} {best:.2f}× plain decoding (overall tokens/s){others}"]


def _prefill(s: dict) -> str:
    n = s["n_runs"]
    return "—" if not n else f"{1000 * s['prefill_seconds'] / n:.0f} ms/prompt"
