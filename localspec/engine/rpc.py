"""llama.cpp's RPC backend: workers on other machines (or processes) that hold a model's layers.

- `probe`: the RPC handshake done from Python, so an unreachable or mismatched worker is one error
  before loading (llama.cpp's own connect aborts the whole process on failure).
- `add_workers`: registers each worker's devices in ggml's registry, as llama.cpp's
  `common/arg.cpp` `add_rpc_devices` does; `devices_for` lists a model's devices (its workers
  first, then local GPUs), so that a draft stays local while the target uses the workers.
- `watch`: ggml's abort callback (`ggml_set_abort_callback`): a worker lost mid-generation becomes
  one line naming it, after the `on_lost` hooks ran (chat keeps the partial reply), instead of a
  C message and a core dump.
- `serve`: this process as a worker (`ggml_backend_rpc_start_server`), for `localspec worker`.

The protocol has no authentication: a worker runs whatever graph a client sends it.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Callable

import llama_cpp as C

from .backend import describe, device_handles, ggml  # noqa: F401 - describe: for the worker command
from .files import WorkerError

REBUILD = ('this llama-cpp-python was built without RPC support; rebuild it with '
           'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir llama-cpp-python')
HELLO = 14           # RPC_CMD_HELLO, fixed across protocol versions (ggml-rpc.cpp static_assert)
CAPS = 24            # RPC_CONN_CAPS_SIZE: the hello's transport capabilities (zeros: plain TCP)
PROBE_SECONDS = 5.0  # a worker that does not answer its handshake in this long is reported
_DEFAULT_PROTOCOL = (7, 0)   # ggml-rpc.h of llama-cpp-python 0.3.36, when no header is installed


def protocol() -> tuple[int, int]:
    """The RPC protocol (major, minor) this llama.cpp speaks: from its installed ggml-rpc.h."""
    for base in (Path(C.__file__).parent / "include", Path(C.__file__).parent / "lib" / "include"):
        try:
            text = (base / "ggml-rpc.h").read_text()
        except OSError:
            continue
        found = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "#define" and parts[1].startswith("RPC_PROTO_"):
                found[parts[1]] = int(parts[2])
        if "RPC_PROTO_MAJOR_VERSION" in found:
            return found["RPC_PROTO_MAJOR_VERSION"], found.get("RPC_PROTO_MINOR_VERSION", 0)
    return _DEFAULT_PROTOCOL


def _registry() -> int:
    """The RPC backend's registry entry, or WorkerError(REBUILD)."""
    lib = ggml()
    if lib is None:
        raise WorkerError(REBUILD)
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:   # a build with dynamically loaded backends registers them on demand
        lib.ggml_backend_load_all()
        reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise WorkerError(REBUILD)
    return reg


def supported() -> bool:
    try:
        _registry()
    except WorkerError:
        return False
    return True


def split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def probe(endpoint: str, timeout: float = PROBE_SECONDS) -> tuple[int, int, int]:
    """The worker's protocol version (major, minor, patch), by the RPC handshake; WorkerError
    naming the worker when it cannot be reached, does not answer, or speaks another version."""
    try:
        with socket.create_connection(split(endpoint), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack("<BQ", HELLO, CAPS) + bytes(CAPS))
            size = struct.unpack("<Q", _read(sock, 8))[0]
            if size < 4:
                raise WorkerError(f"RPC worker {endpoint} answered the handshake with {size} bytes: not a llama.cpp RPC server?")
            major, minor, patch = _read(sock, size)[:3]
    except socket.timeout:
        raise WorkerError(f"RPC worker {endpoint} did not answer its handshake within {timeout:g} s "
                          "(is it serving another client? a worker serves one at a time)") from None
    except OSError as e:
        raise WorkerError(f"cannot reach RPC worker {endpoint}: {e.strerror or e}") from None
    ours = protocol()
    if major != ours[0] or minor > ours[1]:
        raise WorkerError(f"RPC worker {endpoint} speaks protocol {major}.{minor}.{patch}, this llama.cpp "
                          f"{ours[0]}.{ours[1]}: run the same llama.cpp version on both sides")
    return major, minor, patch


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError(0, "it closed the connection during the handshake")
        data += chunk
    return data


_added: dict[str, list[int]] = {}   # endpoint -> its devices, registered once per process
_lock = threading.Lock()


def add_workers(endpoints: tuple[str, ...]) -> list[int]:
    """Register every worker's devices (each checked by `probe` first); return them in order."""
    if not endpoints:
        return []
    reg = _registry()
    lib = ggml()
    add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
        lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server"))
    devices = []
    with _lock:
        for endpoint in endpoints:
            if endpoint not in _added:
                probe(endpoint)
                watch()   # llama.cpp connects now: a failure from here on is one line, not a core dump
                _workers.append(endpoint)
                worker = add(endpoint.encode())
                if not worker:
                    raise WorkerError(f"RPC worker {endpoint} offers no devices")
                lib.ggml_backend_register(worker)
                _added[endpoint] = [d for d, info in ((d, describe(d)) for d in device_handles())
                                    if info["backend"] == "RPC" and info["description"] == endpoint]
            devices += _added[endpoint]
    return devices


def local_gpus() -> list[int]:
    """The local devices llama.cpp would pick by itself: discrete GPUs, else integrated ones."""
    found = [(d, describe(d)) for d in device_handles()]
    gpus = [d for d, info in found if info["type"] == "gpu" and info["backend"] != "RPC"]
    return gpus or [d for d, info in found if info["type"] == "igpu"]


def devices_for(endpoints: tuple[str, ...]) -> ctypes.Array | None:
    """The NULL-terminated device list for a model's params: its workers, then local GPUs; None
    (llama.cpp's own choice) while no worker is registered in this process."""
    workers = add_workers(endpoints)
    if not _added:
        return None
    chosen = workers + local_gpus()
    return (ctypes.c_void_p * (len(chosen) + 1))(*chosen, None)


# -- a lost worker ------------------------------------------------------------------------------

_workers: list[str] = []
_hooks: list[Callable[[], None]] = []
_callback = None


def on_lost(hook: Callable[[], None]) -> Callable[[], None]:
    """Run `hook` (save what can be saved) before the process ends on a lost worker; returns a
    function that removes it."""
    _hooks.append(hook)
    return lambda: _hooks.remove(hook) if hook in _hooks else None


def lost_line(message: str) -> str:
    """The one line a failure inside llama.cpp ends with: which worker stopped answering."""
    down = []
    for endpoint in _workers:
        try:   # the hello, not a bare connect: a killed worker's listening socket may outlive its connection
            probe(endpoint, timeout=1.0)
        except WorkerError:
            down.append(endpoint)
    reason = message.split(": ", 1)[-1].strip() or "llama.cpp aborted"
    if down:
        return f"error: RPC worker {', '.join(down)} stopped answering ({reason}); the generation was cut off"
    named = f" (workers {', '.join(_workers)})" if _workers else ""
    return f"error: llama.cpp stopped{named}: {reason}"


def _aborted(message: bytes | None) -> None:
    text = (message or b"").decode("utf-8", "replace")
    try:
        for hook in list(_hooks):
            try:
                hook()
            except Exception:  # noqa: BLE001 - nothing may keep the line below from the user
                pass
        line = lost_line(text)
    finally:
        for stream in (sys.stdout, sys.stderr):   # what was printed of the reply stays
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        if os.environ.get("LOCALSPEC_VERBOSE"):
            os.write(2, f"{text}\n".encode())
        os.write(2, f"\n{line}\n".encode() if _mid_line() else f"{line}\n".encode())
        os._exit(2)   # abort() would follow: a core dump and ggml's backtrace


def _mid_line() -> bool:
    """Whether stdout and stderr are one terminal whose cursor may sit after streamed text."""
    try:
        return os.isatty(1) and os.isatty(2) and os.ttyname(1) == os.ttyname(2)
    except OSError:
        return False


def watch() -> None:
    """Install the abort callback (once per process)."""
    global _callback
    if _callback is None:
        _callback = ctypes.CFUNCTYPE(None, ctypes.c_char_p)(_aborted)
        ggml().ggml_set_abort_callback(ctypes.cast(_callback, ctypes.c_void_p))


# -- this process as a worker ------------------------------------------------------------------


def worker_devices(names: tuple[str, ...] = ()) -> list[int]:
    """The devices a worker serves: those named (`--device`), else every local GPU, else the CPU."""
    lib = ggml()
    if names:
        chosen = []
        for name in names:
            dev = lib.ggml_backend_dev_by_name(name.encode())
            if not dev:
                known = ", ".join(describe(d)["name"] for d in device_handles())
                raise WorkerError(f"no device {name!r} here (devices: {known})")
            chosen.append(dev)
        return chosen
    return local_gpus() or [d for d in device_handles() if describe(d)["type"] == "cpu"][:1]


def serve(host: str, port: int, threads: int, devices: list[int], cache_dir: str | None) -> threading.Thread:
    """Start serving `devices` on host:port in a daemon thread (llama.cpp's loop never returns)."""
    reg = _registry()
    start = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_void_p))(
        ggml().ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_start_server"))
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:   # llama.cpp only prints a failed bind and returns: check it here, for one clear line
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
        except OSError as e:
            raise WorkerError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    endpoint = f"{host}:{port}".encode()
    cache = os.fsencode(cache_dir) if cache_dir else None
    array = (ctypes.c_void_p * len(devices))(*devices)
    thread = threading.Thread(target=start, args=(endpoint, cache, threads, len(devices), array),
                              name="rpc-worker", daemon=True)
    thread.start()
    return thread
