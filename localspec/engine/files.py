"""Checks on a model file before and after llama.cpp reads it, in one line each."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..gguf_info import GGUFFormatError, read_info


class EngineError(RuntimeError):
    """A model could not be loaded or used; the message is one line meant for the user."""


def check_gguf(path: str | Path) -> Path:
    """Fail early, with one line, on a missing file or a file that is not GGUF."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise EngineError(f"{p} is a folder; give the path of a .gguf file inside it")
    if not p.is_file():
        raise EngineError(f"model file not found: {p}")
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
