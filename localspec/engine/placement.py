"""`config.Placement` into llama.cpp's model and context params: devices (RPC workers first, as
llama.cpp orders them), split mode, tensor split, main GPU, flash attention and KV cache types."""

from __future__ import annotations

import ctypes

import llama_cpp as C

from localspec.config import Placement
from . import rpc
from .files import EngineError

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20,
              "bf16": 30}
"""ggml_type values of the KV cache types (ggml.h)."""
FLASH = {"auto": -1, "off": 0, "on": 1}
"""llama_flash_attn_type values."""
SPLIT = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
"""llama_split_mode values."""
BYTES_PER_VALUE = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                   "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
"""Bytes per cached value of each KV cache type (its block size over 32 values): doctor's memory
estimate."""


def model_params(mparams, placement: Placement) -> tuple:
    """Set `mparams` for `placement`; returns the arrays they point to (keep them while loading)."""
    mparams.split_mode = SPLIT[placement.split_mode]
    mparams.main_gpu = placement.main_gpu
    kept: list = []
    devices = rpc.devices_for(placement.rpc)
    if devices is not None:
        mparams.devices = ctypes.cast(devices, ctypes.c_void_p).value   # a void* field in the bindings
        kept.append(devices)
    if placement.tensor_split:
        n = C.llama_max_devices()
        if len(placement.tensor_split) > n:
            raise EngineError(f"--tensor-split names {len(placement.tensor_split)} devices; llama.cpp takes at most {n}")
        split = (ctypes.c_float * n)(*placement.tensor_split)
        mparams.tensor_split = ctypes.cast(split, type(mparams.tensor_split))
        kept.append(split)
    return tuple(kept)


def stable_shapes(placement: Placement, gpu_layers: int) -> bool:
    """Whether a model's decodes keep stable shapes (engine/shapes.py): asked, or by default where
    its layers go to a local CUDA GPU, the backend whose graphs replay only for repeated shapes."""
    if placement.stable_shapes != "auto":
        return placement.stable_shapes == "on"
    from .backend import backend_devices, ggml

    if gpu_layers == 0 or ggml() is None:
        return False
    return any(d["backend"] == "CUDA" and d["type"] == "gpu" for d in backend_devices())


def context_params(cparams, placement: Placement) -> None:
    cparams.flash_attn_type = FLASH[placement.flash_attn]
    cparams.type_k = GGML_TYPES[placement.cache_type_k]
    cparams.type_v = GGML_TYPES[placement.cache_type_v]
