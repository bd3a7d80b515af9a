"""Ctrl-C while llama.cpp works.

Python runs its SIGINT handler only between bytecodes, so during a long C call the
KeyboardInterrupt surfaces inside whichever ctypes callback runs next (a log line, load progress)
where ctypes prints and discards it: loading carried on and the run ended with exit code 0. Here,
during such a call, SIGINT only sets a flag; the callbacks read it and ask llama.cpp to stop (load
progress returns false, a decode's abort callback returns true), and the KeyboardInterrupt is raised
once the call has returned. A second Ctrl-C during the same call exits at once (130), for the
calls that never ask: creating a context, a prefill on a GPU backend.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

_requested = threading.Event()


def request() -> None:
    """Note a Ctrl-C; raised when the current deferred section ends."""
    _requested.set()


def requested() -> bool:
    return _requested.is_set()


def raise_pending() -> None:
    """Raise a Ctrl-C that a callback noted outside a deferred section (costs one flag read)."""
    if _requested.is_set() and threading.current_thread() is threading.main_thread():
        _requested.clear()
        raise KeyboardInterrupt


def _on_sigint(*_) -> None:
    if _requested.is_set():
        # A second Ctrl-C while llama.cpp is in a call that never asks (creating a context, a GPU
        # prefill): the user means it, so leave now.
        os.write(2, b"\ninterrupted\n")
        os._exit(130)
    request()


@contextmanager
def deferred() -> Iterator[None]:
    """Run a llama.cpp call that may take seconds; a Ctrl-C during it stops it and is raised after.

    Only the main thread receives signals; elsewhere (the chat screen's workers) this does nothing.
    """
    raise_pending()
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main else None
    # None: a handler installed outside Python, which could not be put back; SIG_IGN: ignored.
    swap = previous not in (None, signal.SIG_IGN)
    if swap:
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        if swap:
            signal.signal(signal.SIGINT, previous)
        if on_main and _requested.is_set():
            _requested.clear()
            raise KeyboardInterrupt
