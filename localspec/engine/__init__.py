"""The only package that talks to llama.cpp (through llama-cpp-python's low-level ctypes API).

A `Model` is one GGUF with one context, holding sequence 0 and, with `ModelConfig.n_seq` > 1,
others (`batch`: draft trees, concurrent sequences). It remembers which tokens its KV cache holds,
so callers move it by saying what the cache should contain (`sync`, `truncate`) and by appending
blocks (`eval`), each block in one batched `llama_decode` that returns logits only for the rows
asked for. `backend` holds llama.cpp's process-wide side (log, start-up, devices).

The engine is the bottom layer: it may import only `localspec.config`, `localspec.machine`,
`localspec.paths` and `localspec.tokens`, and it must never import the algorithm, the loading layer,
a command or the UI. It is the only package that imports `llama_cpp`.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Sequence

import numpy as np

import llama_cpp as C

from localspec.config import ModelConfig
from localspec.machine import default_threads  # noqa: F401 - the rule lives in machine; quantize takes it from here
from . import chat, extra_buffers, interrupt, placement
from .shapes import TOP as _PAD_TOP, Shapes
from .batch import Batch, Sequences, logit_start
from .backend import (_init_backend, _load_progress, _recent_log, backend_devices, gpu_offload_supported,  # noqa: F401
                      library_version, system_info)
from .files import Cancelled, EngineError, WorkerError, check_gguf, load_failure
from .grammar import ANY_JSON_OBJECT, Grammar, GrammarError, schema_grammar  # noqa: F401
from .rpc import add_workers as connect_workers, on_lost as on_worker_lost  # noqa: F401


_LONG_EVAL = 64  # evals of more tokens than this (prefill) also stop when `Model.abort_when` is set
# Every other decode's (a step's) abort check: C reading one byte (`interrupt.ABORT_CHECK`).
_ABORT_CHECK = (C.ggml_abort_callback(interrupt.ABORT_CHECK[0]), interrupt.ABORT_CHECK[1])


class Model(Sequences):
    """One loaded GGUF, its context and its KV cache (sequence 0, and more with n_seq > 1)."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.path = check_gguf(cfg.path)
        self.name = self.path.name
        self.n_seq = cfg.n_seq
        if not 1 <= self.n_seq <= C.llama_max_parallel_sequences():
            raise EngineError(f"n_seq must be between 1 and {C.llama_max_parallel_sequences()}, got {self.n_seq}")
        _init_backend()
        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = cfg.n_gpu_layers if cfg.n_gpu_layers >= 0 else 10**6
        # AMX tiles and repacked layouts, unless this CPU faults on them (extra_buffers.py)
        mparams.use_extra_bufts = self.extra_buffers = extra_buffers.usable()
        self._placed = placement.model_params(mparams, cfg.placement)   # kept alive while loading
        mparams.progress_callback = _load_progress
        _recent_log.clear()
        self._model = None
        try:
            with interrupt.deferred():
                self._model = C.llama_model_load_from_file(os.fsencode(self.path), mparams)
        except KeyboardInterrupt:
            if self._model:  # the load had finished when the Ctrl-C was raised
                C.llama_model_free(self._model)
            raise
        if not self._model:
            raise EngineError(f"failed to load {self.path}: {load_failure(self.path, _recent_log)}")
        self.n_batch = max(1, cfg.n_batch)
        threads = cfg.n_threads or default_threads()
        cparams = C.llama_context_default_params()
        cparams.n_ctx = cfg.n_ctx
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = self.n_seq
        # Only a unified cache lets one batch row belong to several sequences (see batch).
        cparams.kv_unified = self.n_seq > 1 and cfg.unified
        self.unified = bool(cparams.kv_unified)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        placement.context_params(cparams, cfg.placement)
        self._ctx = None
        try:
            with interrupt.deferred():
                self._ctx = C.llama_init_from_model(self._model, cparams)
        except KeyboardInterrupt:
            if self._ctx:
                C.llama_free(self._ctx)
            C.llama_model_free(self._model)
            raise
        if not self._ctx:
            C.llama_model_free(self._model)
            why = f" ({_recent_log[-1]})" if _recent_log else ""
            raise EngineError(f"could not create a context of {cfg.n_ctx} tokens for {self.path}{why}")
        # llama.cpp pads the context it allocates (to 256 tokens); the context is still the size
        # asked for: every length check reads n_ctx, and the padding stays unused.
        # Without a unified cache each sequence has a stream of its own: n_ctx is what one holds.
        self.n_ctx = min(cfg.n_ctx, C.llama_n_ctx(self._ctx)) if self.unified else \
            min(cfg.n_ctx // self.n_seq, C.llama_n_ctx_seq(self._ctx))
        self.n_batch = min(self.n_batch, C.llama_n_batch(self._ctx))
        self.n_threads = threads
        self.remote = bool(cfg.placement.rpc)
        """Its layers run on RPC workers: a decode waits on the network, and this CPU is free."""
        self._vocab = C.llama_model_get_vocab(self._model)
        self.n_vocab = C.llama_vocab_n_tokens(self._vocab)
        self._mem = C.llama_get_memory(self._ctx)
        self.recurrent = bool(C.llama_model_is_recurrent(self._model) or C.llama_model_is_hybrid(self._model))
        # Padded decodes need their padding's cells removed: a recurrent memory cannot.
        self.shapes = Shapes() if placement.stable_shapes(cfg.placement, cfg.n_gpu_layers) and not self.recurrent else None
        """Stable decode sizes (engine/shapes.py), or None."""
        # numpy arrays under the C batch: filling it is a few slice assignments, no per-token loop.
        # `eval` fills tokens, positions and outputs; its rows belong to sequence 0 (the default).
        self._rows = Batch(self.n_batch, self.n_seq)
        self._batch = self._rows.c
        self._tok, self._pos, self._out = self._rows.tok, self._rows.pos, self._rows.out
        self.seqs: list[list[int]] = [[] for _ in range(self.n_seq)]
        """The tokens each sequence's cache holds, position by position."""
        self.tokens: list[int] = self.seqs[0]
        self._tree = None  # the last eval_tree's nodes, until keep_path
        self._pieces: dict[int, bytes] = {}
        self._views: dict[tuple[int, int], np.ndarray] = {}
        self.bos = C.llama_vocab_bos(self._vocab)
        self.eos = C.llama_vocab_eos(self._vocab)
        self.eot = C.llama_vocab_eot(self._vocab)
        self.add_bos = bool(C.llama_vocab_get_add_bos(self._vocab))
        self._chat = None  # the chat template's renderer, made on first use
        self.abort_when: threading.Event | None = None
        """Set by a caller in another thread (a server whose client left) to stop a long prefill."""
        self._abort = C.ggml_abort_callback(
            lambda _: interrupt.requested() or (self.abort_when is not None and self.abort_when.is_set()))
        self._long = True
        self._check_aborts(0)

    # -- cache ---------------------------------------------------------------------------------

    def eval(self, tokens: Sequence[int], logits_from: int | None = None) -> np.ndarray | None:
        """Append `tokens` to the cache in batched decodes; return logits for tokens[logits_from:].

        The result is a (rows, n_vocab) float32 view into llama.cpp's buffer, valid until the next
        call on this model. With logits_from=None no logits are computed. At most n_batch rows can
        be asked for (EngineError otherwise).
        """
        n = len(tokens)
        if n == 0:
            return None
        if len(self.tokens) + n > self.n_ctx:
            raise EngineError(f"context full: {len(self.tokens) + n} tokens > n_ctx {self.n_ctx} ({self.name})")
        start_out = logit_start(n, logits_from)
        rows = n - start_out
        if rows > self.n_batch:
            raise EngineError(f"cannot return {rows} logit rows in one batch of {self.n_batch}")
        arr = np.asarray(tokens, dtype=np.int32)
        base = len(self.tokens)
        if rows and self.shapes is not None and n <= _PAD_TOP:
            size = self.shapes.rows(n, start_out == 0)
            if n < size and base + size <= self.n_ctx:
                return self._decode_padded(arr, start_out, base, size)
        # llama.cpp keeps only the last decode's logits, so every row asked for goes into the last
        # decode: it holds the final n_batch tokens, the ones before go in n_batch chunks (the
        # short one first), the fewest decodes there can be.
        last = max(n - self.n_batch, 0)
        edges = [0, *range(last, 0, -self.n_batch)[::-1], n]
        with interrupt.deferred():
            self._check_aborts(n)
            self._decode(arr, edges, start_out, base)
        return self._logit_rows(rows) if rows else None

    def _logit_rows(self, rows: int) -> np.ndarray:
        """The last decode's `rows` logit rows, as a view into llama.cpp's buffer."""
        ptr = C.llama_get_logits(self._ctx)
        # A numpy view costs ~10 µs to make; llama.cpp keeps its buffer until it must grow it.
        key = (ctypes.cast(ptr, ctypes.c_void_p).value, rows)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 64:
                self._views.clear()
            view = self._views[key] = np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))
        return view

    def _decode_padded(self, arr: np.ndarray, start_out: int, base: int, size: int) -> np.ndarray:
        """Decode arr as `size` rows, all with logits (engine/shapes.py): the last token repeated
        at the following positions, whose cells are removed right after. Returns the rows of
        arr[start_out:]."""
        n = len(arr)
        self.shapes.padded += size - n
        self._tok[:n] = arr
        self._tok[n:size] = arr[-1]
        self._pos[:size] = np.arange(base, base + size, dtype=np.int32)
        self._out[:size] = 1
        self._batch.n_tokens = size
        with interrupt.deferred():
            self._check_aborts(size)
            rc = C.llama_decode(self._ctx, self._batch)
            C.llama_memory_seq_rm(self._mem, 0, base + n, -1)   # the padding: never part of the text
            if rc != 0:
                self.truncate(base, landed=True)
                raise self._failed(rc)
        self.tokens.extend(arr.tolist())
        return self._logit_rows(size)[start_out:n]

    def _decode(self, arr: np.ndarray, edges: list[int], start_out: int, base: int) -> None:
        """Decode arr in the blocks between `edges`; logits for rows from start_out on."""
        n = len(arr)
        for lo, hi in zip(edges, edges[1:]):
            m = hi - lo
            self._tok[:m] = arr[lo:hi]
            self._pos[:m] = np.arange(base + lo, base + hi, dtype=np.int32)
            out = self._out[:m]
            out[:] = 0
            if hi == n and start_out < n:
                out[start_out - lo:] = 1
            self._batch.n_tokens = m
            rc = C.llama_decode(self._ctx, self._batch)
            if rc != 0:
                self.truncate(base + lo, landed=True)  # drop whatever part of the block may have landed
                raise self._failed(rc)
            self.tokens.extend(arr[lo:hi].tolist())

    def _failed(self, rc: int) -> EngineError:
        """The error a decode that returned rc != 0 ends in (its caller has rolled the cache back)."""
        if interrupt.requested() or (self.abort_when is not None and self.abort_when.is_set()):
            # on the main thread, the deferred section turns an interrupt into KeyboardInterrupt
            return Cancelled(f"stopped during a decode ({self.name})")
        if rc == 1 and self.n_seq > 1:  # no free cells for the batch: other sequences hold them
            return EngineError(f"the KV cache has no room for the batch: its {self.n_ctx} cells are shared by "
                               f"all {self.n_seq} sequences ({self.name})")
        return EngineError(f"llama_decode failed with code {rc} ({self.name})")

    def _check_aborts(self, n: int) -> None:
        """Every decode stops at Ctrl-C; a long prefill (seconds on a big model: over _LONG_EVAL
        tokens) also when `abort_when` is set, which takes a Python callback: ggml calls it between
        graph nodes (~500 per decode of 30 layers), noise beside a prefill's work but not beside a
        step's."""
        long = n > _LONG_EVAL
        if long != self._long:
            C.llama_set_abort_callback(self._ctx, *((self._abort, None) if long else _ABORT_CHECK))
            self._long = long

    def truncate(self, n: int, seq: int = 0, landed: bool = False) -> None:
        """Keep the first n tokens of sequence `seq`'s cache, remove the rest. `landed`: after a
        failed decode, cells past what the bookkeeping holds may exist; else a cache holding no
        more than n tokens is left as it is (a plain step's truncate: no call into llama.cpp)."""
        seq = self._seq_id(seq)  # llama.cpp asserts (ends the process) on an id it does not have
        if not landed and n >= len(self.seqs[seq]):
            return
        if not C.llama_memory_seq_rm(self._mem, seq, n, -1):
            kind = "recurrent/hybrid " if self.recurrent else ""
            raise EngineError(
                f"{self.name}: this {kind}model's memory cannot be rolled back to a position, "
                "which speculative decoding needs; use it with --drafter none"
            )
        del self.seqs[seq][n:]

    def reset(self) -> None:
        C.llama_memory_clear(self._mem, True)
        for held in self.seqs:
            held.clear()

    # -- vocabulary ----------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token renders to (special tokens render empty), cached per id."""
        got = self._pieces.get(token)
        if got is None:
            buf = ctypes.create_string_buffer(64)
            n = C.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = C.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            got = self._pieces[token] = buf.raw[:n]
        return got

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry itself (as stored in the GGUF), used for compatibility checks."""
        return C.llama_vocab_get_text(self._vocab, token) or b""

    def is_eog(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self._vocab, token))

    def grammar(self, text: str, root: str = "root") -> Grammar:
        """A fresh state of GBNF grammar `text` over this vocabulary (engine/grammar.py); a bad
        grammar is one GrammarError line."""
        return Grammar.compile(self._vocab, self.n_vocab, text, root)

    def token_attr(self, token: int) -> int:
        """llama.cpp's llama_token_attr flags of `token` (control, user-defined, strips…)."""
        return int(C.llama_vocab_get_attr(self._vocab, token))

    # -- metadata and chat ---------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = C.llama_model_meta_val_str(self._model, key.encode(), buf, 256)
        if n < 0:
            return None
        if n >= 256:
            buf = ctypes.create_string_buffer(n + 1)
            C.llama_model_meta_val_str(self._model, key.encode(), buf, n + 1)
        return buf.value.decode("utf-8", "replace")

    @property
    def chat_template(self) -> str | None:
        raw = C.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", "replace") if raw else None

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Tokens of `messages` rendered by the GGUF's own chat template (Jinja2, as llama-cpp-python
        renders it), ending with the assistant's generation prompt; `tools` (OpenAI's list) goes to
        templates that take it. Message text is tokenized literally: special-token text in a
        message is never a turn marker (see `chat`)."""
        if self._chat is None:
            template = self.chat_template
            if template is None:
                raise EngineError(f"{self.name} has no chat template")
            self._chat = chat.formatter(self, template)  # compiled once
        return chat.chat_tokens(self, self._chat, messages, tools)

    def describe(self) -> dict:
        return {
            "path": str(self.path),
            "name": self.meta("general.name") or self.name,
            "n_vocab": self.n_vocab,
            "n_ctx": self.n_ctx,
            "n_params": int(C.llama_model_n_params(self._model)),
            "size_bytes": int(C.llama_model_size(self._model)),
            "n_layer": int(C.llama_model_n_layer(self._model)),
            "n_embd": int(C.llama_model_n_embd(self._model)),
            "threads": self.n_threads,
        }

    def set_threads(self, n: int) -> None:
        """Decode (and prefill) with `n` threads from now on: the count is fitted to the work on
        the machine once the models have loaded (machine.choose_threads), which a context made
        with another count takes without being made again."""
        if n < 1:
            raise ValueError(f"threads must be >= 1, got {n}")
        C.llama_set_n_threads(self._ctx, n, n)
        self.n_threads = n

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            C.llama_free(self._ctx)
            C.llama_model_free(self._model)
            self._ctx = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
