"""A native crash shows where it happened and how to report it.

A fault inside llama.cpp, a GPU driver or a backend kills the process with a signal (SIGSEGV,
SIGBUS, SIGFPE, SIGILL, SIGABRT) and, unaided, prints nothing at all: the first CUDA run of
localspec ended that way in every process. Python's `faulthandler` dumps every thread's Python
stack at such a signal, which says which call into llama.cpp faulted.

The line after the stack (how to report it) cannot come from the dying process: faulthandler runs
in the signal handler and then lets the signal kill it. So at start a small watcher process is
forked (before any model, thread or socket exists, so it holds nothing else): faulthandler writes
into a pipe, the watcher copies what arrives to stderr, and when the pipe closes (the process
ended, however) it adds the report line if a stack came through. It costs one fork at start (~1
ms); where there is no fork (Windows) the stack goes straight to stderr, without the line.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

REPORT = ("localspec: the process crashed inside native code (llama.cpp or a GPU driver); the Python stack "
          "above shows the call. Please report it with that stack and the output of `localspec doctor`, "
          "or run with LOCALSPEC_VERBOSE=1 to see llama.cpp's own log up to the crash.\n")
_MARK = b"Fatal Python error"
_installed = False


def install() -> None:
    """Dump the Python stack of every thread on a fatal signal, followed by the report line."""
    global _installed
    if _installed or faulthandler.is_enabled():
        return
    _installed = True
    if not hasattr(os, "fork") or sys.stderr is None:
        faulthandler.enable(all_threads=True)
        return
    try:
        stderr = sys.stderr.fileno()
        read, write = os.pipe()   # not inherited by subprocesses (O_CLOEXEC)
        pid = os.fork()
    except (OSError, ValueError, AttributeError):
        faulthandler.enable(all_threads=True)
        return
    if pid == 0:
        _watch(read, write, stderr)   # never returns
    os.close(read)
    faulthandler.enable(file=write, all_threads=True)


def _watch(read: int, write: int, stderr: int) -> None:
    """The watcher: copy the pipe to stderr until the process closes it, then the line if needed."""
    code = 0
    try:
        os.close(write)
        # Ctrl-C and a terminal hang-up are for the process, which decides; the watcher only
        # ends with the pipe. Every other descriptor is closed: a caller waiting for the end of
        # our stdout, or a port to free, must not wait for the watcher.
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGTSTP):
            signal.signal(sig, signal.SIG_IGN)
        os.closerange(0, stderr)
        os.closerange(stderr + 1, read)
        os.closerange(read + 1, 1 << 16)
        seen, tail = False, b""
        while chunk := os.read(read, 1 << 16):
            os.write(stderr, chunk)
            seen = seen or _MARK in tail + chunk
            tail = chunk[-len(_MARK):]
        if seen:
            os.write(stderr, b"\n" + REPORT.encode())
    except BaseException:  # noqa: BLE001 - the watcher must never run the parent's code
        code = 1
    finally:
        os._exit(code)
