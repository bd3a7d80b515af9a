"""Re-encoding a GGUF (F32, F16, Q8_0, ...) with llama.cpp's quantize API, safely.

llama.cpp's quantize has no abort hook and takes minutes on a 7B model, so it runs in a child
process (`python -m localspec.engine.quantize SRC DST FTYPE THREADS`, the `main` below) that a
Ctrl-C can kill; the file it writes is promoted only once complete.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import llama_cpp as C

from . import EngineError, default_threads


def quantize(src: str | Path, dst: str | Path, ftype: str = "F32", threads: int | None = None) -> None:
    """Write `src` re-encoded as `ftype` (F32, F16, Q8_0, Q4_1, ...) to `dst`.

    Runs in a child process (llama.cpp's quantize cannot be interrupted) writing to a `.part`
    file of this process's own, which becomes `dst` only once complete: a Ctrl-C, a full disk or
    two first runs at once never leave a half-written `dst`.
    """
    src, dst = Path(src), Path(dst)
    name = f"LLAMA_FTYPE_ALL_{ftype}" if ftype == "F32" else f"LLAMA_FTYPE_MOSTLY_{ftype}"
    if not hasattr(C, name):
        raise EngineError(f"unknown GGUF type {ftype}")
    _remove_stale_parts(dst)
    _check_space(src, dst, ftype)
    tmp = dst.with_name(f"{dst.name}.{_HOST}.{os.getpid()}.part")
    try:
        tmp.open("wb").close()
    except OSError as e:
        raise EngineError(f"cannot write {dst.name} into {dst.parent}: {e.strerror or e}; "
                          "set LOCALSPEC_CACHE to a writable folder") from None
    cmd = [sys.executable, "-m", "localspec.engine.quantize", str(src), str(tmp), ftype,
           str(threads or default_threads())]
    # A session of its own: the terminal's Ctrl-C reaches only this process, which kills the child.
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_die_with_parent)
    complete = False
    try:
        _, err = child.communicate()
        complete = child.returncode == 0 and _whole(tmp)
    finally:
        if child.returncode is None:  # interrupted
            child.kill()
            child.wait()
        if not complete:
            tmp.unlink(missing_ok=True)
    if not complete:
        lines = [ln.strip() for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
        said = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()] or lines
        free = shutil.disk_usage(dst.parent).free
        why = said[-1] if said else f"exit code {child.returncode}"
        raise EngineError(f"making {dst.name} in {dst.parent} from {src.name} failed ({why}; "
                          f"{_mb(free)} free there)")
    tmp.replace(dst)


def _whole(path: Path) -> bool:
    """The header reads and every tensor's data is in the file (a full disk can end it early)."""
    from .gguf import GGUFFormatError, read_info

    try:
        return not read_info(path).truncated
    except (GGUFFormatError, OSError):
        return False


def _check_space(src: Path, dst: Path, ftype: str) -> None:
    """Refuse before writing when the folder clearly lacks the room."""
    from .gguf import GGUFFormatError, read_info

    per_weight = {"F32": 4.0, "F16": 2.0, "BF16": 2.0, "Q8_0": 34 / 32}.get(ftype)
    try:
        need = read_info(src).n_elements * per_weight if per_weight else None
    except (GGUFFormatError, OSError):
        return  # llama.cpp will say what is wrong with the source
    free = shutil.disk_usage(dst.parent).free
    if need and free < need * 1.02:
        raise EngineError(f"not enough space in {dst.parent} to make {dst.name}: it needs about {_mb(need)}, "
                          f"{_mb(free)} is free; free some space or set LOCALSPEC_CACHE to another disk")


_HOST = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-_") or "host"


def _die_with_parent() -> None:
    """In the child, before exec: if localspec itself is killed (SIGKILL, SIGTERM), the quantizer
    must not write on for minutes. Linux only; elsewhere the part file is simply never promoted."""
    if sys.platform.startswith("linux"):
        import ctypes.util

        ctypes.CDLL(ctypes.util.find_library("c") or None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _remove_stale_parts(dst: Path) -> None:
    """`.part` files left by runs on this host that were killed (their process is gone); a cache
    shared with other hosts keeps theirs."""
    prefix = f"{dst.name}.{_HOST}."
    for part in dst.parent.glob(f"{prefix}*.part"):
        pid = part.name[len(prefix): -len(".part")]
        if pid.isdigit() and not _alive(int(pid)):
            part.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def main(src: str, dst: str, ftype: str, threads: str) -> int:
    C.llama_backend_init()
    params = C.llama_model_quantize_default_params()
    params.ftype = getattr(C, f"LLAMA_FTYPE_ALL_{ftype}" if ftype == "F32" else f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.allow_requantize = True
    params.nthread = int(threads)
    return int(C.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params)))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
