"""Downloading preset models from the Hugging Face hub, and finding them in its cache.

Downloads go through ``huggingface_hub.hf_hub_download``, so progress bars, resuming and the
standard cache layout (shared with every other HF tool) come from the library. Nothing here
touches the network except :func:`pull`; :func:`cached_file` and :func:`model_status` only look
in the cache.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, NamedTuple

from localspec.config import ConfigError
from .presets import ModelRef, Preset, file_name_problem, load_preset, repo_id_problem


class ModelStatus(NamedTuple):
    """Whether one model of a preset is on this machine."""

    role: str
    """``target`` or ``draft``."""
    ref: ModelRef
    """Where the model comes from."""
    present: bool
    """True when the file is in the HF cache (always True for built-in models)."""
    path: Path | None
    """Local path when present and known; None for built-in models (resolved on first use)."""
    size_bytes: int | None
    """File size when present on disk."""


def cache_dir() -> Path:
    """The HF hub cache, read from the environment at call time (the library reads it once at
    import), so HF_HUB_CACHE / HF_HOME set later still count."""
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    """True when HF_HUB_OFFLINE asks for no network (checked at call time, like cache_dir)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return value in {"1", "ON", "YES", "TRUE"} or bool(getattr(constants, "HF_HUB_OFFLINE", False))


def cached_file(repo: str | None, file: str | None) -> Path | None:
    """Path of ``repo/file`` in the HF cache, or None when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, file, cache_dir=cache_dir())
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def resolve_model(ref: ModelRef, notice: Callable[[str], Any] = print, preset: str | None = None) -> Path:
    """Local path of a model: built-in models come from localspec.loading.defaults, hub models from the
    Hugging Face cache only (never the network; ``localspec pull`` downloads)."""
    if ref.embedded:
        from . import defaults  # lazy: defaults may load llama.cpp to make a copy

        return defaults.embedded_path(ref.embedded, notice)
    path = cached_file(ref.repo, ref.file)
    if path is None:
        how = f"localspec pull {preset}" if preset else f"localspec pull {ref.repo} {ref.file}"
        raise ConfigError(f"model {ref.file} ({ref.repo}/{ref.file}) is not downloaded; run `{how}`")
    return path


def model_status(preset: Preset) -> list[ModelStatus]:
    """(role, ref, present, path, size_bytes) for each model of ``preset``, from the cache only."""
    rows = []
    for role, ref in preset.models():
        if ref.embedded:
            rows.append(ModelStatus(role, ref, True, None, None))
            continue
        path = cached_file(ref.repo, ref.file)
        rows.append(ModelStatus(role, ref, path is not None, path, path.stat().st_size if path else None))
    return rows


def pull(
    preset_or_repo: str,
    file: str | None = None,
    progress: bool = True,
    notice: Callable[[str], Any] = print,
) -> list[Path]:
    """Download a preset's models (or one ``repo`` ``file``) into the HF cache; return their paths.

    Files already cached are not fetched again. Offline (HF_HUB_OFFLINE=1 or no connection) a
    missing file raises ConfigError saying what would be downloaded and how to place it by hand.
    """
    looks_like_repo = "/" in preset_or_repo and not preset_or_repo.endswith((".yaml", ".yml"))
    if file is not None or looks_like_repo:
        problem = repo_id_problem(preset_or_repo)
        if problem:
            raise ConfigError(f"repo {problem}")
    if file is not None:
        problem = file_name_problem(file)
        if problem:
            raise ConfigError(f"FILE {problem}")
        models = [("model", ModelRef(repo=preset_or_repo, file=file))]
    elif looks_like_repo:
        raise ConfigError(f"'{preset_or_repo}' looks like a repo id; name the GGUF too: localspec pull REPO FILE")
    else:
        models = load_preset(preset_or_repo).models()
    if offline():
        # Name every missing file in one message rather than failing on the first.
        missing = [(role, ref) for role, ref in models if not ref.embedded and cached_file(ref.repo, ref.file) is None]
        if missing:
            raise ConfigError(_by_hand(missing, "offline mode (HF_HUB_OFFLINE) is on", None))
    paths = []
    for i, (role, ref) in enumerate(models):
        if ref.embedded:
            notice(f"{role}: {ref.embedded} is built into localspec; nothing to download from the hub "
                   "(it comes from the Python package index on first use)")
            continue
        try:
            paths.append(_fetch(role, ref, progress, notice))
        except _Unreachable as e:
            # The hub is out of reach for the files after this one too: name every missing one.
            rest = [(r, m) for r, m in models[i + 1:] if not m.embedded and cached_file(m.repo, m.file) is None]
            raise ConfigError(_by_hand([(role, ref), *rest], e.reason, e.size)) from None
    return paths


class _Unreachable(Exception):
    """`_fetch` could not reach the hub for a file (`reason`; `size` when its metadata came)."""

    def __init__(self, reason: str, size: int | None):
        super().__init__(reason)
        self.reason, self.size = reason, size


def _fetch(role: str, ref: ModelRef, progress: bool, notice) -> Path:
    found = cached_file(ref.repo, ref.file)
    if found is not None:
        notice(f"{role}: {ref} already downloaded ({format_size(found.stat().st_size)}): {found}")
        return found

    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub import utils as hf

    endpoint = os.environ.get("HF_ENDPOINT") or None
    size = None
    was_disabled = hf.are_progress_bars_disabled()
    if not progress:
        hf.disable_progress_bars()
    try:
        size = get_hf_file_metadata(hf_hub_url(ref.repo, ref.file, endpoint=endpoint)).size
        notice(f"{role}: downloading {ref} ({format_size(size)})")
        path = hf_hub_download(ref.repo, ref.file, cache_dir=cache_dir(), endpoint=endpoint)
    except hf.GatedRepoError:
        raise ConfigError(f"{ref.repo} is gated; accept its license on huggingface.co and set HF_TOKEN") from None
    except hf.RepositoryNotFoundError:
        raise ConfigError(f"repo {ref.repo} not found on the hub (or it is private)") from None
    except hf.RevisionNotFoundError:
        raise ConfigError(f"repo {ref.repo} has no 'main' revision") from None
    except (hf.LocalEntryNotFoundError, hf.OfflineModeIsEnabled):
        # Raised by the library when it cannot reach the hub and the file is not cached.
        raise _Unreachable("cannot reach the Hugging Face hub", size) from None
    except hf.EntryNotFoundError:
        raise ConfigError(f"file {ref.file} not found in repo {ref.repo}") from None
    except Exception as e:  # network errors differ across library versions (requests / httpx)
        raise _Unreachable(f"download failed ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else 'no detail'})", size) from None
    finally:
        if not progress and not was_disabled:
            hf.enable_progress_bars()
    notice(f"{role}: saved {ref} to {path}")
    return Path(path)


def _by_hand(models: list[tuple[str, ModelRef]], reason: str, size: int | None) -> str:
    """One line: what would be downloaded and how to put it in place without this machine's network
    (`size`: the first file's, when known)."""
    wanted = ", ".join(f"{role} {ref.repo}/{ref.file}" + (f" ({format_size(size)})" if size and i == 0 else "")
                       for i, (role, ref) in enumerate(models))
    commands = "; ".join(f"`{_cli()} download {ref.repo} {ref.file}`" for _, ref in models)
    folders = ("folder " if len(models) == 1 else "folders ") + ", ".join(
        "models--" + ref.repo.replace("/", "--") for _, ref in models
    )
    urls = ", ".join(f"https://huggingface.co/{ref.repo}/resolve/main/{ref.file}" for _, ref in models)
    flag_of = {"target": "--target", "draft": "--draft"}
    flags = " / ".join(dict.fromkeys(flag_of.get(role, "--target/--draft") for role, _ in models))
    it, files = ("them", "files") if len(models) > 1 else ("it", "file")
    return (
        f"{reason}; would download {wanted}. "
        f"To place {it} by hand: on a machine with network run {commands} "
        f"and copy the cache {folders} into {cache_dir()}, "
        f"or fetch {urls} and pass the {files} with {flags} PATH"
    )


def _cli() -> str:
    """The hub's command-line tool: `hf` since huggingface_hub 0.34, `huggingface-cli` before."""
    from huggingface_hub import __version__

    major, minor = (int(x) for x in __version__.split(".")[:2])
    return "hf" if (major, minor) >= (0, 34) else "huggingface-cli"


def format_size(n: int | None) -> str:
    """Bytes as a short human string (decimal units, as the hub shows them)."""
    if n is None:
        return "size unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
