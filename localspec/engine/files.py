"""Checks on a model file before and after llama.cpp reads it, in one line each."""

from __future__ import annotations

import errno
import stat
from pathlib import Path
from typing import Sequence

from .gguf import GGUFFormatError, TruncatedHeader, read_info


class EngineError(RuntimeError):
    """A model could not be loaded or used; the message is one line meant for the user."""


_NOT_FILES = ((stat.S_ISFIFO, "a FIFO (a named pipe)"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_gguf(path: str | Path) -> Path:
    """Fail early, with one line, on a path that is not a readable file, or a file that is not GGUF.
    (A FIFO is refused before it is opened: opening one waits for a writer, for ever.)"""
    p = Path(path).expanduser()
    try:
        mode = p.stat().st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise EngineError(f"{p} is a symlink loop: following it never reaches a file") from None
        if isinstance(e, (FileNotFoundError, NotADirectoryError)):
            dangling = " (a symlink to a missing file)" if p.is_symlink() else ""
            raise EngineError(f"model file not found: {p}{dangling}") from None
        raise EngineError(f"cannot read model file {p}: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise EngineError(f"{p} is a folder; give the path of a .gguf file inside it")
    if not stat.S_ISREG(mode):
        what = next((name for test, name in _NOT_FILES if test(mode)), "something other than a file")
        raise EngineError(f"{p} is {what}, not a model file; give the path of a .gguf file")
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise EngineError(f"cannot read model file {p}: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise EngineError(f"not a GGUF file: {p}" + (" (it is empty)" if not magic else ""))
    return p


def load_failure(path: Path, log: Sequence[str]) -> str:
    """Why llama.cpp refused `path`, as one line: read from the header when it says, else from
    llama.cpp's recent warnings and errors, `log` (the reason sits above its generic last line)."""
    try:
        info = read_info(path)
        if info.truncated:
            return (f"the file is truncated: {info.file_size:,} bytes, but its tensors end at byte "
                    f"{info.data_end:,} (an interrupted download or copy?)")
    except TruncatedHeader as e:
        return str(e)
    except GGUFFormatError as e:
        return f"corrupt GGUF header: {e}"
    except OSError as e:
        return f"cannot read it: {e.strerror or e}"
    reasons = [line.split("error loading model: ", 1)[1] for line in log if "error loading model: " in line]
    # The loader's own reason is generic when the GGUF parser refused the file; the parser's first
    # complaint is the useful one then.
    specific = [r for r in reasons if not r.startswith("llama_model_loader: failed to load model from")]
    parser = [line.split(": ", 1)[-1] for line in log if line.startswith("gguf_")]
    if specific:
        return specific[-1]
    if parser:
        return f"corrupt or unsupported GGUF: {parser[0]}"
    return f"corrupt or unsupported GGUF? {log[-1] if log else 'llama.cpp gave no reason'}"


class WorkerError(EngineError):
    """An RPC worker cannot be used (unreachable, another protocol, no RPC in this build)."""


class Cancelled(EngineError):
    """A decode stopped midway: `Model.abort_when` was set, or, off the main thread, an interrupt
    was requested (on the main thread that ends as KeyboardInterrupt); or a slot's request was
    cancelled before its decode (`slots`)."""
