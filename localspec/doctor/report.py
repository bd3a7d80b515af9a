"""`localspec doctor`'s report as text: one line per finding, from what `doctor.diagnose` returns."""

from __future__ import annotations

import os

from .calibrate import VERIFY_SIZES


def _size(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _warm_line(w: dict) -> str:
    """What the controller will start from on this pair (see localspec.loading.warmstart)."""
    if not w["enabled"]:
        return "off (LOCALSPEC_NO_WARM_START is set)"
    done = "".join(f"deleted {p}; " for p in w["forgotten"])
    if w.get("not_saved"):   # doctor.diagnose: the calibration ran on a loaded machine
        done += (f"this calibration was not saved ({w['not_saved']} while it ran: rerun when the machine "
                 "is quiet, or pass --save-anyway); ")
    if not w["usable"]:
        why = "unusable (stale, foreign or corrupt: it will be replaced)" if w["exists"] else "none yet"
        return f"{done}{why}: runs on this pair start from nothing · {w['path']}"
    parts = []
    for name, d in w["drafters"].items():
        alpha = " ".join(f"{b} {a['alpha']:.2f}" for b, a in d.get("alpha", {}).items())
        cost = f", draft {d['draft_cost'] * 1e3:.2f} ms/token" if d.get("draft_cost") is not None else ""
        decided = "; ".join(_decided(b, x) for b, x in (w.get("decisions") or {}).get(name, {}).items())
        parts.append(f"{name}: α {alpha or '—'}{cost}" + (f" → {decided}" if decided else ""))
    verify = w["verify"]
    v1 = f"verify b=1 {verify['1'] * 1e3:.1f} ms · " if "1" in verify else ""
    saved = " (just written by this calibration)" if w["saved"] else ""
    worth = ""
    if w.get("weight") is not None:
        worth = f", weight {w['weight']:.2f}" + (f" (written {w['written_weight']:.2f})"
                                                   if abs(w["written_weight"] - w["weight"]) >= 0.005 else "")
    return (f"{done}{w['age_days']:.1f} days old{worth}{saved}: {v1}{'; '.join(parts) or 'no drafter data'} · "
            f"{w['path']} (`doctor --forget` deletes it; --no-warm-start ignores it)")


def _decided(band: str, d: dict) -> str:
    """What a run in this band starts with (warmstart.decision); a plain start is re-tested soon."""
    if d["k"] is None:
        return f"{band}: nothing to decide on"
    if d["k"] == 0:
        best = f" (best {d['speedup']:.2f}× plain)" if d["speedup"] is not None else ""
        return f"{band} starts plain{best}, re-tested after {d['retest_after']} plain steps"
    return f"{band} starts at k={d['k']} ({d['speedup']:.2f}× plain)"


def _threads_line(t: dict) -> str:
    """How many threads the models ran with, and why (localspec.machine.choose_threads)."""
    other = t["other_cores"]
    busy = (f"{t['cpus']} CPUs, other work unmeasured" if other is None
            else f"other work kept {other:.1f} of the {t['cpus']} CPUs busy at the start")
    why = "--threads" if t["requested"] is not None else "the default for the cores free now"
    line = f"{t['threads']} ({why}: {busy})"
    return line + (f" · warning: {t['warning']}" if t.get("warning") else "")


def _extra_buffers_line(x: dict) -> str:
    """Which extra CPU weight buffers (AMX, repacked layouts) models load with, and why."""
    offered = ", ".join(x["offered"]) or "none"
    use = "on" if x["use"] else "OFF"
    when = f", checked {x['checked']}" if x.get("checked") else ""
    return f"extra CPU buffers: {use} (offered: {offered}; AMX listed by the CPU: " \
           f"{'yes' if x['amx_listed'] else 'no'}; {x['detail']}{when})"


def format_report(r: dict) -> str:
    b, lines = r["build"], []
    add = lines.append
    gpu = ("yes (" + ", ".join(b["gpu_backends"] or ["?"]) + ")") if b["gpu_offload"] else "no (CPU-only build)"
    add(f"build        llama-cpp-python {b['llama_cpp_python']} · GPU offload: {gpu} · backends: "
        f"{', '.join(b['backends']) or '?'}")
    devices = r.get("devices") or [g | {"type": "gpu"} for g in b["gpus"]]
    for d in devices:   # every device: local ones, and the RPC workers' (named by their address)
        what = f"RPC worker {d['description']}" if d.get("backend") == "RPC" else d.get("description") or ""
        add(f"             {d.get('type', 'gpu').upper():<4} {d.get('name', '?')} {what}: "
            f"{_size(d.get('memory_free'))} free of {_size(d.get('memory_total'))}")
    placed = {role: p for role, p in (r.get("placement") or {}).items() if p}
    for role, p in placed.items():
        add(f"             {role}: " + " · ".join(f"{k.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}"
                                           for k, v in p.items()))
    add(f"             CPU features: {' '.join(b['cpu_features']) or '-'}")
    if b.get("extra_buffers"):
        add("             " + _extra_buffers_line(b["extra_buffers"]))
    if r.get("thread_choice"):
        add("threads      " + _threads_line(r["thread_choice"]))
    for role, m in r["models"].items():
        if m:
            offload = "" if not b["gpu_offload"] else f" · gpu layers {'all' if m['gpu_layers'] < 0 else m['gpu_layers']}"
            kv = max(m["n_head_kv"]) if isinstance(m["n_head_kv"], list) else m["n_head_kv"]
            add(f"{role:<12} {os.path.basename(m['path'])} · {m['arch']} · {m['n_params'] / 1e6:.0f}M params · "
                f"{m['n_layer']} layers · {kv} KV heads × {m['key_length']} · {_size(m['size_bytes'])}{offload}")
    v = r["vocab"]
    if v:
        sp = v["special"]
        n = v["n_vocab"]
        size = f"{n['target']} tokens" if n["target"] == n["draft"] else f"{n['target']} (draft {n['draft']}) ids"
        detail = (f"{size}, BOS/EOS/EOT {sp['bos']['target']}/{sp['eos']['target']}/"
                  f"{sp['eot']['target']}, token texts identical" if v["compatible"] else "; ".join(v["problems"]))
        add(f"vocab        {v['verdict']}: {detail}")
    mem = r["memory"]
    parts = [f"{role} {_size(x['weights_bytes'])} + KV {_size(x['kv_bytes'])}" for role, x in mem["models"].items()]
    where = (f"RAM {_size(mem['ram_bytes'])}" + (f", GPU {_size(mem['gpu_bytes'])}" if mem["gpu_bytes"] else "")
             + (f", RPC workers {_size(mem['workers_bytes'])}" if mem.get("workers_bytes") else ""))
    if mem.get("kv_type", "f16/f16") not in ("f16", "f16/f16"):
        where += f"; KV {mem['kv_type']}"
    have = mem["ram"]["available"] or mem["ram"]["total"]
    add(f"memory       n_ctx {mem['n_ctx']}: {'; '.join(parts)} → {_size(mem['total_bytes'])} ({where}); "
        f"{_size(have)} RAM available → {mem['verdict']}")
    for note in mem["notes"]:
        add(f"             note: {note}")
    c = r["calibration"]
    if c:
        vc = c["verify_cost"]
        add(f"calibration  {c['seconds']:.1f} s at T={c['sampling']['temperature']:g}, k={c['k']}; verify "
            + " · ".join(f"b={k} {t * 1e3:.1f} ms" for k, t in vc.items() if int(k) in VERIFY_SIZES))
        tps = c["plain"]["tokens_per_second"]
        add(f"  plain      {tps:.1f} tokens/s measured" if tps else "  plain      not measured")
        for name, d in c["drafters"].items():
            if d["alpha"] is None:
                add(f"  {name:<10} no draft tokens in {d['steps']} steps")
                continue
            cov = f" · drafts on {d['coverage']:.0%} of steps" if d["coverage"] < 0.999 else ""
            meas = f" · measured {d['measured_speedup']:.2f}× at k={c['k']}" if d["measured_speedup"] else ""
            best = (f"best k {d['best_k']} → predicted {d['predicted_speedup']:.2f}×" if d["best_k"]
                    else f"no k pays (k=1 → {d['predicted_speedup_by_k'][1]:.2f}×)")
            # α as measured, per tested position (the predictions shrink it toward a prior worth
            # two trials); draft efficiency per drafted token, lower: untested positions count
            sample = f"{d['n_tested']} tested of {d['n_drafted']} drafted, draft efficiency {d['draft_efficiency']:.2f}"
            add(f"  {name:<10} α {d['alpha']:.2f} ({sample}){cov} · draft "
                f"{d['draft_cost'] * 1e3:.2f} ms/token{meas} · {best}")
        for name, why in c.get("skipped", {}).items():
            add(f"  {name:<10} skipped: {why}")
        m = c.get("machine")
        if m:   # the busy case is one of the warnings below
            other = "" if m["other_cores"] is None else f", other work {m['other_cores']:.1f} cores"
            threads = f"{m['threads']} thread{'s' if m['threads'] != 1 else ''}"
            add(f"  machine    while calibrating: its {threads} got {m['cpu_share']:.0%} of their cores{other}")
        for w in c.get("warnings", []):
            add(f"  warning: {w}")
        if not b["gpu_offload"] and vc.get("8") and vc.get("1") and vc["8"] > 2 * vc["1"]:
            add(f"  note: verifying 8 tokens costs {vc['8'] / vc['1']:.1f}× one token on this CPU; a GPU's batch "
                "is flatter (an H200: 1.6-2.6× one steady decode step for 1 to 64 tokens)")
    w = r.get("warm_start")
    if w:
        add("warm start   " + _warm_line(w))
    rec = r["recommendation"]
    flags = rec.get("flags")
    hedge = " (low confidence: see the warnings)" if c and not rec.get("confident") else ""
    add(f"recommend    {flags + ' — ' if flags else ''}{rec['reason']}{hedge}")
    if c:   # why `bench` can measure more: it runs what generate runs, doctor a few seconds of each part
        add("             (from each drafter alone, as chains, for a few seconds; `localspec bench` runs auto and "
            "draft trees over its prompts, and can measure more)")
    if rec.get("for_editing"):
        e = rec["for_editing"]
        add(f"             for editing (output repeats the prompt): {e['flags']} — predicted "
            f"{e['predicted_speedup']:.2f}×")
    return "\n".join(lines)
