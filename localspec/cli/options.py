"""What the commands share: their options, declared once, and how they are read.

`generate`, `bench`, `chat` and `doctor` take the model, sampling and offload options below; each
command module imports this one, and nothing but the entry point imports `localspec.cli.app`.
Defaults are None so that an explicit flag can be told apart from a preset's value
(`resolve_options`).
"""

from __future__ import annotations

import functools
import inspect
import os
import secrets
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, List, Mapping, NoReturn, Optional

import typer

from localspec.config import (DRAFTERS, MAX_BRANCHES, MAX_DRAFT, NEEDS_DRAFT, ConfigError, DecodeConfig, SamplingConfig,
                              parse_tree)
from localspec.loading.defaults import MAX_SHOWN, TARGET_FILE, shown
from .constraint_options import CONSTRAINTS, grammar_of
from .device_options import (DEVICE_OPTIONS, CacheTypeK, CacheTypeV, DraftCacheTypeK, DraftCacheTypeV, FlashAttn, MainGpu,
                             NBatch, Rpc, SplitMode, StableShapes, TensorSplit, placements)
from .panels import DEVICES, MODEL, ORDER as PANEL_ORDER, SAMPLING as SAMPLING_PANEL, SPECULATION

Target = Annotated[Optional[str], typer.Option(
    "--target", rich_help_panel=MODEL,
    help=f"Target GGUF (default: {TARGET_FILE}, the embedded model, made once into the cache).")]
Draft = Annotated[Optional[str], typer.Option(
    "--draft", rich_help_panel=MODEL, help="Draft GGUF sharing the target's tokenizer.")]
Drafter = Annotated[Optional[str], typer.Option(
    "--drafter", metavar="|".join(DRAFTERS), rich_help_panel=SPECULATION,
    help="Who drafts: the draft model, prompt lookup, auto (the best of them, or plain, per step) or none "
         "(plain decoding) "
         "(default: auto when a draft is available, else lookup).")]
DraftTokens = Annotated[Optional[str], typer.Option(
    "-k", "--draft-tokens", metavar="auto|N", rich_help_panel=SPECULATION,
    help=f"Draft tokens per step: auto (the controller chooses) or a number N, 0-{MAX_DRAFT} (default auto).")]
TREE_DEFAULT = "auto"
"""--tree when not given, on generate, chat, serve and bench (doctor measures chains)."""
Tree = Annotated[str, typer.Option(
    "--tree", metavar="auto|off|SHAPE", rich_help_panel=SPECULATION, help=(
        f"Draft trees: auto (the controller chooses per step), off (chains only), or a SHAPE like 3,2,1,1, "
        f"the branching per depth: 3 children of the root, 2 under each of those, then chains; at most "
        f"{MAX_BRANCHES} branches (default {TREE_DEFAULT})."))]
# The sampling defaults are SamplingConfig's, which `resolve_options` applies.
Temperature = Annotated[Optional[float], typer.Option(
    "--temperature", rich_help_panel=SAMPLING_PANEL,
    help=f"Sampling temperature, 0 = greedy (default {SamplingConfig.temperature:g}).")]
TopK = Annotated[Optional[int], typer.Option(
    "--top-k", rich_help_panel=SAMPLING_PANEL, help=f"Top-k truncation, 0 = off (default {SamplingConfig.top_k}).")]
TopP = Annotated[Optional[float], typer.Option(
    "--top-p", rich_help_panel=SAMPLING_PANEL, help=f"Nucleus truncation, 1 = off (default {SamplingConfig.top_p:g}).")]
MinP = Annotated[Optional[float], typer.Option(
    "--min-p", rich_help_panel=SAMPLING_PANEL, help=f"Min-p truncation, 0 = off (default {SamplingConfig.min_p:g}).")]
Seed = Annotated[Optional[int], typer.Option(
    "--seed", rich_help_panel=SAMPLING_PANEL,
    help="Random seed; -1 or none = random (the seed used is reported in --json).")]


def max_tokens(default: int) -> Any:
    """--max-tokens with `default`, which differs between commands (its help says which)."""
    return typer.Option(default, "--max-tokens", help=f"Stop after this many tokens (default {default}).")


NCtx = Annotated[Optional[int], typer.Option("--n-ctx", rich_help_panel=MODEL, help="Context length (default 4096).")]
RESERVE = {"chat": (1, "the screen"), "serve": (1, "the event loop")}
"""Cores a command leaves free when it picks the thread count, and for what: the chat's screen and
the server's event loop run beside decoding, and one of llama.cpp's spin-waiting threads that they
deschedule slows every step (measured in chat on 2 cores: 6.6 against 41.6 tokens/s)."""


def threads_default(command: str) -> int:
    """--threads when not given, for `command` on this machine with nothing else running (its help
    shows this); while other work keeps cores busy the run takes fewer (`machine.choose_threads`)."""
    from localspec.machine import choose_threads

    return choose_threads(None, RESERVE.get(command, (0, ""))[0], other=0.0).threads


def _threads_option(command: str) -> Any:
    reserve, whom = RESERVE.get(command, (0, ""))
    leave = f", leaving a core to {whom}" if reserve else ""
    return Annotated[Optional[int], typer.Option("--threads", rich_help_panel=DEVICES, help=(
        f"CPU threads (default: {threads_default(command)} here{leave}; fewer while other work keeps cores busy)."))]


Threads = _threads_option("generate")
TargetGpuLayers = Annotated[Optional[int], typer.Option(
    "--target-gpu-layers", rich_help_panel=DEVICES, help="Target layers on the GPU, -1 = all (default -1).")]
DraftGpuLayers = Annotated[Optional[int], typer.Option(
    "--draft-gpu-layers", rich_help_panel=DEVICES, help="Draft layers on the GPU, -1 = all (default -1).")]
ChatTemplate = Annotated[bool, typer.Option(
    "--chat/--raw", help="Apply the GGUF's chat template, or send raw text (default --chat).")]
Preset = Annotated[Optional[str], typer.Option(
    "--preset", rich_help_panel=MODEL, help="Model preset from `localspec models`; flags override it.")]
NoWarmStart = Annotated[bool, typer.Option(
    "--no-warm-start", rich_help_panel=SPECULATION,
    help="Start the k controller from nothing: neither read nor save what earlier runs learned.")]

MODELS = {"preset": Preset, "target": Target, "draft": Draft, "n_ctx": NCtx, "threads": Threads,
          "target_gpu_layers": TargetGpuLayers, "draft_gpu_layers": DraftGpuLayers,
          "rpc": Rpc, "tensor_split": TensorSplit, "split_mode": SplitMode, "main_gpu": MainGpu,
          "flash_attn": FlashAttn, "cache_type_k": CacheTypeK, "cache_type_v": CacheTypeV,
          "draft_cache_type_k": DraftCacheTypeK, "draft_cache_type_v": DraftCacheTypeV,
          "stable_shapes": StableShapes, "n_batch": NBatch}
"""Which models to load and how (files, threads, devices and workers, KV cache): `doctor` takes
these."""

def models_for(command: str) -> dict:
    """MODELS with the --threads default that `command` uses (chat and serve leave a core free)."""
    return {**MODELS, "threads": _threads_option(command)} if command in RESERVE else MODELS


RepeatPenalty = Annotated[Optional[float], typer.Option(
    "--repeat-penalty", rich_help_panel=SAMPLING_PANEL,
    help=f"Divide the logits of recent tokens (multiply negative ones) by this, as llama.cpp; 1 = off "
         f"(default {SamplingConfig.repeat_penalty:g}).")]
RepeatLastN = Annotated[Optional[int], typer.Option(
    "--repeat-last-n", rich_help_panel=SAMPLING_PANEL,
    help=f"Latest tokens (prompt and output) the penalties look at; -1 = all, 0 = none "
         f"(default {SamplingConfig.repeat_last_n}).")]
PresencePenalty = Annotated[Optional[float], typer.Option(
    "--presence-penalty", rich_help_panel=SAMPLING_PANEL,
    help=f"Subtract this from the logit of each token in that window (default {SamplingConfig.presence_penalty:g}).")]
FrequencyPenalty = Annotated[Optional[float], typer.Option(
    "--frequency-penalty", rich_help_panel=SAMPLING_PANEL,
    help=f"Subtract this once per occurrence in that window (default {SamplingConfig.frequency_penalty:g}).")]
LogitBias = Annotated[Optional[List[str]], typer.Option(
    "--logit-bias", metavar="BIAS", rich_help_panel=SAMPLING_PANEL,
    help="TOKEN=BIAS: add BIAS to token id TOKEN's logit (-inf bans it); repeatable.")]

SAMPLING = {"drafter": Drafter, "temperature": Temperature, "top_k": TopK, "top_p": TopP, "min_p": MinP,
            "seed": Seed, "repeat_penalty": RepeatPenalty, "repeat_last_n": RepeatLastN,
            "presence_penalty": PresencePenalty, "frequency_penalty": FrequencyPenalty, "logit_bias": LogitBias,
            **CONSTRAINTS}
"""How to draft and sample: `generate`, `bench` and `chat` take these too."""
MODEL_OPTIONS = (*MODELS, *SAMPLING, "k")
"""The parameter names `resolve` reads from a command's arguments (absent ones count as not given)."""


def with_options(*groups: Mapping[str, Any]) -> Callable:
    """Give a Typer command the options of `groups`, declared once above, where its parameter
    `options` stands; the command receives their values as one dict in `options`. They are
    declared panel by panel (`panels.ORDER`), which is the order --help shows the panels in."""
    rank = {panel: i for i, panel in enumerate(PANEL_ORDER)}
    declared = dict(sorted(((name, kind) for group in groups for name, kind in group.items()),
                           key=lambda item: rank.get(typing.get_args(item[1])[1].rich_help_panel, -1)))

    def decorate(func: Callable) -> Callable:
        sig = inspect.signature(func, eval_str=True)
        params: list[inspect.Parameter] = []
        for p in sig.parameters.values():
            if p.name == "options":
                params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                             annotation=kind) for name, kind in declared.items()]
            else:
                params.append(p)

        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            options = {name: kwargs.pop(name, None) for name in declared}
            return func(*args, options=options, **kwargs)

        command.__signature__ = sig.replace(parameters=params)  # what Typer reads
        return command

    return decorate


MAX_LINE = 2000
"""The most characters of an error line: a message longer than that lost its point long before."""


def error_line(message: object) -> None:
    """`error: …` on stderr, folded to one line, every word (a value echoed whole: a path, a
    number, a string without spaces) cut to MAX_SHOWN characters and the line to MAX_LINE."""
    text = str(message)
    if len(text) > 2 * MAX_LINE:   # never fold a huge text whole: the middle goes anyway
        text = f"{text[:MAX_LINE]} … {text[-MAX_LINE:]}"
    text = " ".join(_cut(word, MAX_SHOWN) for word in text.split()) or type(message).__name__
    typer.echo(f"error: {_cut(text, MAX_LINE)}", err=True)


def _cut(text: str, limit: int) -> str:
    """`text`, or its start and end with an ellipsis between when it is longer than `limit`."""
    if len(text) <= limit:
        return text
    half = (limit - 1) // 2
    return f"{text[:half]}…{text[len(text) - (limit - 1 - half):]}"


def fail(message: object) -> NoReturn:
    """One line on stderr, exit code 2: how every bad input ends."""
    error_line(message)
    raise typer.Exit(2)


def utf8(text: str, what: str) -> str:
    """`text` from argv, refused when its bytes were not UTF-8 (Python keeps them as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = os.fsencode(text)
        fail(f"{what} is not UTF-8 text (byte {raw[len(os.fsencode(text[:e.start]))]:#04x} "
             f"at offset {len(os.fsencode(text[:e.start]))})")
    return text


def parse_k(value: str | None) -> int | None:
    """'auto' (None) or a non-negative integer."""
    if value is None or value.strip().lower() == "auto":
        return None
    try:
        k = int(value)
    except ValueError:
        fail(f"draft tokens (-k) must be a number or 'auto', got {shown(value)}")
    if not 0 <= k <= MAX_DRAFT:
        fail(f"draft tokens (-k) must be between 0 and {MAX_DRAFT}, got {k}")
    return k


@dataclass(frozen=True)
class Resolved:
    """Options after merging: explicit flag > preset > built-in default."""

    load: object
    """The `session.LoadConfig` to load the models with."""
    sampling: SamplingConfig
    """Sampling, with a seed drawn when none was given."""
    k: int | None
    """Fixed draft tokens per step, or None for the adaptive controller."""
    tree: str | tuple[int, ...] = "off"
    """Draft trees (`config.parse_tree`): "off", "auto" or a shape; `load` gives both models the
    sequences it needs (`DecodeConfig.n_seq`)."""


def resolve(args: Mapping[str, Any], **override: Any) -> Resolved:
    """`resolve_options` over a command's arguments (`locals()`), `override` taking precedence."""
    values = {name: args.get(name) for name in MODEL_OPTIONS} | override
    return resolve_options(**values)


def resolve_options(
    *,
    preset: str | None,
    target: str | None,
    draft: str | None,
    drafter: str | None,
    k: str | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    seed: int | None,
    n_ctx: int | None,
    threads: int | None,
    target_gpu_layers: int | None,
    draft_gpu_layers: int | None,
    tree: str | None = None,
    repeat_penalty: float | None = None,
    repeat_last_n: int | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    logit_bias: list[str] | None = None,
    grammar: str | None = None,
    json_schema: str | None = None,
    format: str | None = None,
    **devices: Any,
) -> Resolved:
    """Shared by every command, so that every command reads options the same way. `tree` is the
    --tree value; None (a command without the option: doctor) is "off". `devices`: the
    DEVICE_OPTIONS (absent or None: the preset's `gpu` value, else llama.cpp's default)."""
    from localspec.loading.session import LoadConfig

    for option, given, what in (("--preset", preset, "preset name or file"), ("--target", target, "GGUF path"),
                                ("--draft", draft, "GGUF path")):
        if given is not None and not given.strip():   # '' would read as not given: the default, silently
            raise ConfigError(f"{option} is empty: give a {what}, or leave the option out")
    base = SamplingConfig()
    p = None
    if preset is not None:
        from localspec.loading.hub import resolve_model
        from localspec.loading.presets import load_preset

        p = load_preset(preset)
        if target is None:
            target = str(resolve_model(p.target, preset=p.name))
        drafter = p.drafter if drafter is None else drafter   # a value given ('', 0) is checked, not replaced
        if draft is None and p.draft is not None and drafter in NEEDS_DRAFT:
            draft = str(resolve_model(p.draft, preset=p.name))
        base = p.sampling()
        n_ctx = p.n_ctx if n_ctx is None else n_ctx
    pick = lambda given, default: default if given is None else given  # noqa: E731
    if seed is not None and seed < -1:
        raise ConfigError(f"seed must be >= 0, or -1 for a random one; got {seed}")
    tree_value = "off" if tree is None else parse_tree(tree)
    threads = _usable_threads(threads)
    sampling = SamplingConfig(
        temperature=pick(temperature, base.temperature),
        top_k=pick(top_k, base.top_k),
        top_p=pick(top_p, base.top_p),
        min_p=pick(min_p, base.min_p),
        seed=seed if seed is not None and seed >= 0 else secrets.randbits(31),  # -1: llama.cpp's "random"
        repeat_penalty=pick(repeat_penalty, base.repeat_penalty),
        repeat_last_n=pick(repeat_last_n, base.repeat_last_n),
        presence_penalty=pick(presence_penalty, base.presence_penalty),
        frequency_penalty=pick(frequency_penalty, base.frequency_penalty),
        logit_bias=parse_logit_bias(logit_bias or ()),
        **dict(zip(("grammar", "grammar_name"), grammar_of(grammar, json_schema, format))),
    )
    load = LoadConfig(
        target=target,
        draft=draft,
        drafter=drafter,
        n_ctx=pick(n_ctx, 4096),
        threads=threads,
        target_gpu_layers=pick(target_gpu_layers, -1),
        draft_gpu_layers=pick(draft_gpu_layers, -1),
        n_seq=DecodeConfig(tree=tree_value).n_seq,
        **placements({name: devices.get(name) for name in DEVICE_OPTIONS}, p.gpu if p is not None else {}),
    )
    k_value = parse_k(k) if k is not None else (p.k if p is not None else None)
    return Resolved(load, sampling, k_value, tree_value)




def parse_logit_bias(items) -> tuple[tuple[int, float], ...]:
    """--logit-bias TOKEN=BIAS values (repeatable; a token given twice: the last wins)."""
    out: dict[int, float] = {}
    for item in items:
        token, sep, bias = str(item).partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(token)] = float(bias)
        except ValueError:
            raise ConfigError(f"--logit-bias takes TOKEN=BIAS, a token id and a number (-inf bans it), "
                              f"got {shown(str(item))}") from None
    return tuple(out.items())


def _usable_threads(threads: int | None) -> int | None:
    """More threads than cores makes llama.cpp's spin-waiting threads queue for the CPU (a step
    slows down hundreds of times): clamp, and say so."""
    from localspec.machine import usable_cpus

    cores = usable_cpus()
    if threads is not None and threads > cores:
        typer.echo(f"localspec: --threads {threads} is more than the {cores} cores this process may use; "
                   f"using {cores}", err=True)
        return cores
    return threads
