"""Options shared by `generate`, `bench` and `chat`, declared once so they read the same everywhere.

Defaults are None so that an explicit flag can be told apart from a preset's value
(see `localspec.cli.resolve_options`).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

Target = Annotated[Optional[str], typer.Option("--target", help="Target GGUF (default: embedded SmolLM2-135M F32).")]
Draft = Annotated[Optional[str], typer.Option("--draft", help="Draft GGUF sharing the target's tokenizer.")]
Drafter = Annotated[Optional[str], typer.Option(
    "--drafter", help="model | lookup | none (default: model when a draft is available, else lookup).")]
Temperature = Annotated[Optional[float], typer.Option("--temperature", help="0 = greedy (default 0.8).")]
TopK = Annotated[Optional[int], typer.Option("--top-k", help="Top-k truncation, 0 = off (default 40).")]
TopP = Annotated[Optional[float], typer.Option("--top-p", help="Nucleus truncation, 1 = off (default 0.95).")]
MinP = Annotated[Optional[float], typer.Option("--min-p", help="Min-p truncation, 0 = off (default 0.05).")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Random seed (default: random, reported in --json).")]
NCtx = Annotated[Optional[int], typer.Option("--n-ctx", help="Context length (default 4096).")]
Threads = Annotated[Optional[int], typer.Option("--threads", help="CPU threads (default: this machine's cores).")]
TargetGpuLayers = Annotated[Optional[int], typer.Option(
    "--target-gpu-layers", help="Target layers on the GPU (-1 = all).")]
DraftGpuLayers = Annotated[Optional[int], typer.Option(
    "--draft-gpu-layers", help="Draft layers on the GPU (-1 = all).")]
Preset = Annotated[Optional[str], typer.Option(
    "--preset", help="Model preset from `localspec models`; flags override it.")]
NoWarmStart = Annotated[bool, typer.Option(
    "--no-warm-start", help="Start the k controller from nothing: neither read nor save what earlier runs learned.")]
