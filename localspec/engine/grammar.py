"""llama.cpp's grammar engine (GBNF), as a state the decoder can check, advance and fork.

A `Grammar` wraps one `llama_sampler_init_grammar` sampler: `allowed(ids)` runs its apply on just
those candidates (a `llama_token_data_array` of them), `accept(token)` advances it, `fork()` is
`llama_sampler_clone` (a branch's state; the original stays where it was, which is how a rejected
draft rolls back). Nothing here decides what is sampled: decoding/constrain.py does, on the ids it
asks about.

llama.cpp aborts the process when a token the grammar forbids is accepted (a C++ exception through
its C API), so `accept` checks the token first and raises instead. Its parser reports a bad grammar
on the C stderr only; `compile` catches that text for the one error line.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
import threading

import numpy as np

import llama_cpp as C
from llama_cpp import llama_grammar

from . import interrupt
from . import schema as _schema
from .backend import _recent_log
from .files import EngineError

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
assert TOKEN_DATA.itemsize == ctypes.sizeof(C.llama_token_data)

ANY_JSON_OBJECT = llama_grammar.JSON_GBNF
"""GBNF for any JSON object (llama.cpp's grammars/json.gbnf): `--format json`, json_object."""

_STDERR = threading.Lock()   # fd 2 is the process's: one capture at a time


class GrammarError(EngineError):
    """A grammar or JSON schema that cannot be used; the message is one line naming the problem."""


def schema_grammar(schema: str | dict) -> str:
    """GBNF for a JSON schema (text or parsed), refusing what would not be enforced (engine/schema.py)."""
    return _schema.schema_grammar(schema, GrammarError)


def _parse(vocab, text: str, root: str):
    """llama_sampler_init_grammar, with what its parser prints on fd 2 caught: (sampler, message)."""
    with _STDERR, tempfile.TemporaryFile() as caught:
        _recent_log.clear()   # what llama.cpp logs (not prints) about this grammar, e.g. left recursion
        saved = os.dup(2)
        try:
            os.dup2(caught.fileno(), 2)
            smpl = C.llama_sampler_init_grammar(vocab, text.encode("utf-8"), root.encode("utf-8"))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        said = caught.read(4096).decode("utf-8", "replace")
    return smpl, "\n".join([said, *_recent_log])


def _reason(said: str, root: str) -> str:
    for line in said.splitlines():
        if "error parsing grammar:" in line:
            return line.split("error parsing grammar:", 1)[1].strip()[:200]
        if "left recursion" in line:
            return ("a rule refers to itself before matching any text (left recursion), which llama.cpp "
                    "cannot parse: write it as a repetition, e.g. list ::= item (\",\" item)*")
    if root:
        return f"no rule named '{root}', or a rule used but not defined"
    return "it could not be parsed"


MAX_REPEAT = 2000
"""llama.cpp's MAX_REPETITION_THRESHOLD (src/llama-grammar.cpp): a larger minimum is refused, and a
larger maximum silently becomes no maximum at all."""

MAX_NESTING = _schema.MAX_NESTING


def check_repetitions(text: str) -> None:
    """Refuse the `{m,n}` repetitions llama.cpp's parser mishandles, before it sees them: with m > n
    it expands n - m (unsigned, so ~1.8e19) rules, growing memory at ~300 MB/s until the OOM killer
    ends the process, deaf to Ctrl-C; a maximum over MAX_REPEAT becomes unbounded without a word.
    Braces inside string literals, character classes and comments are text, not repetitions.
    Groups nested deeper than MAX_NESTING are refused too: llama.cpp parses them by recursion, and
    ~15,000 levels overflow an 8 MB stack (SIGSEGV, the whole process)."""
    i, n, depth = 0, len(text), 0
    while i < n:
        c = text[i]
        if c == "(":
            depth += 1
            if depth > MAX_NESTING:
                raise GrammarError(f"bad grammar: groups nest more than {MAX_NESTING} deep, more than "
                                   f"llama.cpp's parser can take")
        elif c == ")":
            depth = max(depth - 1, 0)
        elif c == "#":
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif c in "\"[":
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and text[i] != close:
                i += 2 if text[i] == "\\" else 1
        elif c == "{":
            j = text.find("}", i)
            body = text[i + 1:j if j >= 0 else n]
            parts = [p.strip() for p in body.split(",")]
            if len(parts) <= 2 and all(p.isascii() and p.isdigit() for p in parts if p) and parts[0]:
                low = int(parts[0])
                high = low if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
                shown = "{" + body.strip() + "}"
                if high is not None and low > high:
                    raise GrammarError(f"bad grammar: repetition {shown} asks for at least {low} and at most {high}")
                if low > MAX_REPEAT or (high is not None and high > MAX_REPEAT):
                    raise GrammarError(f"bad grammar: repetition {shown}: llama.cpp repeats an item at most "
                                       f"{MAX_REPEAT} times (a larger maximum would not be enforced)")
        i += 1


class Grammar:
    """One grammar state over a model's vocabulary (see the module docstring)."""

    def __init__(self, smpl, vocab, n_vocab: int):
        self._smpl = smpl
        self._vocab = vocab
        self.n_vocab = n_vocab
        self._buf = np.zeros(64, dtype=TOKEN_DATA)

    @classmethod
    def compile(cls, vocab, n_vocab: int, text: str, root: str = "root") -> "Grammar":
        if not text.strip():
            raise GrammarError("the grammar is empty")
        if "\x00" in text:
            raise GrammarError("the grammar contains a NUL character")
        check_repetitions(text)
        with interrupt.deferred():   # a build that takes long stops at a second Ctrl-C
            smpl, said = _parse(vocab, text, root)
        if not smpl:
            raise GrammarError(f"bad grammar: {_reason(said, root)}")
        return cls(smpl, vocab, n_vocab)

    def allowed(self, ids) -> np.ndarray:
        """For each id, whether the grammar lets it come next (ids past the vocabulary: never)."""
        ids = np.asarray(ids, dtype=np.int64)
        ok = (ids >= 0) & (ids < self.n_vocab)
        n = int(ok.sum())
        if n == 0:
            return ok
        if len(self._buf) < n:
            self._buf = np.zeros(max(n, 2 * len(self._buf)), dtype=TOKEN_DATA)
        buf = self._buf[:n]
        buf["id"] = ids[ok]
        buf["logit"] = 0.0
        arr = C.llama_token_data_array(
            data=buf.ctypes.data_as(ctypes.POINTER(C.llama_token_data)), size=n, selected=-1, sorted=False)
        C.llama_sampler_apply(self._smpl, ctypes.byref(arr))
        out = np.zeros(len(ids), dtype=bool)
        out[ok] = buf["logit"] == 0.0
        return out

    def accept(self, token: int) -> None:
        """Advance past `token`, which must be allowed here (and not an end of generation)."""
        if C.llama_vocab_is_eog(self._vocab, int(token)) or not self.allowed([token])[0]:
            raise GrammarError(f"token {token} is not allowed by the grammar here")
        C.llama_sampler_accept(self._smpl, int(token))

    def fork(self) -> "Grammar":
        """An independent copy of this state."""
        smpl = C.llama_sampler_clone(self._smpl)
        if not smpl:
            raise GrammarError("llama.cpp could not copy the grammar state")
        return Grammar(smpl, self._vocab, self.n_vocab)

    def close(self) -> None:
        if self._smpl:
            C.llama_sampler_free(self._smpl)
            self._smpl = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def check_grammar(model_path, text: str, root: str = "root") -> None:
    """Parse `text` over the vocabulary of the GGUF at `model_path`, reading its vocabulary only (no
    weights: a fraction of a second), so that a command can refuse a bad grammar before it loads
    models or opens a screen; GrammarError in one line as `Grammar.compile` gives it."""
    from .backend import _init_backend

    _init_backend()
    params = C.llama_model_default_params()
    params.vocab_only = True
    model = C.llama_model_load_from_file(os.fsencode(str(model_path)), params)
    if not model:
        raise EngineError(f"failed to read the vocabulary of {model_path}")
    try:
        vocab = C.llama_model_get_vocab(model)
        Grammar.compile(vocab, C.llama_vocab_n_tokens(vocab), text, root).close()
    finally:
        C.llama_model_free(model)
