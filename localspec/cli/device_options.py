"""The device options the model commands share (`--rpc`, the split, flash attention, KV cache
types, stable shapes, `--n-batch`), declared once, and how they become the two models' `Placement`s.
`localspec.cli.options` puts them in its MODELS group."""

from __future__ import annotations

from typing import Annotated, Any, Mapping, Optional

import typer

from localspec.config import CACHE_TYPES, N_BATCH, ConfigError, Placement, parse_list
from .panels import DEVICES

Rpc = Annotated[Optional[str], typer.Option(
    "--rpc", metavar="WORKERS", rich_help_panel=DEVICES, help=(
        "llama.cpp RPC workers, HOST:PORT[,HOST:PORT...] (`localspec worker`, or llama.cpp's rpc-server), that "
        "hold the target's layers, ahead of local GPUs; the draft stays local."))]
TensorSplit = Annotated[Optional[str], typer.Option(
    "--tensor-split", metavar="PROPORTIONS", rich_help_panel=DEVICES, help=(
        "Proportion of the target per device, in llama.cpp's order (RPC workers first), e.g. 3,1 "
        "(default: by free memory)."))]
SplitMode = Annotated[Optional[str], typer.Option(
    "--split-mode", metavar="none|layer|row|tensor", rich_help_panel=DEVICES,
    help="How the target spreads over devices: none (one device), layer (by layers), row (by rows), tensor "
         "(tensor parallel) (default layer).")]
MainGpu = Annotated[Optional[int], typer.Option(
    "--main-gpu", rich_help_panel=DEVICES,
    help="The target's device with --split-mode none, or for row's intermediate results (default 0).")]
FlashAttn = Annotated[Optional[str], typer.Option(
    "--flash-attn", metavar="auto|on|off", rich_help_panel=DEVICES,
    help="Flash attention for both models (default auto: llama.cpp decides).")]
CacheTypeK = Annotated[Optional[str], typer.Option(
    "--cache-type-k", metavar="TYPE", rich_help_panel=DEVICES,
    help=f"The target's KV cache keys: {', '.join(CACHE_TYPES)} (default f16).")]
CacheTypeV = Annotated[Optional[str], typer.Option(
    "--cache-type-v", metavar="TYPE", rich_help_panel=DEVICES,
    help="The target's KV cache values, a type as for --cache-type-k (default f16; quantized needs flash attention).")]
DraftCacheTypeK = Annotated[Optional[str], typer.Option(
    "--draft-cache-type-k", metavar="TYPE", rich_help_panel=DEVICES,
    help="The draft's KV cache keys, a type as for --cache-type-k (default f16).")]
DraftCacheTypeV = Annotated[Optional[str], typer.Option(
    "--draft-cache-type-v", metavar="TYPE", rich_help_panel=DEVICES,
    help="The draft's KV cache values, a type as for --cache-type-k (default f16).")]
StableShapes = Annotated[Optional[str], typer.Option(
    "--stable-shapes", metavar="auto|on|off", rich_help_panel=DEVICES, help=(
        "Pad both models' small decodes to a few fixed sizes so that GPU graphs replay; the output is the same "
        "(default auto: on where layers are on a CUDA GPU)."))]
NBatch = Annotated[Optional[int], typer.Option(
    "--n-batch", rich_help_panel=DEVICES,
    help=f"Most tokens one llama_decode takes, for both models; prompts are read in pieces of this size "
         f"(default {N_BATCH}).")]

DEVICE_OPTIONS = ("rpc", "tensor_split", "split_mode", "main_gpu", "flash_attn", "cache_type_k",
                  "cache_type_v", "draft_cache_type_k", "draft_cache_type_v", "stable_shapes", "n_batch")
"""The options a preset's `gpu` mapping may set too (all but --rpc, which names machines)."""

def placements(given: Mapping[str, Any], preset: Mapping[str, Any]) -> dict:
    """LoadConfig's target_placement, draft_placement and n_batch from the device options (a flag
    over the preset's value): the target takes the workers and the split, both models flash
    attention, each its own cache types. A value given is checked as given (`Placement`,
    `LoadConfig`): an empty string or a 0 never stands for the default."""
    value = {name: given.get(name) if given.get(name) is not None else preset.get(name) for name in DEVICE_OPTIONS}
    pick = lambda name, default: default if value[name] is None else value[name]  # noqa: E731
    flash, shapes = pick("flash_attn", "auto"), pick("stable_shapes", "auto")
    target = Placement(
        rpc=parse_list(value["rpc"], "--rpc"), split_mode=pick("split_mode", "layer"),
        tensor_split=parse_list(value["tensor_split"], "--tensor-split", float), main_gpu=pick("main_gpu", 0),
        flash_attn=flash, cache_type_k=pick("cache_type_k", "f16"), cache_type_v=pick("cache_type_v", "f16"),
        stable_shapes=shapes)
    try:
        draft = Placement(flash_attn=flash, cache_type_k=pick("draft_cache_type_k", "f16"),
                          cache_type_v=pick("draft_cache_type_v", "f16"), stable_shapes=shapes)
    except ConfigError as e:   # Placement names the target's options; these values came from the draft's
        raise ConfigError(str(e).replace("--cache-type-", "--draft-cache-type-")) from None
    return {"target_placement": target, "draft_placement": draft, "n_batch": pick("n_batch", N_BATCH)}
