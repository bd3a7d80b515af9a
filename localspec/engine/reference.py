"""llama-cpp-python's own generate, for `localspec bench --compare llama-cpp-python`.

Its high-level `llama_cpp.Llama.generate`, plain or with its built-in prompt-lookup drafter, is
timed on the same prompts and GGUF as a reference point. localspec itself never decodes through
this path; it lives in the engine package because it is llama_cpp code.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Sequence

import llama_cpp as C

from . import EngineError, _init_backend, check_gguf, extra_buffers


class ReferenceModel:
    """One `llama_cpp.Llama`, loaded once per bench run and reused (reset) across prompts.

    `lookup_tokens` = None: plain `Llama.generate`; N: `draft_model=LlamaPromptLookupDecoding(
    num_pred_tokens=N)`, which needs `logits_all=True` (without it llama-cpp-python crashes with a
    broadcast error, its issue #2110).
    """

    def __init__(self, path: str | Path, *, n_ctx: int, threads: int, gpu_layers: int = -1,
                 lookup_tokens: int | None = None):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        _init_backend()
        self.lookup_tokens = lookup_tokens
        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens) if lookup_tokens else None
        try:
            with _extra_buffers(extra_buffers.usable()):
                self.llm = Llama(
                    model_path=str(check_gguf(path)), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                    n_gpu_layers=gpu_layers if gpu_layers >= 0 else -1, logits_all=draft is not None,
                    draft_model=draft, verbose=False,
                )
        except (ValueError, RuntimeError) as e:
            raise EngineError(f"llama-cpp-python could not load {path}: {e}") from None
        self._vocab = C.llama_model_get_vocab(self.llm.model)

    def generate(self, prompt_tokens: Sequence[int], max_tokens: int, *, temperature: float,
                 top_k: int, top_p: float, min_p: float, seed: int) -> tuple[list[int], float, float]:
        """(generated tokens, prefill seconds, decode seconds); generation stops at an
        end-of-generation token (not returned) or after max_tokens.

        Prefill evaluates all prompt tokens but the last; decoding then starts by evaluating the last
        one, as localspec's decoder does, so both decode times cover the same work per token."""
        llm = self.llm
        prompt = [int(t) for t in prompt_tokens]
        budget = min(max_tokens, llm.n_ctx() - len(prompt) - 1)
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt[:-1])  # a prefix generate() reuses: only the last prompt token is left
        t1 = time.perf_counter()
        llm.set_seed(seed)
        out: list[int] = []
        gen = llm.generate(prompt, top_k=top_k, top_p=top_p, min_p=min_p, temp=temperature,
                           repeat_penalty=1.0, reset=True)
        try:
            for tok in gen:
                if budget <= 0 or C.llama_vocab_is_eog(self._vocab, tok):
                    break
                out.append(int(tok))
                if len(out) >= budget:
                    break
        finally:
            gen.close()
        t2 = time.perf_counter()
        return out, t1 - t0, t2 - t1

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
            self.llm = None



@contextlib.contextmanager
def _extra_buffers(use: bool):
    """`Llama` takes no `use_extra_bufts`; where they fault here (extra_buffers.py), its model
    params are made without them: it reads llama.cpp's defaults once, while it loads."""
    if use:
        yield
        return
    import llama_cpp.llama as high

    defaults = high.llama_cpp.llama_model_default_params

    def without():
        params = defaults()
        params.use_extra_bufts = False
        return params

    high.llama_cpp.llama_model_default_params = without
    try:
        yield
    finally:
        high.llama_cpp.llama_model_default_params = defaults
