"""Model presets: a target GGUF, an optional draft GGUF and the settings that suit the pair.

Each preset is one YAML file in the repository's top-level ``models/`` folder (the file stem is
the preset name); ``models/README.md`` documents the format. Loading is strict: any problem
raises :class:`~localspec.config.ConfigError` with one line naming the file and the field, so a
typo in a hand-written preset never turns into a silently different run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from localspec.config import DRAFTERS, NEEDS_DRAFT, ConfigError, SamplingConfig
from .defaults import EMBEDDED, MAX_PRESET_BYTES, read_capped, shown

_TOP_FIELDS = {"description", "target", "draft", "drafter", "sampling", "k", "n_ctx", "note", "verified", "gpu"}
_OPTIONAL = {"draft", "note", "gpu"}
GPU_FIELDS = ("flash_attn", "cache_type_k", "cache_type_v", "draft_cache_type_k", "draft_cache_type_v",
              "n_batch", "split_mode", "tensor_split", "main_gpu", "stable_shapes")
"""What a preset's optional `gpu` mapping may set: the device options of the same names (a flag
overrides each); RPC workers name machines, so only the command line gives them."""
_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p")
MAX_DEPTH = 16
"""How deep a preset's YAML may nest (a real one: 3 levels). PyYAML builds nodes recursively, so a
20,000-deep file would end in RecursionError."""
MAX_ALIASES = 16
"""How many aliases (`*name`) a preset may use: each may repeat a whole subtree, so a few dozen
nested ones (an alias bomb) make a value whose text runs to gigabytes."""


@dataclass(frozen=True)
class ModelRef:
    """Where one GGUF comes from: a file in a Hugging Face repo, or a built-in model."""

    repo: str | None = None
    """Hugging Face repo id (``owner/name``); None for embedded models."""
    file: str | None = None
    """GGUF file name inside ``repo``; None for embedded models."""
    embedded: str | None = None
    """Name of a built-in model (one of ``EMBEDDED``); None for hub models."""

    def __str__(self) -> str:
        if self.embedded:
            return f"{self.embedded} (built-in)"
        return f"{self.repo}/{self.file}"


@dataclass(frozen=True)
class Preset:
    """A validated preset file."""

    name: str
    """Preset name: the YAML file's stem."""
    description: str
    """One line saying what the pair is."""
    target: ModelRef
    """The model whose distribution the output follows exactly."""
    draft: ModelRef | None
    """The small model that proposes tokens; None unless ``drafter`` is ``model``."""
    drafter: str
    """``auto``, ``model``, ``lookup`` or ``none`` (see ``DRAFTERS``)."""
    temperature: float
    """Suggested softmax temperature (0 = greedy)."""
    top_k: int
    """Suggested top-k cut (0 disables)."""
    top_p: float
    """Suggested nucleus cut (1.0 disables)."""
    min_p: float
    """Suggested min-p cut (0 disables)."""
    k: int | None
    """Fixed number of draft tokens per step; None means the adaptive controller chooses."""
    n_ctx: int
    """Context length (tokens) for both models."""
    note: str
    """Short advice for this pair (speed, memory, caveats)."""
    verified: bool
    """True when the repo ids and file names were checked against the hub."""
    path: Path
    """The YAML file this preset was read from."""
    gpu: dict = field(default_factory=dict)
    """Device options (`GPU_FIELDS`) the preset sets: flash attention, KV cache types, batch, split."""

    def sampling(self, seed: int | None = None) -> SamplingConfig:
        """The preset's suggested sampling settings as a SamplingConfig."""
        return SamplingConfig(self.temperature, self.top_k, self.top_p, self.min_p, seed)

    def models(self) -> list[tuple[str, ModelRef]]:
        """(role, ref) for the target and, when there is one, the draft."""
        return [("target", self.target)] + ([("draft", self.draft)] if self.draft else [])


def preset_dir() -> Path:
    """The folder holding the shipped preset files.

    A wheel installs ``models/`` as the data package ``localspec/_models`` (see pyproject.toml);
    a source checkout or an editable install reads the repository's ``models/`` directly.
    """
    here = Path(__file__).resolve().parents[1]   # localspec/, two folders above this module
    installed = here / "_models"
    if installed.is_dir():
        return installed
    return here.parent / "models"


def list_presets() -> list[Preset]:
    """Every shipped preset, sorted by name."""
    return [_load_file(p) for p in sorted(preset_dir().glob("*.yaml"))]


def load_preset(name_or_path: str | os.PathLike[str]) -> Preset:
    """Load a shipped preset by name, or any preset file by path."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or os.sep in text or Path(text).is_file():
        path = Path(text)
        if not path.exists():   # a device or a FIFO exists; what it holds is read with a cap
            raise ConfigError(f"preset file {path} does not exist")
        if path.is_dir():
            raise ConfigError(f"preset file {path} is a folder")
        return _load_file(path)
    path = preset_dir() / f"{text}.yaml"
    if not path.is_file():
        names = ", ".join(p.stem for p in sorted(preset_dir().glob("*.yaml"))) or "none"
        raise ConfigError(f"unknown preset '{text}'; available: {names}")
    return _load_file(path)


# ---------------------------------------------------------------- validation


def _load_file(path: Path) -> Preset:
    try:
        with path.open("rb") as f:
            text = read_capped(f, MAX_PRESET_BYTES, f"preset file {path}").decode("utf-8")
        _check_shape(path, text)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: invalid YAML{where}: {e.problem or e.context}") from None
    except ConfigError:
        raise
    except (yaml.YAMLError, OSError, UnicodeDecodeError, ValueError) as e:
        # ValueError: an integer past Python's 4300-digit limit
        raise ConfigError(f"{path}: cannot read preset: {e}".replace("\n", " ")) from None
    return _parse(path, data)


def _check_shape(path: Path, text: str) -> None:
    """Refuse YAML nested deeper than MAX_DEPTH or with more than MAX_ALIASES aliases, from the
    parser's events (which keeps its own stack), before anything recursive builds it."""
    depth = aliases = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(f"{path}: nested deeper than {MAX_DEPTH} levels (a preset has 3)")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise ConfigError(f"{path}: more than {MAX_ALIASES} YAML aliases (*name); write the values out")


def _parse(path: Path, data: Any) -> Preset:
    def fail(field: str, problem: str) -> ConfigError:
        return ConfigError(f"{path}: {field}: {problem}")

    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of fields, got {_kind(data)}")
    _check_keys(data, _TOP_FIELDS, _TOP_FIELDS - _OPTIONAL, "", fail)

    drafter = data["drafter"]
    if drafter not in DRAFTERS:
        raise fail("drafter", f"must be one of {', '.join(DRAFTERS)}, got {shown(drafter)}")
    target = _model_ref(data["target"], "target", fail)
    if target is None:
        raise fail("target", "must not be null")
    draft = _model_ref(data.get("draft"), "draft", fail)
    if drafter in NEEDS_DRAFT and draft is None:
        raise fail("draft", f"drafter '{drafter}' needs a draft model")
    if drafter not in NEEDS_DRAFT and draft is not None:
        raise fail("draft", f"must be null when drafter is '{drafter}'")

    sampling = data["sampling"]
    if not isinstance(sampling, dict):
        raise fail("sampling", f"must be a mapping, got {_kind(sampling)}")
    _check_keys(sampling, set(_SAMPLING_FIELDS), set(_SAMPLING_FIELDS), "sampling.", fail)
    temperature = _number(sampling["temperature"], "sampling.temperature", fail, lambda v: v >= 0, ">= 0")
    top_k = _integer(sampling["top_k"], "sampling.top_k", fail, 0)
    top_p = _number(sampling["top_p"], "sampling.top_p", fail, lambda v: 0 < v <= 1, "in (0, 1]")
    min_p = _number(sampling["min_p"], "sampling.min_p", fail, lambda v: 0 <= v < 1, "in [0, 1)")

    k = data["k"]
    if k != "auto" and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
        raise fail("k", f"must be 'auto' or an integer >= 0, got {shown(k)}")
    n_ctx = _integer(data["n_ctx"], "n_ctx", fail, 16)

    for field in ("description", "note"):
        if not isinstance(data.get(field, ""), str):
            raise fail(field, f"must be a string, got {_kind(data[field])}")
    if not isinstance(data["verified"], bool):
        raise fail("verified", f"must be true or false, got {shown(data['verified'])}")

    gpu = data.get("gpu") or {}
    if not isinstance(gpu, dict):
        raise fail("gpu", f"must be a mapping, got {_kind(gpu)}")
    _check_keys(gpu, set(GPU_FIELDS), set(), "gpu.", fail)
    gpu = {key: ",".join(map(str, v)) if isinstance(v, list) else v for key, v in gpu.items()}
    for key in ("flash_attn", "stable_shapes"):
        if isinstance(gpu.get(key), bool):   # YAML reads a bare on/off as true/false
            gpu[key] = "on" if gpu[key] else "off"
    if "n_batch" in gpu:
        from localspec.config import MIN_BATCH

        _integer(gpu["n_batch"], "gpu.n_batch", fail, MIN_BATCH)
    try:   # the values are checked by the rule the flags go through
        from localspec.config import Placement, parse_list

        Placement(split_mode=gpu.get("split_mode", "layer"), main_gpu=gpu.get("main_gpu", 0),
                  flash_attn=gpu.get("flash_attn", "auto"), stable_shapes=gpu.get("stable_shapes", "auto"),
                  tensor_split=parse_list(gpu.get("tensor_split"), "tensor_split", float),
                  cache_type_k=gpu.get("cache_type_k", "f16"), cache_type_v=gpu.get("cache_type_v", "f16"))
        Placement(cache_type_k=gpu.get("draft_cache_type_k", "f16"), cache_type_v=gpu.get("draft_cache_type_v", "f16"))
    except ConfigError as e:
        raise fail("gpu", str(e).replace("--", "").replace("-", "_")) from None
    except TypeError as e:
        raise fail("gpu", str(e)) from None

    return Preset(
        gpu=gpu,
        name=path.stem,
        description=data["description"].strip(),
        target=target,
        draft=draft,
        drafter=drafter,
        temperature=float(temperature),
        top_k=top_k,
        top_p=float(top_p),
        min_p=float(min_p),
        k=None if k == "auto" else k,
        n_ctx=n_ctx,
        note=str(data.get("note") or "").strip(),
        verified=data["verified"],
        path=path,
    )


def _check_keys(data: dict, allowed: set, required: set, prefix: str, fail) -> None:
    for key in data:
        if key not in allowed:
            raise fail(f"{prefix}{key}", f"unknown field (allowed: {', '.join(sorted(allowed))})")
    for key in sorted(required):
        if key not in data:
            raise fail(f"{prefix}{key}", "missing field")


def _model_ref(value: Any, field: str, fail) -> ModelRef | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise fail(field, f"must be a mapping ({{repo, file}} or {{embedded}}), got {_kind(value)}")
    if "embedded" in value:
        _check_keys(value, {"embedded"}, {"embedded"}, f"{field}.", fail)
        if not isinstance(value["embedded"], str) or value["embedded"] not in EMBEDDED:
            raise fail(f"{field}.embedded", f"must be one of {', '.join(EMBEDDED)}, got {shown(value['embedded'])}")
        return ModelRef(embedded=value["embedded"])
    _check_keys(value, {"repo", "file"}, {"repo", "file"}, f"{field}.", fail)
    repo, file = value["repo"], value["file"]
    problem = repo_id_problem(repo)
    if problem:
        raise fail(f"{field}.repo", problem)
    if not isinstance(file, str) or not file.endswith(".gguf"):
        raise fail(f"{field}.file", f"must be a .gguf file name, got {shown(file)}")
    problem = file_name_problem(file)
    if problem:
        raise fail(f"{field}.file", problem)
    return ModelRef(repo=repo, file=file)


def repo_id_problem(repo: Any) -> str | None:
    """Why `repo` is not a Hugging Face repo id 'owner/name' (None when it is one)."""
    if not isinstance(repo, str):
        return f"must be a Hugging Face repo id 'owner/name', got {shown(repo)}"
    if "://" in repo or repo.startswith("huggingface.co/"):
        parts = [p for p in repo.split("://")[-1].split("/")[1:] if p]
        guess = f"; did you mean '{parts[0]}/{parts[1]}'?" if len(parts) >= 2 else ""
        return f"is a URL, not a repo id 'owner/name': {shown(repo)}{guess}"
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if repo.count("/") != 1:
            raise HFValidationError("")
        validate_repo_id(repo)
    except HFValidationError:
        return (f"must be a Hugging Face repo id 'owner/name' (letters, digits, '-', '_', '.'), "
                f"got {shown(repo)}")
    return None


def file_name_problem(file: str) -> str | None:
    """Why `file` is not the name of a file inside a hub repo (None when it is one): a path
    relative to the repo's top, with '/' between folders, that cannot climb out of it."""
    parts = file.split("/")
    if not file.strip() or file.endswith("/"):
        return f"must name a file in the repo, got {shown(file)}"
    # An empty part is "/" at the start (absolute) or "a//b"; "C:" starts a Windows drive path.
    if "\\" in file or ".." in parts or "" in parts or file[1:2] == ":":
        return f"must be a path inside the repo ('/' between folders, no '..'), got {shown(file)}"
    return None


def _number(value: Any, field: str, fail, ok: Callable[[float], bool], rule: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise fail(field, f"must be a number {rule}, got {shown(value)}")
    return value


def _integer(value: Any, field: str, fail, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail(field, f"must be an integer >= {minimum}, got {shown(value)}")
    return value


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__
