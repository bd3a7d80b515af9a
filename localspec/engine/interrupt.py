"""Ctrl-C while llama.cpp works.

Python runs its SIGINT handler only between bytecodes, so during a long C call the
KeyboardInterrupt surfaces inside whichever ctypes callback runs next (a log line, load progress)
where ctypes prints and discards it: loading carried on and the run ended with exit code 0. Here,
during such a call, a Ctrl-C only notes an interrupt; llama.cpp is asked to stop (load progress
returns false, a decode's abort check returns true) and the KeyboardInterrupt is raised once the
call has returned. A second Ctrl-C while the first is still pending exits at once (130), for the
calls that never ask: creating a context, a prefill on a GPU backend.

The note is one byte that llama.cpp reads itself (`ABORT_CHECK`): its CPU backend asks the abort
callback after every graph node, about 500 times per decode of a 30-layer model, and a Python
callback there would take the GIL each time. So the pending Ctrl-C must reach that byte while the
main thread sits in C, where Python cannot run its handler: Python's own C-level signal handler
writes each signal's number to a wakeup socket (`signal.set_wakeup_fd`), and a watcher thread,
which can take the GIL the main thread has let go, sets the byte.
"""

from __future__ import annotations

import _signal  # signal's C functions, without the enum wrappers: see deferred()
import ctypes
import os
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

_flag = ctypes.create_string_buffer(2)
"""Byte 0 is 1 while an interrupt is pending; byte 1 stays 0, so strlen reads 0 or 1."""


def _strlen_address() -> int:
    # POSIX: the process's own symbols, libc's among them (find_library would run a subprocess)
    libc = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
    return ctypes.cast(libc.strlen, ctypes.c_void_p).value


ABORT_CHECK = (_strlen_address(), ctypes.cast(_flag, ctypes.c_void_p))
"""(function, data) for llama_set_abort_callback: libc's strlen over `_flag` is a C function of one
pointer that answers 1 while an interrupt is pending and 0 otherwise, with no Python in between.
(It returns a size_t where a bool is expected; both come back in the same register and the value is
only ever 0 or 1.)"""


def request() -> None:
    """Note an interrupt; raised when the current deferred section ends."""
    _flag[0] = b"\x01"


def requested() -> bool:
    return _flag[0] != b"\x00"


def _consume() -> bool:
    """Take the pending interrupt, if any (main thread only: it is the one to raise it)."""
    if requested() and threading.current_thread() is threading.main_thread():
        _flag[0] = b"\x00"
        return True
    return False


def raise_pending() -> None:
    """Raise an interrupt noted outside a deferred section (costs one byte read)."""
    if _consume():
        raise KeyboardInterrupt


_wakeup: socket.socket | None = None


def _watch(reader: socket.socket) -> None:
    """The watcher thread: every SIGINT Python's signal handler wrote to the wakeup socket during a
    deferred section. It is the only place presses are counted, so each counts once."""
    while data := reader.recv(64):
        for _ in range(data.count(signal.SIGINT)):
            if requested():
                # A second Ctrl-C while the first is pending: llama.cpp is in a call that never
                # asks, and the user means it, so leave now.
                os.write(2, b"\ninterrupted\n")
                os._exit(130)
            request()


def _wakeup_fd() -> int:
    """The write end of the wakeup socket, the watcher started on first use."""
    global _wakeup
    if _wakeup is None:
        reader, writer = socket.socketpair()
        writer.setblocking(False)  # set_wakeup_fd requires it: a signal handler must never block
        threading.Thread(target=_watch, args=(reader,), name="localspec-interrupt", daemon=True).start()
        _wakeup = writer
    return _wakeup.fileno()


def _forget_watcher() -> None:
    global _wakeup
    _wakeup = None  # a forked child has the socket but not the thread: it starts its own


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forget_watcher)


def _on_sigint(*_) -> None:
    """Python's handler has nothing left to do: the watcher noted the press from the wakeup byte.
    (Installed so that SIGINT raises no KeyboardInterrupt in the middle of the section.)"""


@contextmanager
def deferred() -> Iterator[None]:
    """Run a llama.cpp call that may take seconds; a Ctrl-C during it stops it and is raised after.

    Only the main thread receives signals; elsewhere (the chat screen's workers) this does nothing.
    An interrupt the watcher notes just after the section ends is raised by the next section or
    `raise_pending`. While the section runs, other signals' wakeup bytes reach the watcher, not a
    previous wakeup socket (an asyncio loop's): the sections run in the CLI's synchronous commands.
    """
    raise_pending()
    on_main = threading.current_thread() is threading.main_thread()
    # Every decode runs in a section, so the swap must cost little: signal.getsignal and
    # signal.signal turn handlers into enums through a failed lookup, ~20 µs a call.
    previous = _signal.getsignal(signal.SIGINT) if on_main else None
    # None: a handler installed outside Python, which could not be put back; SIG_IGN: ignored.
    swap = previous not in (None, signal.SIG_IGN)
    if swap:
        _signal.signal(signal.SIGINT, _on_sigint)
        previous_fd = _signal.set_wakeup_fd(_wakeup_fd(), warn_on_full_buffer=False)
    try:
        yield
    finally:
        if swap:
            _signal.set_wakeup_fd(previous_fd)
            _signal.signal(signal.SIGINT, previous)
        if _consume():
            raise KeyboardInterrupt
