"""Tiny but valid llama-architecture GGUF files (random F32 weights) for fast tests.

The tokenizer is SentencePiece-style ("llama"): `<unk>`, `<s>`, `</s>`, a few word pieces, then the
256 byte-fallback tokens `<0x00>`..`<0xFF>`, so any text tokenizes without unknown bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import gguf

WORDS = ["▁", "h", "i", "▁hi", "▁the", "e", "a", "▁a", "t", "o", "n", "s", "▁is", "."]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
TOKENS = ["<unk>", "<s>", "</s>", *WORDS, *BYTES]
"""Default vocabulary: ids 0-2 special, 3-16 word pieces (id 7 is "▁the"), then byte tokens."""


def _token_type(tok: str) -> int:
    if tok == "<unk>":
        return gguf.TokenType.UNKNOWN
    if tok in ("<s>", "</s>"):
        return gguf.TokenType.CONTROL
    if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
        return gguf.TokenType.BYTE
    return gguf.TokenType.NORMAL


def write_tiny_gguf(
    path: str | Path,
    tokens: Sequence[str] = TOKENS,
    *,
    bos: int = 1,
    eos: int = 2,
    n_embd: int = 16,
    n_layer: int = 1,
    n_head: int = 2,
    n_head_kv: int = 1,
    n_ff: int = 32,
    n_ctx_train: int = 256,
    seed: int = 0,
    name: str = "tiny",
    scale: float = 0.2,
) -> Path:
    """Write a llama model llama.cpp can load and run; returns `path`. `scale`: the standard
    deviation of the random weights (larger: sharper next-token distributions)."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    n_vocab, head_dim = len(tokens), n_embd // n_head
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)

    w.add_tokenizer_model("llama")
    w.add_token_list(list(tokens))
    w.add_token_scores([0.0 if _token_type(t) != gguf.TokenType.NORMAL else -float(i) for i, t in enumerate(tokens)])
    w.add_token_types([int(_token_type(t)) for t in tokens])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def t(name: str, *shape: int) -> None:  # numpy shape = ggml ne reversed
        w.add_tensor(name + ".weight", (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name: str) -> None:
        w.add_tensor(name + ".weight", np.ones(n_embd, dtype=np.float32))

    N = gguf.TENSOR_NAMES
    A = gguf.MODEL_TENSOR
    t(N[A.TOKEN_EMBD], n_vocab, n_embd)
    ones(N[A.OUTPUT_NORM])
    t(N[A.OUTPUT], n_vocab, n_embd)
    for b in range(n_layer):
        blk = lambda k: N[k].format(bid=b)  # noqa: E731
        ones(blk(A.ATTN_NORM))
        t(blk(A.ATTN_Q), n_head * head_dim, n_embd)
        t(blk(A.ATTN_K), n_head_kv * head_dim, n_embd)
        t(blk(A.ATTN_V), n_head_kv * head_dim, n_embd)
        t(blk(A.ATTN_OUT), n_embd, n_head * head_dim)
        ones(blk(A.FFN_NORM))
        t(blk(A.FFN_GATE), n_ff, n_embd)
        t(blk(A.FFN_UP), n_ff, n_embd)
        t(blk(A.FFN_DOWN), n_embd, n_ff)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
