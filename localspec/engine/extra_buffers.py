"""llama.cpp's extra CPU weight buffers (AMX tiles, repacked layouts), and whether they run here.

llama.cpp's CPU backend keeps quantized weights in "extra" buffer types where it can: Intel AMX's
tile layout (built with `-march=native` on a CPU that lists `amx_tile amx_int8`), and interleaved
"repacked" layouts for AVX2/NEON. A CPU can list AMX and still fault on it: a hypervisor that lists
features it has not enabled, a kernel that refuses the tile state. The first matrix product through
the AMX buffer then dies with SIGILL (`tilezero` in ggml-cpu's AMX code) and takes the process with
it, which no Python handler can catch. So, where this CPU lists AMX and the build offers it, a child
process runs one small product of each AMX-capable weight type through every extra buffer type and
compares it with the plain CPU buffer's (`probe`); where the child dies or disagrees, models load
without the extra buffer types (`llama_model_params.use_extra_bufts`, what llama.cpp's `--no-repack`
sets). The verdict is kept per llama.cpp build, CPU and kernel, so the check runs once.

`LOCALSPEC_EXTRA_BUFFERS=0` turns them off, `=1` on without a check.
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from localspec import paths
from localspec.machine import default_threads

ENV = "LOCALSPEC_EXTRA_BUFFERS"
PROBE_SECONDS = 120     # a probe that has not answered by then is taken as a fault (and not kept)
TOLERANCE = 1e-2        # largest difference from the plain buffer's product, relative to its largest
                        # value: both quantize the activations alike, so only summation order differs
TYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 8, "q4_K": 12, "q5_K": 13, "q6_K": 14, "iq4_xs": 23}
"""ggml_type values of the weight types ggml's AMX code has kernels for (`qtype_has_amx_kernels`)."""
K, N, MS = 2048, 64, (1, 32)   # rows of 2048 fit every type's block and what newer ggml's AMX asks
                               # (K % 2048); AMX wants N % 32 == 0, and takes a vector kernel for one
                               # activation row and its tiles for 32
KEPT = ("ok", "fault", "wrong")   # verdicts kept for the build: the others (a timeout, a probe that
                                  # could not start or died of another signal) may not recur
_F32 = 0


def cpu_lists_amx() -> bool:
    """Whether this CPU says it has AMX (Linux's /proc/cpuinfo flags; elsewhere llama.cpp's own)."""
    return "amx_tile" in _cpu_identity()[1].split() or "AMX_INT8 = 1" in _system_info()


def offered() -> list[str]:
    """The extra buffer types llama.cpp's CPU backend offers in this process (asking makes no
    product: AMX's permission request is all that runs)."""
    lib = _ggml()
    if lib is None:
        return []
    cpu = lib.ggml_backend_dev_by_type(0)
    bufts = _extra_bufts(lib, cpu)
    return [lib.ggml_backend_buft_name(b).decode() for b in bufts]


@functools.cache
def usable() -> bool:
    """Whether models load with the extra buffer types: LOCALSPEC_EXTRA_BUFFERS where set; else
    yes, unless this CPU lists AMX, the build offers it, and the probe (once per build, CPU and
    kernel) failed — then once a notice on stderr."""
    status = state()
    if not status["use"] and status["source"] != "env":
        print(f"localspec: llama.cpp's {status['detail']}; loading weights without its extra CPU buffer "
              f"types (AMX, repacking): slower products on quantized weights, the same output. "
              f"`localspec doctor` shows it; {ENV}=1 forces them.", file=sys.stderr, flush=True)
    return status["use"]


def state() -> dict:
    """What `usable` decides and why: {use, verdict, detail, source, offered, amx_listed, record}."""
    out = {"amx_listed": cpu_lists_amx(), "offered": offered(), "record": str(record_path())}
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("0", "off", "no", "false", "1", "on", "yes", "true"):
        on = forced in ("1", "on", "yes", "true")
        return {**out, "use": on, "verdict": "forced on" if on else "forced off", "source": "env",
                "detail": f"extra buffer types {'on' if on else 'off'} by {ENV}"}
    if not (out["amx_listed"] and "AMX" in out["offered"]):
        return {**out, "use": True, "verdict": "unchecked", "source": "none",
                "detail": "no AMX buffer type here: nothing to check"}
    kept = _read(record_path())
    source = "record"
    if kept is None:
        kept, source = probe(), "probe"
        if kept["verdict"] in KEPT:
            _write(record_path(), kept)
    return {**out, "use": kept["verdict"] == "ok", "verdict": kept["verdict"], "source": source,
            "detail": kept["detail"], "checked": kept.get("checked")}


def probe(command: list[str] | None = None, threads: int | None = None) -> dict:
    """Run the products in a child process (`command` replaces `python -m <this module>`: a test
    hands one that faults). Returns {verdict: ok | fault | wrong | error | timeout, detail, checked}:
    `fault` where the child died of an illegal instruction, `error` where it died otherwise or
    checked no AMX product though the build offers AMX (then nothing says AMX works here)."""
    threads = threads or max(default_threads(), 2)   # AMX runs a tile state per thread: use several
    cmd = command or [sys.executable, "-m", __name__, str(threads)]
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_SECONDS, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"verdict": "timeout", "detail": f"CPU check did not finish in {PROBE_SECONDS} s", "checked": now}
    except OSError as e:
        return {"verdict": "error", "detail": f"CPU check could not start ({e.strerror or e})", "checked": now}
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name if -done.returncode in signal.valid_signals() else str(-done.returncode)
        if -done.returncode == signal.SIGILL:
            return {"verdict": "fault", "detail": f"AMX code faults on this CPU (a test product died: {name})",
                    "checked": now}
        return {"verdict": "error", "detail": f"CPU check died ({name})", "checked": now}
    try:
        errors = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {"verdict": "error", "detail": f"CPU check failed (exit {done.returncode}: {why})", "checked": now}
    if "AMX" in offered() and not any(k.startswith("AMX/") for k in errors):
        return {"verdict": "error", "detail": "CPU check reached no AMX product", "checked": now, "errors": errors}
    bad = {k: v for k, v in errors.items() if not v <= TOLERANCE}
    if bad:
        worst = max(bad, key=lambda k: bad[k] if np.isfinite(bad[k]) else np.inf)
        return {"verdict": "wrong", "detail": f"extra buffer products differ on this CPU ({worst}: {bad[worst]:.3g})",
                "checked": now, "errors": errors}
    return {"verdict": "ok", "detail": f"the extra buffers' products match the plain ones ({len(errors)} checked)",
            "checked": now, "errors": errors}


def record_path() -> Path:
    """Where the verdict for this llama.cpp build, CPU and kernel is kept."""
    model, flags = _cpu_identity()
    ident = "\n".join([_build_identity(), model, flags, os.uname().release if hasattr(os, "uname") else ""])
    return paths.cache_path() / "cpu-checks" / f"extra-buffers-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"


# ---- the child: products through each extra buffer type ---------------------------------------

def products(threads: int) -> dict[str, float]:
    """{"BUFT/type/m": largest difference from the plain CPU buffer's product, relative}, for every
    extra buffer type and weight type the CPU backend supports the product for."""
    lib = _ggml()
    cpu = lib.ggml_backend_dev_by_type(0)
    backend = lib.ggml_backend_dev_init(cpu, None)
    reg = lib.ggml_backend_dev_backend_reg(cpu)
    set_threads = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_set_n_threads")
    if set_threads:
        ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int)(set_threads)(backend, threads)
    plain = lib.ggml_backend_dev_buffer_type(cpu)
    _check_layout(lib, plain)
    rng = np.random.default_rng(0)
    xs = {m: rng.standard_normal((m, K), dtype=np.float32) for m in MS}
    out: dict[str, float] = {}
    try:
        for tname, gtype in TYPES.items():
            w = rng.standard_normal((N, K), dtype=np.float32)
            q = np.empty(N * lib.ggml_row_size(gtype, K), dtype=np.uint8)
            lib.ggml_quantize_chunk(gtype, w.ctypes.data, q.ctypes.data, 0, N, K, None)
            for buft in _extra_bufts(lib, cpu):
                name = lib.ggml_backend_buft_name(buft).decode()
                for m, x in xs.items():
                    if not _supported(lib, cpu, buft, gtype, m):
                        continue
                    ref = _product(lib, backend, plain, plain, gtype, q, x)
                    got = _product(lib, backend, buft, plain, gtype, q, x)
                    scale = float(np.abs(ref).max()) or 1.0
                    out[f"{name}/{tname}/{m}"] = float(np.abs(got - ref).max() / scale)
    finally:
        lib.ggml_backend_free(backend)
    return out


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _context(lib, tensors: int, graph: bool = False):
    size = tensors * lib.ggml_tensor_overhead() + (lib.ggml_graph_overhead() if graph else 0)
    return lib.ggml_init(_InitParams(size, None, True))


def _supported(lib, cpu, buft, gtype: int, m: int) -> bool:
    """Whether the CPU backend takes this product with the weight in `buft` (llama.cpp's own test:
    the weight in an empty buffer of that type; placing an unsupported weight there crashes)."""
    ctx = _context(lib, 3)
    try:
        w = lib.ggml_new_tensor_2d(ctx, gtype, K, N)
        y = lib.ggml_mul_mat(ctx, w, lib.ggml_new_tensor_2d(ctx, _F32, K, m))
        empty = lib.ggml_backend_buft_alloc_buffer(buft, 0)
        slot = ctypes.c_void_p.from_address(w + _BUFFER_OFFSET)   # ggml_tensor.buffer
        slot.value = empty
        try:
            return bool(lib.ggml_backend_dev_supports_op(cpu, y))
        finally:
            slot.value = None
            if empty:
                lib.ggml_backend_buffer_free(empty)
    finally:
        lib.ggml_free(ctx)


_BUFFER_OFFSET = 8   # struct ggml_tensor { enum ggml_type type; struct ggml_backend_buffer * buffer; ...


def _check_layout(lib, plain) -> None:
    """That ggml_tensor.buffer is where `_supported` writes it: a tensor allocated in a buffer
    must point to that buffer there (checked before anything is written through the offset)."""
    ctx = _context(lib, 1)
    try:
        w = lib.ggml_new_tensor_2d(ctx, _F32, 32, 1)
        buffer = lib.ggml_backend_alloc_ctx_tensors_from_buft(ctx, plain)
        try:
            if ctypes.c_void_p.from_address(w + _BUFFER_OFFSET).value != buffer:
                raise RuntimeError("ggml_tensor's layout is not the one this check was written for")
        finally:
            lib.ggml_backend_buffer_free(buffer)
    finally:
        lib.ggml_free(ctx)


def _product(lib, backend, wbuft, plain, gtype: int, q: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x · Wᵀ with W (quantized, `q`) in a buffer of type `wbuft`, computed by `backend`."""
    wctx, actx = _context(lib, 1), _context(lib, 2, graph=True)
    buffers = []
    try:
        w = lib.ggml_new_tensor_2d(wctx, gtype, K, N)
        buffers.append(lib.ggml_backend_alloc_ctx_tensors_from_buft(wctx, wbuft))
        lib.ggml_backend_tensor_set(w, q.ctypes.data, 0, q.nbytes)
        xt = lib.ggml_new_tensor_2d(actx, _F32, K, x.shape[0])
        y = lib.ggml_mul_mat(actx, w, xt)
        graph = lib.ggml_new_graph(actx)
        lib.ggml_build_forward_expand(graph, y)
        buffers.append(lib.ggml_backend_alloc_ctx_tensors_from_buft(actx, plain))
        lib.ggml_backend_tensor_set(xt, x.ctypes.data, 0, x.nbytes)
        if lib.ggml_backend_graph_compute(backend, graph) != 0:
            raise RuntimeError("a test product failed to compute")
        got = np.empty((x.shape[0], N), dtype=np.float32)
        lib.ggml_backend_tensor_get(y, got.ctypes.data, 0, got.nbytes)
        return got
    finally:
        for b in buffers:
            if b:
                lib.ggml_backend_buffer_free(b)
        lib.ggml_free(wctx)
        lib.ggml_free(actx)


# ---- identities and records -------------------------------------------------------------------

@functools.cache
def _cpu_identity() -> tuple[str, str]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; ("", "") where there is none."""
    model = flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = value.strip()
                if model and flags:
                    break
    except OSError:
        pass
    return model, flags


@functools.cache
def _system_info() -> str:
    from .backend import system_info
    return system_info()


@functools.cache
def _build_identity() -> str:
    """The llama.cpp libraries this process loaded (names, sizes, times) and their features."""
    from .backend import ggml
    lib = ggml()
    parts = [_system_info()]
    if lib is not None:
        folder = Path(lib._name).parent
        for f in sorted(folder.glob("*ggml*")) + sorted(folder.glob("*llama*")):
            try:
                st = f.stat()
                parts.append(f"{f.name} {st.st_size} {st.st_mtime_ns}")
            except OSError:
                pass
    return "\n".join(parts)


def _read(path: Path) -> dict | None:
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        return kept if isinstance(kept, dict) and isinstance(kept.get("verdict"), str) else None
    except (OSError, ValueError):
        return None


def _write(path: Path, verdict: dict) -> None:
    """Best effort: a cache that cannot be written only means the check runs again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(verdict, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


# ---- ggml's C API, from the libraries llama-cpp-python loaded ----------------------------------

@functools.cache
def _ggml():
    from .backend import ggml
    lib = ggml()
    if lib is None or not hasattr(lib, "ggml_backend_dev_supports_op"):
        return None
    p, sz, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64
    for name, res, args in (
            ("ggml_backend_dev_by_type", p, [ctypes.c_int]),
            ("ggml_backend_dev_init", p, [p, ctypes.c_char_p]),
            ("ggml_backend_dev_buffer_type", p, [p]),
            ("ggml_backend_dev_supports_op", ctypes.c_bool, [p, p]),
            ("ggml_backend_buft_name", ctypes.c_char_p, [p]),
            ("ggml_backend_buft_alloc_buffer", p, [p, sz]),
            ("ggml_backend_buffer_free", None, [p]),
            ("ggml_backend_free", None, [p]),
            ("ggml_backend_alloc_ctx_tensors_from_buft", p, [p, p]),
            ("ggml_backend_tensor_set", None, [p, p, sz, sz]),
            ("ggml_backend_tensor_get", None, [p, p, sz, sz]),
            ("ggml_backend_graph_compute", ctypes.c_int, [p, p]),
            ("ggml_init", p, [_InitParams]),
            ("ggml_free", None, [p]),
            ("ggml_tensor_overhead", sz, []),
            ("ggml_graph_overhead", sz, []),
            ("ggml_new_tensor_2d", p, [p, ctypes.c_int, i64, i64]),
            ("ggml_mul_mat", p, [p, p, p]),
            ("ggml_new_graph", p, [p]),
            ("ggml_build_forward_expand", None, [p, p]),
            ("ggml_row_size", sz, [ctypes.c_int, i64]),
            ("ggml_quantize_chunk", sz, [ctypes.c_int, p, p, i64, i64, i64, p])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def _extra_bufts(lib, cpu) -> list[int]:
    reg = lib.ggml_backend_dev_backend_reg(cpu)
    fn = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not fn:
        return []
    arr = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fn)(cpu)
    found = []
    while arr and arr[len(found)]:
        found.append(arr[len(found)])
    return found


if __name__ == "__main__":   # the probe's child: `python -m localspec.engine.extra_buffers THREADS`
    print(json.dumps(products(int(sys.argv[1]) if len(sys.argv) > 1 else 2)))
