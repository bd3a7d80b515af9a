"""`localspec doctor`: what this llama.cpp build can do, whether a target/draft pair works together,
whether it fits in memory, and — measured on this machine — whether speculation pays and with which
drafter and k.

Every section is a plain dict (the `--json` output); `format_report` renders the human version.
Nothing here raises on a bad pair: an incompatible vocabulary or a pair too big for memory is a
finding to report, not an error. The timed measurements live in calibrate.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Sequence

from localspec import engine, machine
from localspec.loading import record_view, warmstart
from localspec.loading.vocab import compare as compare_vocab
from .calibrate import calibrate, chat_tokens
from localspec.config import N_BATCH, Placement, SamplingConfig
from localspec.loading.session import fit_threads

MIN_SPEEDUP = 1.05    # below this, speculation is not worth it: recommend --drafter none
CAL_CTX = 1024        # context the models are loaded with (the memory estimate uses --n-ctx)
GPU_BACKENDS = {"cuda", "rocm", "hip", "metal", "mtl", "vulkan", "sycl", "opencl", "cann", "musa",
                "kompute", "webgpu", "cublas", "hipblas", "clblast"}


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
        "extra_buffers": engine.extra_buffers.state(),
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


def kv_bytes(shape: dict, n_ctx: int, cache_types: tuple[str, str] = ("f16", "f16")) -> int | None:
    """K and V for every layer in the cache types (k, v): sum over layers of
    n_ctx × n_head_kv × (key_len × bytes per K value + value_len × bytes per V value)."""
    from localspec.engine.placement import BYTES_PER_VALUE

    heads, dk, dv = shape["n_head_kv"], shape["key_length"], shape["value_length"]
    if not heads or not dk or not dv:
        return None
    per_layer = heads if isinstance(heads, list) else [heads] * shape["n_layer"]
    bk, bv = (BYTES_PER_VALUE[t] for t in cache_types)
    return int(sum(per_layer) * n_ctx * (dk * bk + dv * bv))


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
                  ram: dict | None = None, placement: dict[str, Placement] | None = None,
                  workers: list[dict] | None = None) -> dict:
    """Weights + KV per model at n_ctx in its cache types, where they live (offloaded layers go to
    the GPU, or to the RPC workers of `placement`), and whether that fits. Compute buffers are not
    counted, so 'tight' already means trouble. `ram` should be read before the models were loaded
    (default: now); `workers`: the RPC devices (`engine.backend_devices`)."""
    ram = ram or system_memory()
    placement = placement or {}
    types = {role: (p.cache_type_k, p.cache_type_v) for role, p in placement.items()}
    out: dict = {"n_ctx": n_ctx, "kv_type": "/".join(types.get("target", ("f16", "f16"))),
                 "kv_types": {role: "/".join(types.get(role, ("f16", "f16"))) for role in shapes},
                 "models": {}, "ram": ram, "gpus": build["gpus"]}
    need = {"ram": 0, "gpu": 0, "workers": 0}
    notes = []
    for role, s in shapes.items():
        kv = kv_bytes(s, n_ctx, types.get(role, ("f16", "f16"))) or 0
        layers = gpu_layers.get(role, -1)
        remote = role in placement and bool(placement[role].rpc)
        offload = build["gpu_offload"] or remote
        share = 0.0 if not offload else 1.0 if layers < 0 else min(layers, s["n_layer"]) / s["n_layer"]
        total = s["size_bytes"] + kv
        need["workers" if remote else "gpu"] += int(share * total)
        need["ram"] += total - int(share * total)
        out["models"][role] = {"weights_bytes": s["size_bytes"], "kv_bytes": kv, "total_bytes": total,
                               "gpu_share": share}
        if s["sliding_window"]:
            notes.append(f"{role} uses sliding-window attention: its KV estimate is an upper bound")
    out["total_bytes"] = need["ram"] + need["gpu"] + need["workers"]
    out["ram_bytes"], out["gpu_bytes"], out["workers_bytes"] = need["ram"], need["gpu"], need["workers"]
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
    if need["workers"]:   # layers spread over the workers (and any local GPU): their memory together
        free = sum(d.get("memory_free") or 0 for d in workers or [])
        if free:
            verdicts.append(_fit(need["workers"], free))
    order = ["fits", "tight", "won't fit"]
    out["verdict"] = max(verdicts, key=order.index) if verdicts else "unknown"
    out["fits"] = out["verdict"] in ("fits", "tight")
    out["notes"] = notes
    return out


def _fit(need: float, have: float) -> str:
    return "won't fit" if need > have else "tight" if need > 0.8 * have else "fits"


# ---------------------------------------------------------------- recommendation

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
        if editing and "model" in measured:
            rec["reason"] = (f"the draft model will not pay on this machine (predicted "
                             f"{measured['model']['predicted_speedup']:.2f}× at best); prompt lookup pays "
                             "only when the output repeats the prompt, see below")
        else:
            rec["reason"] = (f"speculation will not pay on this machine: the best option ({name}, "
                             f"k={rec['best_speculative']['k']}) is predicted at "
                             f"{rec['best_speculative']['predicted_speedup']:.2f}× plain decoding")
    if editing:
        rec["for_editing"] = editing
    return rec


# ---------------------------------------------------------------- the whole check

def diagnose(target_path: str, draft_path: str | None, drafters: Sequence[str], *, n_ctx: int,
             threads: int | None, gpu_layers: dict[str, int], sampling: SamplingConfig,
             seconds: float, forget: bool = False, save_anyway: bool = False,
             placement: dict[str, Placement] | None = None, n_batch: int = N_BATCH) -> dict:
    """Load the pair (at CAL_CTX: the memory section extrapolates to n_ctx) and return the
    sections build, threads (and thread_choice: why that many), models, vocab, memory,
    calibration, recommendation and warm_start (the controller's record for this pair, which a
    calibration rewrites and `forget` deletes). A calibration during which other work took the
    threads' cores is not written to the record (its timings describe a slower machine) unless
    `save_anyway`."""
    from localspec.config import ModelConfig

    for path in (target_path, draft_path):
        if path is not None:
            engine.check_gguf(path)
    placement = placement or {}
    engine.connect_workers(placement["target"].rpc if "target" in placement else ())   # before loading
    build = build_info()  # GPU memory and RAM are read before the models take any
    ram = system_memory()
    devices = engine.backend_devices()

    def load(path: str, role: str):
        try:
            return engine.Model(ModelConfig(path, CAL_CTX, threads or idle_threads, gpu_layers[role], n_batch,
                                            placement=placement.get(role, Placement())))
        except engine.EngineError as e:
            if not build["gpu_offload"]:
                raise
            raise engine.EngineError(f"{e} (if GPU memory ran out: lower --{role}-gpu-layers)") from None

    # The threads fit the work on the machine as generate's do (session.fit_threads), seen while
    # the models load; records are kept per thread count.
    loading, idle_threads = machine.sample(), machine.choose_threads(None, other=0.0).threads
    target = load(target_path, "target")
    draft = None
    try:
        if draft_path is not None:
            draft = load(draft_path, "draft")
        plan = fit_threads((target, draft), threads, 0, loading)
        models = {"target": target} | ({"draft": draft} if draft else {})
        shapes = {role: model_shape(m) for role, m in models.items()}
        for role, s in shapes.items():
            s.update(gpu_layers=gpu_layers[role], threads=models[role].n_threads)
        vocab = compare_vocab(target, draft) if draft else None
        memory = memory_report(shapes, n_ctx, gpu_layers, build, ram, placement,
                               [d for d in devices if d["backend"] == "RPC"])
        usable = [d for d in drafters if d != "model" or (draft is not None and vocab["compatible"])]
        calibration = None
        if seconds > 0:
            calibration = calibrate(target, draft, usable, sampling, seconds, chat_tokens(target))
            if len(usable) < len(drafters):
                calibration["skipped"] = {"model": "vocabularies differ"}
        keys = [warmstart.pair_key(target, draft, gpu_layers)] + (
            [warmstart.pair_key(target, None, gpu_layers)] if draft else [])
        forgotten = [str(p) for p in map(warmstart.forget, keys) if p] if forget else []
        busy = calibration["machine"]["busy"] if calibration else None
        refused = busy if busy and not save_anyway else None
        saved = [] if refused else [str(p) for p in warmstart.save_calibration(target, draft, gpu_layers, calibration)]
        warm = record_view.describe(keys[0]) | {"forgotten": forgotten, "saved": saved, "not_saved": refused}
        return {"build": build, "devices": devices, "placement": {r: p.record() for r, p in placement.items()},
                "threads": plan.threads, "thread_choice": plan.as_dict() | {"warning": plan.warning},
                "models": {"target": shapes["target"], "draft": shapes.get("draft")},
                "vocab": vocab, "memory": memory, "calibration": calibration,
                "recommendation": recommend(calibration, vocab), "warm_start": warm}
    finally:
        target.close()
        if draft is not None:
            draft.close()
