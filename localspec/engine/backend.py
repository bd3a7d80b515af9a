"""llama.cpp's process-wide side: its log, backend start-up, and what the build and devices offer.

llama.cpp logs every tensor at load time; the log callback keeps the recent warnings and errors so
that a failed load can say why (`_recent_log`), and prints everything under LOCALSPEC_VERBOSE.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections import deque
from pathlib import Path

import llama_cpp as C

from . import interrupt

# llama.cpp logs every tensor at load time; keep the recent warnings/errors to explain failures.
_recent_log: deque[str] = deque(maxlen=8)
_VERBOSE = bool(os.environ.get("LOCALSPEC_VERBOSE"))
_WARN, _ERROR = 3, 4  # ggml_log_level values


@C.llama_log_callback
def _log_callback(level, text, user_data):  # noqa: ARG001 - signature fixed by llama.cpp
    try:
        message = text.decode("utf-8", "replace") if text else ""
        if _VERBOSE:
            os.write(2, message.encode())
        elif level in (_WARN, _ERROR) and message.strip():
            _recent_log.append(message.strip())
    except KeyboardInterrupt:  # ctypes would print and drop it; keep it for the caller
        interrupt.request()


@C.llama_progress_callback
def _load_progress(progress, user_data):  # noqa: ARG001
    return not interrupt.requested()  # false stops the load




_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        C.llama_log_set(_log_callback, ctypes.c_void_p(0))
        C.llama_backend_init()
        _backend_ready = True


def gpu_offload_supported() -> bool:
    """Whether layers can go to a local GPU: the build offloads, and (where ggml's device list can
    be read) a GPU is here. An RPC-enabled build says it offloads with no GPU at all."""
    _init_backend()
    if not C.llama_supports_gpu_offload():
        return False
    if ggml() is None:
        return True
    return any(d["type"] in ("gpu", "igpu") and d["backend"] != "RPC" for d in backend_devices())


def system_info() -> str:
    _init_backend()
    return C.llama_print_system_info().decode("utf-8", "replace").strip()


@functools.cache
def ggml() -> ctypes.CDLL | None:
    """ggml's device registry, which llama-cpp-python does not bind, from the very libraries it
    loaded (None where they do not export it).

    Looked up through libllama's own handle: a symbol lookup on it searches the libraries it was
    linked with, libggml among them. Opening a libggml by path instead could load a second copy
    (a wheel's lib/ beside a LLAMA_CPP_LIB_PATH build, say): a second registry whose device
    pointers, handed to the first, crash the process."""
    _init_backend()
    loaded = getattr(getattr(C, "llama_cpp", None), "_lib", None)
    if loaded is None:
        return None
    lib = ctypes.CDLL(loaded._name, handle=loaded._handle)   # no dlopen: the same handle
    if not hasattr(lib, "ggml_backend_dev_count"):   # Windows looks only in llama.dll itself
        libdir = Path(loaded._name).parent
        found = [libdir / n for n in ("ggml.dll", "libggml.dylib", "libggml.so") if (libdir / n).exists()]
        if not found:
            return None
        lib = ctypes.CDLL(str(found[0]))   # the copy beside libllama: the one it loaded
    p, size_p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)
    for name, res, args in (
            ("ggml_backend_dev_count", ctypes.c_size_t, []),
            ("ggml_backend_dev_get", p, [ctypes.c_size_t]),
            ("ggml_backend_dev_name", ctypes.c_char_p, [p]),
            ("ggml_backend_dev_description", ctypes.c_char_p, [p]),
            ("ggml_backend_dev_type", ctypes.c_int, [p]),
            ("ggml_backend_dev_memory", None, [p, size_p, size_p]),
            ("ggml_backend_dev_backend_reg", p, [p]),
            ("ggml_backend_dev_by_name", p, [ctypes.c_char_p]),
            ("ggml_backend_reg_name", ctypes.c_char_p, [p]),
            ("ggml_backend_reg_by_name", p, [ctypes.c_char_p]),
            ("ggml_backend_reg_get_proc_address", p, [p, ctypes.c_char_p]),
            ("ggml_backend_register", None, [p]),
            ("ggml_backend_load_all", None, []),
            ("ggml_set_abort_callback", p, [p])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


def device_handles() -> list[int]:
    """ggml's registered devices, in registry order (pointers)."""
    lib = ggml()
    return [] if lib is None else [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]


def describe(dev: int) -> dict:
    """One device: its name, description (an RPC device's is its worker), kind, backend and
    free/total memory."""
    lib = ggml()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    reg = lib.ggml_backend_dev_backend_reg(dev)
    return {
        "name": lib.ggml_backend_dev_name(dev).decode("utf-8", "replace"),
        "description": lib.ggml_backend_dev_description(dev).decode("utf-8", "replace"),
        "type": _KINDS.get(lib.ggml_backend_dev_type(dev), "other"),
        "backend": lib.ggml_backend_reg_name(reg).decode("utf-8", "replace") if reg else "",
        "memory_free": free.value,
        "memory_total": total.value,
    }


def backend_devices() -> list[dict]:
    """Every device ggml registered (CPU, CUDA/Metal/Vulkan GPUs, RPC workers once added) with its
    free/total memory."""
    return [describe(dev) for dev in device_handles()]


def library_version() -> str:
    return getattr(C, "__version__", "unknown")
