"""The OpenAI-compatible API of `localspec serve`: reading and checking requests, building responses.

No web framework here: request bodies arrive as parsed JSON (dicts), answers leave as dicts, and
every refusal is an `ApiError` carrying its HTTP status and OpenAI's error body. What localspec
cannot do is refused, never silently ignored: n > 1, log probabilities, the deprecated
`functions`. Tools (`tools`, `tool_choice`, `parallel_tool_calls`) are checked in
`localspec.serve.tools` and the calls read out of the reply in `localspec.serve.calls`; messages
(tool turns included) in `localspec.serve.messages`. Fields OpenAI defines that change nothing here
(user, store, metadata…) and unknown fields are ignored, as clients send them freely.

`presence_penalty`, `frequency_penalty` (OpenAI's range, -2 to 2) and `logit_bias` (token id ->
-100 to 100; -100 bans) apply to the target's processed distribution as llama.cpp computes it,
over the last --repeat-last-n tokens of prompt and output (`localspec.decoding.processing`).
Extensions: `top_k`, `min_p` and `repeat_penalty` (as llama.cpp's server takes them), and `usage.localspec` (α,
draft efficiency, tokens per target pass, mean k, drafter, tokens/s, seed) in every usage object.

`response_format`: {"type": "json_object"} (any JSON object), {"type": "json_schema", "json_schema":
{"name", "schema", "strict"}} (converted to a grammar by llama-cpp-python's json_schema_to_gbnf; an
unusable schema is a 400 naming the problem), or {"type": "text"} (no constraint, whatever the
server's --grammar / --format default). Under a grammar, finish_reason "stop" means the grammar was
complete (the end of generation is allowed only then), "length" that max_tokens cut it first.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from localspec.config import ConfigError, DecodeConfig, SamplingConfig
from localspec.loading.controllers import k_max_for
from .calls import openai_calls, reply_calls
from .errors import ApiError
from .messages import messages as _messages
from .tools import Tools, parse_tools

MAX_STOP = 4   # as OpenAI


@dataclass(frozen=True)
class Defaults:
    """What the command line set: each request may override the sampling fields and max_tokens."""

    sampling: SamplingConfig
    max_tokens: int = 256
    k: int | None = None
    seed: int | None = None
    """The --seed given on the command line; None = a random seed per request."""
    tree: str | tuple[int, ...] = "off"
    """--tree: draft trees of every request ("off", "auto" or a shape; the session's models hold
    the sequences it needs)."""


@dataclass(frozen=True)
class Request:
    """A checked request, ready to tokenize and generate."""

    chat: bool
    messages: list[dict] | None
    prompt: str | list[int] | None
    sampling: SamplingConfig
    decode: DecodeConfig
    stream: bool
    include_usage: bool
    tools: Tools | None = None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _typed(body: dict, name: str, check, what: str) -> Any:
    value = body.get(name)
    if value is not None and not check(value):
        raise ApiError(f"'{name}' must be {what}, got {type(value).__name__} {value!r:.40}", param=name,
                       code="invalid_type")
    return value


def _unsupported(body: dict) -> None:
    def refuse(param: str, message: str) -> None:
        raise ApiError(message, param=param, code="unsupported_parameter")

    n = _typed(body, "n", _is_int, "an integer")
    if n is not None and n != 1:
        refuse("n", f"localspec generates one choice per request; n must be 1, got {n}")
    best_of = _typed(body, "best_of", _is_int, "an integer")
    if best_of is not None and best_of != 1:
        refuse("best_of", f"best_of must be 1, got {best_of}")
    if body.get("logprobs") not in (None, False):
        refuse("logprobs", "log probabilities are not supported")
    if body.get("top_logprobs") is not None:
        refuse("top_logprobs", "log probabilities are not supported")
    if body.get("echo"):
        refuse("echo", "echo is not supported")
    if body.get("suffix") is not None:
        refuse("suffix", "suffix is not supported")


def _sampling(body: dict, defaults: Defaults) -> SamplingConfig:
    cfg = defaults.sampling
    for name, check, what in (("temperature", _is_number, "a number"), ("top_p", _is_number, "a number"),
                              ("top_k", _is_int, "an integer"), ("min_p", _is_number, "a number")):
        value = _typed(body, name, check, what)
        if name == "temperature" and value is not None and not 0 <= value <= 2:   # OpenAI's range
            raise ApiError(f"temperature must be between 0 and 2, got {value}", param=name, code="invalid_value")
        if value is not None:
            try:
                cfg = replace(cfg, **{name: value})
            except ConfigError as e:
                raise ApiError(str(e), param=name, code="invalid_value") from None
    for name, low, high in (("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0),
                            ("repeat_penalty", 0.0, math.inf)):
        value = _typed(body, name, _is_number, "a number")
        if value is None:
            continue
        if not (low <= value <= high if name != "repeat_penalty" else low < value < high):
            raise ApiError(f"{name} must be {'between -2 and 2' if high == 2.0 else 'a number > 0'}, got {value}",
                           param=name, code="invalid_value")
        try:   # the float32 rows' own bounds (config.LOGIT_LIMIT)
            cfg = replace(cfg, **{name: float(value)})
        except ConfigError as e:
            raise ApiError(str(e).replace("-", "_", 1), param=name, code="invalid_value") from None
    bias = body.get("logit_bias")
    if bias is not None:
        cfg = replace(cfg, logit_bias=_logit_bias(bias))
    fmt = body.get("response_format")
    if fmt is not None:
        cfg = replace(cfg, **_response_format(fmt))
    seed = _typed(body, "seed", _is_int, "an integer")
    if seed is None:
        seed = defaults.seed
    if seed is not None and seed < -1:
        raise ApiError(f"seed must be >= 0, or -1 for a random one; got {seed}", param="seed", code="invalid_value")
    if seed is None or seed == -1:
        seed = secrets.randbits(31)
    return replace(cfg, seed=seed)


def _response_format(fmt) -> dict:
    """The grammar fields of SamplingConfig for OpenAI's response_format."""
    from localspec.engine.grammar import ANY_JSON_OBJECT, GrammarError, schema_grammar

    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return {"grammar": "", "grammar_name": ""}
    if kind == "json_object":
        return {"grammar": ANY_JSON_OBJECT, "grammar_name": "json"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError("response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}",
                           param="response_format", code="invalid_value")
        try:
            return {"grammar": schema_grammar(schema), "grammar_name": f"schema {str(spec.get('name', ''))[:40]}".strip()}
        except GrammarError as e:
            raise ApiError(f"response_format: {e}", param="response_format", code="invalid_value") from None
    raise ApiError("response_format type must be text, json_object or json_schema", param="response_format",
                   code="invalid_value")


def check_with(sampling: SamplingConfig, target) -> None:
    """What only the loaded target can check: logit-bias ids inside its vocabulary (a bias on an id
    it lacks would change nothing), and the grammar, parsed by llama.cpp here so that a bad one is
    a 400, not a broken stream."""
    from localspec.decoding.processing import check_bias_ids
    from localspec.engine import GrammarError

    try:
        check_bias_ids(sampling, target.n_vocab)
    except ConfigError as e:
        raise ApiError(str(e).replace("logit-bias", "logit_bias"), param="logit_bias", code="invalid_value") from None
    if sampling.grammar:
        param = "tools" if sampling.grammar_name == "tool call" else "response_format"
        try:
            target.grammar(sampling.grammar).close()
        except GrammarError as e:
            raise ApiError(f"{param}: {e}", param=param, code="invalid_value") from None


def _logit_bias(bias) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]}, added to those logits; -100 bans a
    token (as OpenAI: in effect), which here is exactly -inf, so it can never be drawn."""
    if not isinstance(bias, dict):
        raise ApiError("'logit_bias' must be an object of token ids to numbers", param="logit_bias",
                       code="invalid_type")
    out = []
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isdigit()) or not _is_number(value) or not -100 <= value <= 100:
            raise ApiError(f"logit_bias maps token ids to numbers in [-100, 100]; got {str(key)[:40]!r}: "
                           f"{str(value)[:40]}", param="logit_bias", code="invalid_value")
        out.append((int(key), -math.inf if value == -100 else float(value)))
    return tuple(out)


def _decode(body: dict, defaults: Defaults) -> DecodeConfig:
    # both are checked; the newer name wins when both are given
    max_tokens = _typed(body, "max_tokens", _is_int, "an integer")
    newer = _typed(body, "max_completion_tokens", _is_int, "an integer")
    param = "max_completion_tokens" if newer is not None else "max_tokens"
    max_tokens = newer if newer is not None else max_tokens
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise ApiError("'stop' must be a string or a list of strings", param="stop", code="invalid_type")
    if len(stop) > MAX_STOP:
        raise ApiError(f"at most {MAX_STOP} stop strings, got {len(stop)}", param="stop", code="invalid_value")
    try:
        return DecodeConfig(max_tokens=defaults.max_tokens if max_tokens is None else max_tokens,
                            k=defaults.k, k_max=k_max_for(defaults.k), stop=tuple(stop), tree=defaults.tree)
    except ConfigError as e:
        raise ApiError(str(e), param=param, code="invalid_value") from None


def _streaming(body: dict) -> tuple[bool, bool]:
    stream = bool(_typed(body, "stream", lambda v: isinstance(v, bool), "a boolean"))
    options = _typed(body, "stream_options", lambda v: isinstance(v, dict), "an object")
    if options is not None and not stream:
        raise ApiError("stream_options is only allowed when stream is true", param="stream_options",
                       code="invalid_value")
    include = (options or {}).get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise ApiError("stream_options.include_usage must be a boolean", param="stream_options.include_usage",
                       code="invalid_type")
    return stream, bool(include)


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]   # one prompt in a list: allowed; several would be n > 1
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        return prompt
    if prompt is None:
        raise ApiError("'prompt' is required", param="prompt", code="missing_required_parameter")
    raise ApiError("'prompt' must be a non-empty string, or one list of token ids (one prompt per request)",
                   param="prompt", code="invalid_value")


def parse(body: Any, defaults: Defaults, chat: bool, ollama: bool = False) -> Request:
    """Check a request body of /v1/chat/completions (`chat`) or /v1/completions; `ollama`: one
    mapped from Ollama's API, whose tool turns may leave out which call they answer."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_json")
    _unsupported(body)
    messages = _messages(body, ollama) if chat else None
    prompt = None if chat else _prompt(body)
    tools = parse_tools(body)
    if tools is not None and not chat:
        raise ApiError("tools are for /v1/chat/completions", param="tools", code="unsupported_parameter")
    if tools is not None and tools.constrained and body.get("response_format") not in (None, {"type": "text"}):
        raise ApiError("a forced tool call (tool_choice) has its own grammar: drop response_format",
                       param="response_format", code="invalid_value")
    stream, include_usage = _streaming(body)
    return Request(chat, messages, prompt, _sampling(body, defaults), _decode(body, defaults), stream,
                   include_usage, tools)


def too_long(n_prompt: int, n_ctx: int, chat: bool) -> ApiError:
    return ApiError(f"the prompt is {n_prompt} tokens, too long for the context of {n_ctx} tokens "
                    "(it must leave room for at least one generated token; start the server with a larger --n-ctx)",
                    param="messages" if chat else "prompt", code="context_length_exceeded")


# ---- responses -----------------------------------------------------------------------------------

def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)


def finish_reason(finish: str | None) -> str:
    """The decoder's finish as OpenAI names it: n_ctx reached is a length limit too."""
    return finish if finish in ("stop", "tool_calls") else "length"


def usage(result: dict) -> dict:
    """OpenAI's usage object, plus `localspec`: how speculation went for this request."""
    return {
        "prompt_tokens": result["n_prompt"],
        "completion_tokens": result["n_tokens"],
        "total_tokens": result["n_prompt"] + result["n_tokens"],
        "prompt_tokens_details": {"cached_tokens": result["n_cached"]},
        "localspec": {
            "alpha": result["alpha"],
            "draft_efficiency": result["draft_efficiency"],
            "tokens_per_pass": result["tokens_per_pass"],
            "mean_k": result["mean_k"],
            "drafter": result["drafter"],
            "tokens_per_second": result["tokens_per_second"],
            "n_drafted": result["n_drafted"],
            "n_accepted": result["n_accepted"],
            "prefill_seconds": result["prefill_seconds"],
            "seed": result["seed"],
        },
    }


class Reply:
    """Builds the objects of one answer, streamed or whole (same id and creation time throughout)."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id, self.created = new_id(chat), int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, result: dict, tools: Tools | None = None) -> dict:
        reason = finish_reason(result["finish"])
        if self.chat:
            message = {"role": "assistant", "content": text}
            content, calls = reply_calls(text, tools.names, tools.parallel) if tools else (text, [])
            if calls:   # a reply that is not a call stays text, whatever tool_choice was
                message, reason = {"role": "assistant", "content": content or None,
                                   "tool_calls": openai_calls(calls)}, "tool_calls"
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage(result)}

    def chunk(self, text: str | None = None, finish: str | None = None, *, first: bool = False,
              include_usage: bool = False) -> dict:
        """A streamed piece: text, or (finish given) the last piece of the choice."""
        reason = None if finish is None else finish_reason(finish)
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            out = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            out = {**self._head("text_completion"), "choices": [choice]}
        if include_usage:
            out["usage"] = None   # as OpenAI: every chunk has the field, the last one fills it
        return out

    def calls_chunk(self, calls: list[dict], include_usage: bool = False) -> dict:
        """The calls of a streamed reply, in one chunk (each whole: held back until the end)."""
        out = self.chunk(include_usage=include_usage)
        out["choices"][0]["delta"] = {"tool_calls": [{"index": i, **call} for i, call in enumerate(openai_calls(calls))]}
        return out

    def usage_chunk(self, result: dict) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(result)}
