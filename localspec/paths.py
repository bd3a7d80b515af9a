"""Where localspec keeps the files it makes (converted models, controller records, this machine's
checks): one folder, never inside the repository, chosen by one rule for every layer."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from localspec.config import ConfigError


def cache_path() -> Path:
    """Where localspec keeps files it makes (the F32 target, records, checks); never inside the repository."""
    root = os.environ.get("LOCALSPEC_CACHE")
    if root:
        return Path(root).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "localspec"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localspec"


def cache_dir() -> Path:
    """`cache_path()`, created if need be; a folder that cannot be made is a one-line ConfigError."""
    path = cache_path()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "a file is in the way" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror or str(e)
        raise ConfigError(f"cannot use {path} as localspec's cache ({why}); "
                          "set LOCALSPEC_CACHE to a writable folder") from None
    return path
