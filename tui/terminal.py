"""Giving the terminal back without Textual's shutdown, for a process that must end at once: a
lost RPC worker ends it from inside llama.cpp (`localspec.engine.rpc`)."""

from __future__ import annotations

import sys
import termios
from typing import Callable

from localspec.engine import on_worker_lost

RESET = "\x1b[?1000l\x1b[?1003l\x1b[?1015l\x1b[?1006l\x1b[?25h\x1b[?1049l"
"""Mouse reports off, the cursor shown, the main screen back."""


def restore_terminal(driver) -> None:
    """Undo what the app's driver set up: the screen modes, then the tty's own modes as they were
    (`attrs_before`, Textual's Linux driver)."""
    out = sys.__stdout__
    if out is None or not out.isatty():
        return
    out.write(RESET)
    out.flush()
    before = getattr(driver, "attrs_before", None)
    if before is not None:
        termios.tcsetattr(out.fileno(), termios.TCSANOW, before)


def keep_on_loss(writer, app) -> Callable[[], None]:
    """While a reply is generated: if its RPC worker is lost, save the reply so far (partial) and
    give the terminal back before the process ends with its one line. Returns the undo."""
    return on_worker_lost(lambda: (writer and writer.finish(partial=True),
                                   restore_terminal(getattr(app, "_driver", None))))
