"""`localspec doctor`: what this llama.cpp build can do, whether a target/draft pair works together,
whether it fits in memory, and — measured on this machine — whether speculation pays and with which
drafter and k.

Every section is a plain dict (the `--json` output); `format_report` renders the human version.
Nothing here raises on a bad pair: an incompatible vocabulary or a pair too big for memory is a
finding to report, not an error.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from contextlib import closing
from typing import Callable, Sequence

import numpy as np

from . import engine
from .config import DecodeConfig, SamplingConfig
from .controller import ALPHA_PRIOR, ALPHA_PRIOR_WEIGHT, KController, expected_tokens
from .decoder import generate_steps
from .drafters import ModelDrafter, PromptLookup

CAL_K = 4             # fixed draft length while measuring acceptance
K_MAX = 12            # largest k considered for the recommendation
VERIFY_SIZES = (1, 2, 4, 8)
MIN_SPEEDUP = 1.05    # below this, speculation is not worth it: recommend --drafter none
CAL_CTX = 1024        # context the models are loaded with (the memory estimate uses --n-ctx)
GPU_BACKENDS = {"cuda", "rocm", "hip", "metal", "mtl", "vulkan", "sycl", "opencl", "cann", "musa",
                "kompute", "webgpu", "cublas", "hipblas", "clblast"}

CHAT_PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Write a short story about a robot who learns to paint.",
    "Give five tips for staying focused when working from home.",
)
LOOKUP_PROMPT = """Rename the variable `total` to `running_sum` in this code. Reply with the whole updated code only.

```python
def summarize(values):
    total = 0
    count = 0
    for value in values:
        if value is None:
            continue
        total += value
        count += 1
    mean = total / count if count else 0.0
    print(f"total={total} count={count} mean={mean:.2f}")
    return total, count, mean
```"""


# ---------------------------------------------------------------- build

def parse_system_info(text: str) -> dict:
    """Backends and CPU features from llama_print_system_info().

    Current llama.cpp prints `NAME : KEY = VALUE | ...` per registered backend (`CUDA : ARCHS = 890 |
    ... | CPU : SSE3 = 1 | AVX = 1 | ...`); old builds printed only `KEY = VALUE |` pairs, with
    flags such as `CUDA = 1` among the CPU features."""
    backends: dict[str, dict[str, str]] = {}
    current = None
    for m in re.finditer(r"([\w.\-]+)\s+:\s|([\w.\-]+)\s*=\s*([^|]*?)\s*(?:\||$)", text):
        if m.group(1):
            current = m.group(1)
            backends.setdefault(current, {})
        else:
            backends.setdefault(current or "CPU", {})[m.group(2)] = m.group(3)
    names = list(backends)
    cpu = backends.get("CPU", {})
    for key, value in list(cpu.items()):  # old format: GPU flags among the features
        if key.lower() in GPU_BACKENDS and value == "1" and key not in names:
            names.append(key)
    return {
        "backends": names,
        "gpu_backends": [n for n in names if n.lower() in GPU_BACKENDS],
        "cpu_features": [k for k, v in cpu.items() if v == "1" and k.lower() not in GPU_BACKENDS],
        "features": backends,
    }


def build_info() -> dict:
    raw = engine.system_info()
    parsed = parse_system_info(raw)
    return {
        "llama_cpp_python": engine.library_version(),
        "gpu_offload": engine.gpu_offload_supported(),
        "backends": parsed["backends"],
        "gpu_backends": parsed["gpu_backends"],
        "cpu_features": parsed["cpu_features"],
        "system_info": raw,
        "gpus": gpu_devices(parsed["gpu_backends"]),
    }


def gpu_devices(gpu_backends: Sequence[str]) -> list[dict]:
    """GPU names and memory: from engine.backend_devices() when the engine offers it, else
    nvidia-smi for CUDA builds; [] when neither can tell."""
    lister = getattr(engine, "backend_devices", None)
    if lister is not None:
        return [d for d in lister() if d.get("type") in ("gpu", "igpu")]
    if "cuda" not in {b.lower() for b in gpu_backends} or not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.strip().splitlines():
        parts = [x.strip() for x in line.rsplit(",", 2)]
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            found.append({"name": parts[0], "memory_total": int(parts[1]) << 20, "memory_free": int(parts[2]) << 20})
    return found


# ---------------------------------------------------------------- vocabulary

def vocab_report(target, draft) -> dict:
    """Compare the two tokenizers in detail (session.check_vocab only says yes or no).

    Works on any objects with n_vocab, token_text(id), bos, eos and eot (meta(key) optional)."""
    def kind(m):
        return m.meta("tokenizer.ggml.model") if hasattr(m, "meta") else None

    n = min(target.n_vocab, draft.n_vocab)
    differ = [t for t in range(n) if target.token_text(t) != draft.token_text(t)]
    first = differ[0] if differ else (n if target.n_vocab != draft.n_vocab else None)
    special = {s: {"target": getattr(target, s), "draft": getattr(draft, s)} for s in ("bos", "eos", "eot")}
    problems = []
    if kind(target) != kind(draft):
        problems.append(f"tokenizer types differ ({kind(draft)} vs {kind(target)})")
    if target.n_vocab != draft.n_vocab:
        problems.append(f"sizes differ ({draft.n_vocab} vs {target.n_vocab} tokens)")
    problems += [f"{s.upper()} differs (id {v['draft']} vs {v['target']})" for s, v in special.items()
                 if v["target"] != v["draft"]]
    if differ:
        problems.append(f"{len(differ)} token texts differ, first at id {differ[0]}")
    return {
        "compatible": not problems,
        "verdict": "incompatible" if problems else "compatible",
        "n_vocab": {"target": target.n_vocab, "draft": draft.n_vocab},
        "tokenizer": {"target": kind(target), "draft": kind(draft)},
        "special": special,
        "n_differing": len(differ),
        "first_differing_id": first,
        "problems": problems,
    }


# ---------------------------------------------------------------- memory

def _int_or_layers(value: str | None) -> int | list[int] | None:
    if value is None:
        return None
    nums = [int(x) for x in re.findall(r"-?\d+", value)]
    if value.strip().startswith("[") and nums:
        return nums
    return nums[0] if len(nums) == 1 else None


def model_shape(model) -> dict:
    """Architecture numbers from the GGUF metadata ({arch}.block_count, head counts, dims)."""
    d = model.describe()
    arch = model.meta("general.architecture") or "unknown"
    get = lambda key: _int_or_layers(model.meta(f"{arch}.{key}"))  # noqa: E731
    n_layer = get("block_count") or d["n_layer"]
    n_embd = get("embedding_length") or d["n_embd"]
    n_head = get("attention.head_count")
    n_head = max(n_head) if isinstance(n_head, list) else n_head
    n_head_kv = get("attention.head_count_kv") or n_head
    head_dim = n_embd // n_head if n_head else None
    return {
        "path": d["path"], "name": d["name"], "arch": arch, "n_params": d["n_params"],
        "size_bytes": d["size_bytes"] or os.path.getsize(d["path"]), "n_vocab": d["n_vocab"],
        "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "n_head_kv": n_head_kv,
        "key_length": get("attention.key_length") or head_dim,
        "value_length": get("attention.value_length") or head_dim,
        "sliding_window": get("attention.sliding_window"),
        "recurrent": bool(getattr(model, "recurrent", False)),
    }


def kv_bytes(shape: dict, n_ctx: int, bytes_per_value: int = 2) -> int | None:
    """f16 K and V for every layer: sum over layers of n_ctx × n_head_kv × (key_len + value_len) × 2 B."""
    heads, dk, dv = shape["n_head_kv"], shape["key_length"], shape["value_length"]
    if not heads or not dk or not dv:
        return None
    per_layer = heads if isinstance(heads, list) else [heads] * shape["n_layer"]
    return sum(per_layer) * n_ctx * (dk + dv) * bytes_per_value


def system_memory() -> dict:
    """Total and available RAM in bytes (/proc/meminfo, else sysconf; available may be None)."""
    try:
        with open("/proc/meminfo") as f:
            info = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)}
        return {"total": info["MemTotal"], "available": info.get("MemAvailable")}
    except (OSError, KeyError, ValueError):
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = page * os.sysconf("SC_PHYS_PAGES")
        try:
            avail = page * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError):
            avail = None
        return {"total": total, "available": avail}
    except (ValueError, OSError, AttributeError):
        return {"total": None, "available": None}


def memory_report(shapes: dict[str, dict], n_ctx: int, gpu_layers: dict[str, int], build: dict,
                  ram: dict | None = None) -> dict:
    """Weights + KV per model at n_ctx, where they live (offloaded layers go to the GPU), and
    whether that fits. Compute buffers are not counted, so 'tight' already means trouble. `ram`
    should be read before the models were loaded (default: now)."""
    ram = ram or system_memory()
    out: dict = {"n_ctx": n_ctx, "kv_type": "f16", "models": {}, "ram": ram, "gpus": build["gpus"]}
    need = {"ram": 0, "gpu": 0}
    notes = []
    for role, s in shapes.items():
        kv = kv_bytes(s, n_ctx) or 0
        layers = gpu_layers.get(role, -1)
        share = 0.0 if not build["gpu_offload"] else 1.0 if layers < 0 else min(layers, s["n_layer"]) / s["n_layer"]
        total = s["size_bytes"] + kv
        need["gpu"] += int(share * total)
        need["ram"] += total - int(share * total)
        out["models"][role] = {"weights_bytes": s["size_bytes"], "kv_bytes": kv, "total_bytes": total,
                               "gpu_share": share}
        if s["sliding_window"]:
            notes.append(f"{role} uses sliding-window attention: its KV estimate is an upper bound")
    out["total_bytes"] = need["ram"] + need["gpu"]
    out["ram_bytes"], out["gpu_bytes"] = need["ram"], need["gpu"]
    verdicts = []
    avail = ram["available"] or ram["total"]
    if avail:
        verdicts.append(_fit(need["ram"], avail))
    if need["gpu"]:
        free = sum(g.get("memory_free") or 0 for g in build["gpus"])
        if free:
            verdicts.append(_fit(need["gpu"], free))
        elif "metal" in {b.lower() for b in build["gpu_backends"]} and avail:
            verdicts.append(_fit(need["gpu"] + need["ram"], 0.75 * ram["total"]))  # unified memory
        else:
            notes.append("GPU memory size unknown: check it with nvidia-smi or your OS")
    order = ["fits", "tight", "won't fit"]
    out["verdict"] = max(verdicts, key=order.index) if verdicts else "unknown"
    out["fits"] = out["verdict"] in ("fits", "tight")
    out["notes"] = notes
    return out


def _fit(need: float, have: float) -> str:
    return "won't fit" if need > have else "tight" if need > 0.8 * have else "fits"


# ---------------------------------------------------------------- calibration

def typical(xs: Sequence[float]) -> float:
    """The lower quartile of repeated timings: other processes only ever add time, and on a shared
    machine the median of a few runs mostly measures them."""
    return float(np.percentile(xs, 25))


def verify_curve(target, prompt: Sequence[int], seconds: float) -> dict[int, list[float]]:
    """Seconds of each target.eval of b tokens (all logits returned), b in VERIFY_SIZES, the sizes
    interleaved so that load changes hit them alike."""
    target.sync(list(prompt))
    base = len(target.tokens)
    block = (list(prompt) * 8)[:max(VERIFY_SIZES)]
    times: dict[int, list[float]] = {b: [] for b in VERIFY_SIZES}
    end = time.perf_counter() + seconds
    while min(len(t) for t in times.values()) < 2 or time.perf_counter() < end:
        for b in VERIFY_SIZES:
            t0 = time.perf_counter()
            target.eval(block[:b], logits_from=0)
            times[b].append(time.perf_counter() - t0)
            target.truncate(base)
        if min(len(t) for t in times.values()) >= 50:
            break
    return times


def run_drafter(target, drafter, prompts: Sequence[list[int]], sampling: SamplingConfig,
                seconds: float, k: int, min_steps: int = 3) -> list:
    """Steps of generate_steps at fixed k, cycling through the prompts until the time is up — but
    at least `min_steps` steps that drafted something (plain steps for k = 0), so a slow or busy
    machine still yields numbers (giving up after 4 × min_steps steps)."""
    steps: list = []
    end = time.perf_counter() + seconds
    rng = np.random.default_rng(0)

    def more() -> bool:
        if time.perf_counter() < end:
            return True
        useful = sum(1 for s in steps if s.n_drafted or not k)
        return useful < min_steps and len(steps) < 4 * min_steps

    for i in range(20):
        prompt = prompts[i % len(prompts)]
        decode = DecodeConfig(max_tokens=max(1, min(256, target.n_ctx - len(prompt) - 1)), k=k, k_max=max(k, 1))
        controller = KController(max(k, 1), fixed_k=k)
        with closing(generate_steps(target, drafter, prompt, sampling, decode, controller, rng)) as gen:
            for step in gen:
                steps.append(step)
                if not more():
                    break
        if not more():
            break
    return steps


def summarize_steps(steps: list) -> dict:
    """α (per-token acceptance; positions after a rejection count as untested), coverage (share
    of steps that drafted anything), draft seconds per token and measured tokens/s."""
    drafted = [s for s in steps if s.n_drafted]
    trials = sum(s.n_accepted + (s.n_accepted < s.n_drafted) for s in drafted)
    hits = sum(s.n_accepted for s in drafted)
    secs = sum(s.t_draft + s.t_verify + s.t_python for s in steps)
    per_tok = [s.t_draft / s.n_drafted for s in drafted[1:] or drafted]
    return {
        "steps": len(steps), "tokens": sum(len(s.tokens) for s in steps),
        "n_drafted": sum(s.n_drafted for s in drafted), "n_accepted": sum(s.n_accepted for s in drafted),
        # the controller's prior, worth two trials: a dozen lucky hits do not make α = 1
        "alpha": (hits + ALPHA_PRIOR * ALPHA_PRIOR_WEIGHT) / (trials + ALPHA_PRIOR_WEIGHT) if trials else None,
        "alpha_observed": hits / trials if trials else None,
        "accepted_ratio": (sum(s.n_accepted for s in drafted) / sum(s.n_drafted for s in drafted)
                           if drafted else None),
        "coverage": len(drafted) / len(steps) if steps else None,
        "draft_cost": typical(per_tok) if per_tok else None,
        "measured_tokens_per_second": sum(len(s.tokens) for s in steps) / secs if secs > 0 else None,
    }


def _curve(points: dict[int, float]) -> Callable[[int], float]:
    """t_verify(b): linear between measured sizes, the last slope beyond them. A bigger batch never
    costs less, so a dip is noise: adjacent violators are pooled (isotonic regression)."""
    bs = np.array(sorted(points), dtype=float)
    blocks: list[list[float]] = []  # [mean, count]
    for t in (points[int(b)] for b in bs):
        blocks.append([t, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    ts = np.repeat([m for m, _ in blocks], [n for _, n in blocks])
    slope = max((ts[-1] - ts[-2]) / (bs[-1] - bs[-2]), 0.0) if len(bs) > 1 else 0.0
    return lambda b: float(np.interp(b, bs, ts)) if b <= bs[-1] else float(ts[-1] + slope * (b - bs[-1]))


def overhead_model(steps: list) -> tuple[float, float]:
    """Python seconds per step ≈ a + c·n_drafted (sampling k+1 rows, acceptance)."""
    by_n: dict[int, list[float]] = {}
    for s in steps:
        by_n.setdefault(s.n_drafted, []).append(s.t_python)
    xs = sorted(by_n)
    ys = [typical(by_n[x]) for x in xs]
    if len(xs) < 2:
        return (ys[0] if ys else 0.0), 0.0
    c, a = np.polyfit(xs, ys, 1)
    return max(float(a), 0.0), max(float(c), 0.0)


def predict(alpha: float | None, coverage: float, t_draft: float, t_verify, overhead) -> list[float]:
    """Speedup vs plain for k = 0..K_MAX: E(α,k)/(k·t_draft + t_verify(k+1) + overhead(k)), where a
    step without a draft (coverage < 1, prompt lookup) is a plain step."""
    a, c = overhead
    plain_cost = t_verify(1) + a
    out = []
    for k in range(K_MAX + 1):
        if alpha is None or k == 0:
            out.append(1.0)
            continue
        e = coverage * expected_tokens(alpha, k) + (1 - coverage)
        cost = coverage * (k * t_draft + t_verify(k + 1) + a + c * k) + (1 - coverage) * plain_cost
        out.append(float(e / cost * plain_cost))
    return out


def calibrate(target, draft, drafters: Sequence[str], sampling: SamplingConfig, seconds: float,
              chat: Callable[[str], list[int]]) -> dict:
    """Measure the verify curve, plain decoding and each drafter at k = CAL_K within ~`seconds`."""
    started = time.perf_counter()
    deadline = started + seconds
    shares = {"verify": 0.2, "plain": 0.15, **{d: {"model": 0.4, "lookup": 0.25}[d] for d in drafters}}

    def slot(phase: str) -> float:
        """This phase's share of the time left (phases that overran shrink the later ones)."""
        total = shares.pop(phase)
        return max(deadline - time.perf_counter(), 0.0) * total / (total + sum(shares.values()))

    phases: dict[str, float] = {}

    def timed(phase: str, fn: Callable[[float], object]):
        t0 = time.perf_counter()
        out = fn(slot(phase))
        phases[phase] = round(time.perf_counter() - t0, 2)
        return out

    prompts = [chat(p) for p in CHAT_PROMPTS]
    samples = timed("verify", lambda sec: verify_curve(target, prompts[0], sec))
    plain = timed("plain", lambda sec: run_drafter(target, None, prompts, sampling, sec, 0))
    measured = {}
    for name in drafters:
        drafter, ps = (ModelDrafter(draft), prompts) if name == "model" else (PromptLookup(), [chat(LOOKUP_PROMPT)])
        measured[name] = timed(name, lambda sec: run_drafter(target, drafter, ps, sampling, sec, CAL_K))
    everything = plain + [s for steps in measured.values() for s in steps]
    for s in everything:  # the decoding steps timed the same thing: a verify of n_drafted + 1 tokens
        samples.setdefault(s.n_drafted + 1, []).append(s.t_verify)
    curve = {b: typical(samples[b]) for b in sorted(samples)}
    # spread: the largest upper/lower quartile ratio of repeated timings; near 1 on a quiet machine
    spread = max(float(np.percentile(t, 75) / max(np.percentile(t, 25), 1e-9))
                 for t in samples.values() if len(t) > 1)
    t_verify, overhead = _curve(curve), overhead_model(everything)
    plain_stats = summarize_steps(plain)
    result = {
        "seconds": round(time.perf_counter() - started, 2), "phase_seconds": phases, "k": CAL_K,
        "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k,
                     "top_p": sampling.top_p, "min_p": sampling.min_p},
        "verify_cost": {str(b): t for b, t in curve.items()},
        "python_overhead": {"per_step": overhead[0], "per_draft_token": overhead[1]},
        "verify_spread": spread,
        "plain": {"tokens_per_second": plain_stats["measured_tokens_per_second"], "steps": len(plain)},
        "drafters": {},
        "warnings": [],
    }
    if spread > 1.5:
        result["warnings"].append(f"timings vary a lot (upper/lower quartile {spread:.1f}×): the machine is busy")
    for name, steps in measured.items():
        stats = summarize_steps(steps)
        t_draft = stats["draft_cost"] or 0.0
        speedups = predict(stats["alpha"], stats["coverage"] or 0.0, t_draft, t_verify, overhead)
        best = int(np.argmax(speedups))
        plain_tps = plain_stats["measured_tokens_per_second"]
        stats.update(
            measured_speedup=(stats["measured_tokens_per_second"] / plain_tps
                              if plain_tps and stats["measured_tokens_per_second"] else None),
            predicted_speedup_by_k=speedups, best_k=best, predicted_speedup=speedups[best],
        )
        result["drafters"][name] = stats
        if stats["n_drafted"] < 40:
            result["warnings"].append(f"{name}: only {stats['n_drafted']} drafted tokens, so α is rough")
        pred, meas = speedups[CAL_K], stats["measured_speedup"]
        if meas and not 0.67 < pred / meas < 1.5:
            result["warnings"].append(f"{name}: predicted {pred:.2f}× at k={CAL_K} but measured {meas:.2f}×")
    if result["warnings"]:
        result["warnings"].append("rerun on an idle machine, with more --seconds, before trusting the numbers")
    return result


def recommend(calibration: dict | None, vocab: dict | None) -> dict:
    """Drafter and k for general text, plus prompt lookup for editing-style work when it pays.

    The draft model was measured on open chat prompts; prompt lookup on a code-editing prompt that
    repeats its input, so lookup is the general recommendation only when there is no draft model."""
    if not calibration:
        return {"drafter": None, "k": None, "predicted_speedup": None, "confident": False,
                "reason": "no calibration was run (--seconds 0), so nothing was measured"}
    rec = _recommend(calibration, vocab)
    rec["confident"] = not calibration.get("warnings")
    return rec


def _recommend(calibration: dict, vocab: dict | None) -> dict:
    measured = {n: d for n, d in calibration["drafters"].items() if d["alpha"] is not None}
    pays = {n: d for n, d in measured.items() if d["predicted_speedup"] >= MIN_SPEEDUP}
    temp = calibration["sampling"]["temperature"]

    def pick(name: str) -> dict:
        d = pays[name]
        return {"drafter": name, "k": d["best_k"], "predicted_speedup": d["predicted_speedup"],
                "flags": f"--drafter {name} -k {d['best_k']}"}

    editing = pick("lookup") if "lookup" in pays else None
    if "model" in pays or (pays and "model" not in measured):
        rec = pick("model" if "model" in pays else "lookup")
        d = pays[rec["drafter"]]
        rec["reason"] = f"α {d['alpha']:.2f} at T={temp:g}; predicted {d['predicted_speedup']:.2f}× plain decoding"
        if rec["drafter"] == "lookup":
            rec["reason"] += " when the output repeats the prompt (editing, refactoring); little gain on open chat"
        elif editing:
            rec["for_editing"] = editing
        return rec
    rec = {"drafter": "none", "k": 0, "predicted_speedup": 1.0, "flags": "--drafter none"}
    if not measured:
        why = "no drafter produced any draft tokens" if calibration["drafters"] else "no drafter was measured"
        if vocab is not None and not vocab["compatible"]:
            why = "the draft model's vocabulary differs from the target's"
        rec["reason"] = f"{why}; decode plainly"
    else:
        name, best = max(measured.items(), key=lambda kv: kv[1]["predicted_speedup"])
        rec["best_speculative"] = {"drafter": name, "k": max(best["best_k"], 1),
                                   "predicted_speedup": best["predicted_speedup_by_k"][max(best["best_k"], 1)]}
        rec["reason"] = (f"speculation will not pay on this machine: the best option ({name}, "
                         f"k={rec['best_speculative']['k']}) is predicted at "
                         f"{rec['best_speculative']['predicted_speedup']:.2f}× plain decoding")
    if editing:
        rec["for_editing"] = editing
    return rec


# ---------------------------------------------------------------- the whole check

def diagnose(target_path: str, draft_path: str | None, drafters: Sequence[str], *, n_ctx: int,
             threads: int | None, gpu_layers: dict[str, int], sampling: SamplingConfig,
             seconds: float) -> dict:
    """Load the pair (at CAL_CTX: the memory section extrapolates to n_ctx) and return the
    sections build, models, vocab, memory, calibration and recommendation."""
    from .config import ModelConfig

    for path in (target_path, draft_path):
        if path is not None:
            engine.check_gguf(path)
    build = build_info()  # GPU memory and RAM are read before the models take any
    ram = system_memory()

    def load(path: str, role: str):
        try:
            return engine.Model(ModelConfig(path, CAL_CTX, threads, gpu_layers[role]))
        except engine.EngineError as e:
            if not build["gpu_offload"]:
                raise
            raise engine.EngineError(f"{e} (if GPU memory ran out: lower --{role}-gpu-layers)") from None

    target = load(target_path, "target")
    draft = None
    try:
        if draft_path is not None:
            draft = load(draft_path, "draft")
        models = {"target": target} | ({"draft": draft} if draft else {})
        shapes = {role: model_shape(m) for role, m in models.items()}
        for role, s in shapes.items():
            s.update(gpu_layers=gpu_layers[role], threads=models[role].n_threads)
        vocab = vocab_report(target, draft) if draft else None
        memory = memory_report(shapes, n_ctx, gpu_layers, build, ram)
        usable = [d for d in drafters if d != "model" or (draft is not None and vocab["compatible"])]
        calibration = None
        if seconds > 0:
            load = _load()  # before calibrating: the other processes' load, not ours
            calibration = calibrate(target, draft, usable, sampling, seconds, _chat(target))
            calibration["load_average"] = load
            if len(usable) < len(drafters):
                calibration["skipped"] = {"model": "vocabularies differ"}
        return {"build": build, "models": {"target": shapes["target"], "draft": shapes.get("draft")},
                "vocab": vocab, "memory": memory, "calibration": calibration,
                "recommendation": recommend(calibration, vocab)}
    finally:
        target.close()
        if draft is not None:
            draft.close()


def _chat(target) -> Callable[[str], list[int]]:
    def tokens(text: str) -> list[int]:
        if target.chat_template:
            try:
                return target.chat_prompt([{"role": "user", "content": text}])
            except Exception:  # noqa: BLE001 - an unusual template: fall back to raw text
                pass
        return target.tokenize(text, add_special=True)
    return tokens


def _load() -> dict | None:
    try:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return {"load_1min": os.getloadavg()[0], "cpus": cpus}
    except OSError:
        return None


# ---------------------------------------------------------------- human report

def _size(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def format_report(r: dict) -> str:
    b, lines = r["build"], []
    add = lines.append
    gpu = ("yes (" + ", ".join(b["gpu_backends"] or ["?"]) + ")") if b["gpu_offload"] else "no (CPU-only build)"
    add(f"build        llama-cpp-python {b['llama_cpp_python']} · GPU offload: {gpu} · backends: "
        f"{', '.join(b['backends']) or '?'}")
    for g in b["gpus"]:
        add(f"             GPU {g.get('name', '?')}: {_size(g.get('memory_free'))} free of {_size(g.get('memory_total'))}")
    add(f"             CPU features: {' '.join(b['cpu_features']) or '-'}")
    for role, m in r["models"].items():
        if m:
            offload = "" if not b["gpu_offload"] else f" · gpu layers {'all' if m['gpu_layers'] < 0 else m['gpu_layers']}"
            kv = max(m["n_head_kv"]) if isinstance(m["n_head_kv"], list) else m["n_head_kv"]
            add(f"{role:<12} {os.path.basename(m['path'])} · {m['arch']} · {m['n_params'] / 1e6:.0f}M params · "
                f"{m['n_layer']} layers · {kv} KV heads × {m['key_length']} · {_size(m['size_bytes'])}{offload}")
    v = r["vocab"]
    if v:
        sp = v["special"]
        detail = (f"{v['n_vocab']['target']} tokens, BOS/EOS/EOT {sp['bos']['target']}/{sp['eos']['target']}/"
                  f"{sp['eot']['target']}, token texts identical" if v["compatible"] else "; ".join(v["problems"]))
        add(f"vocab        {v['verdict']}: {detail}")
    mem = r["memory"]
    parts = [f"{role} {_size(x['weights_bytes'])} + KV {_size(x['kv_bytes'])}" for role, x in mem["models"].items()]
    where = f"RAM {_size(mem['ram_bytes'])}" + (f", GPU {_size(mem['gpu_bytes'])}" if mem["gpu_bytes"] else "")
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
            add(f"  {name:<10} α {d['alpha']:.2f} ({d['n_drafted']} drafted){cov} · draft "
                f"{d['draft_cost'] * 1e3:.2f} ms/token{meas} · {best}")
        for name, why in c.get("skipped", {}).items():
            add(f"  {name:<10} skipped: {why}")
        load = c.get("load_average")
        if load and load["cpus"] and load["load_1min"] > load["cpus"]:
            add(f"  note: machine busy (load {load['load_1min']:.1f} on {load['cpus']} CPUs): timings are noisy")
        for w in c.get("warnings", []):
            add(f"  warning: {w}")
        if not b["gpu_offload"] and vc.get("8") and vc.get("1") and vc["8"] > 2 * vc["1"]:
            add(f"  note: verifying 8 tokens costs {vc['8'] / vc['1']:.1f}× one token on this CPU; "
                "on a GPU it is nearly flat, so speculation gains more there")
    rec = r["recommendation"]
    flags = rec.get("flags")
    hedge = " (low confidence: see the warnings)" if c and not rec.get("confident") else ""
    add(f"recommend    {flags + ' — ' if flags else ''}{rec['reason']}{hedge}")
    if rec.get("for_editing"):
        e = rec["for_editing"]
        add(f"             for editing (output repeats the prompt): {e['flags']} — predicted "
            f"{e['predicted_speedup']:.2f}×")
    return "\n".join(lines)
