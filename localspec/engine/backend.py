"""llama.cpp's process-wide side: its log, backend start-up, and what the build and devices offer.

llama.cpp logs every tensor at load time; the log callback keeps the recent warnings and errors so
that a failed load can say why (`_recent_log`), and prints everything under LOCALSPEC_VERBOSE.
"""

from __future__ import annotations

import ctypes
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
    _init_backend()
    return bool(C.llama_supports_gpu_offload())


def system_info() -> str:
    _init_backend()
    return C.llama_print_system_info().decode("utf-8", "replace").strip()


def backend_devices() -> list[dict]:
    """Every device ggml registered (CPU, CUDA/Metal/Vulkan GPUs…) with its free/total memory.

    llama-cpp-python does not bind ggml's device API, so it is called from the bundled libggml.
    """
    _init_backend()
    libdir = Path(C.__file__).parent / "lib"
    found = [libdir / n for n in ("libggml.so", "libggml.dylib", "ggml.dll") if (libdir / n).exists()]
    if not found:
        return []
    lib = ctypes.CDLL(str(found[0]))
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(lib, fn).restype = ctypes.c_char_p
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    size_p = ctypes.POINTER(ctypes.c_size_t)
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
    kinds = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        devices.append({
            "name": lib.ggml_backend_dev_name(dev).decode("utf-8", "replace"),
            "description": lib.ggml_backend_dev_description(dev).decode("utf-8", "replace"),
            "type": kinds.get(lib.ggml_backend_dev_type(dev), "other"),
            "memory_free": free.value,
            "memory_total": total.value,
        })
    return devices


def library_version() -> str:
    return getattr(C, "__version__", "unknown")
