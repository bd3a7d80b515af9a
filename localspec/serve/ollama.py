"""Ollama's API on the same server (`localspec serve --port 11434` stands in for Ollama).

/api/chat and /api/generate stream NDJSON by default (`"stream": false`: one JSON object);
/api/tags, /api/show, /api/version and /api/ps describe the one loaded target, whatever model name
a client asks for (as the OpenAI routes serve any name). A request is mapped onto an OpenAI body
and checked by the same parser (`api.parse`), so the options mean what they mean there:
temperature, top_k, top_p, min_p, seed, stop, repeat_penalty, presence_penalty, frequency_penalty,
num_predict (max_tokens; 0, negative or absent, as in Ollama: until the context is full); num_ctx is accepted up to the
server's context, refused above it; Ollama's other options (num_thread, num_gpu...) are the server's
business and ignored. `format` is "json" or a JSON schema (the grammar of response_format);
`tools` goes through the same machinery as OpenAI's (calls in Ollama's shape, arguments as an
object). Replies carry Ollama's fields, durations in nanoseconds, and localspec's α and the rest
in a `localspec` object. Every answer under /api/ that is not one is Ollama's `{"error": message}`
(`http.refusal`): a 4xx for a bad request, 404 for an unknown path, 405 for a wrong method, and 501
for Ollama's endpoints that have no counterpart here (`NOT_SERVED`: pulling, pushing, creating,
copying and deleting models, blobs, embeddings), so that Ollama's clients raise their own error
with the message as text.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timezone

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from localspec import __version__
from .api import parse, usage
from .calls import CallSplitter, ollama_calls, reply_calls
from .errors import ApiError
from .http import EventStream, collect, read_json

OLLAMA_VERSION = "0.9.0"   # the Ollama API this answers like; clients gate features on it
OPTIONS = ("temperature", "top_k", "top_p", "min_p", "seed", "stop", "repeat_penalty", "presence_penalty",
           "frequency_penalty")


_ONE_MODEL = "localspec serves the one model it was started with and does not manage models"
NOT_SERVED = {
    "/api/pull": f"{_ONE_MODEL}; download one with `localspec pull` and serve it with `localspec serve --target`",
    "/api/push": _ONE_MODEL, "/api/create": _ONE_MODEL, "/api/copy": _ONE_MODEL, "/api/delete": _ONE_MODEL,
    "/api/blobs/{digest:path}": _ONE_MODEL,
    "/api/embed": "embeddings are not supported", "/api/embeddings": "embeddings are not supported",
}
"""Ollama's endpoints without a counterpart here, and why. 501 rather than 404: a client that
reads a 404 as "model not found" would try to pull it, and 404 says the path is wrong."""


def ollama_routes(server) -> list[Route]:
    api = Ollama(server)
    return [Route("/api/chat", api.chat, methods=["POST"]),
            Route("/api/generate", api.generate, methods=["POST"]),
            Route("/api/tags", api.tags, methods=["GET"]),
            Route("/api/show", api.show, methods=["POST"]),
            Route("/api/version", api.version, methods=["GET"]),
            Route("/api/ps", api.ps, methods=["GET"]),
            *(Route(path, NotServed(why)) for path, why in NOT_SERVED.items())]


class NotServed:
    """A refusal (501) for every method: a plain ASGI app, as Starlette gives a function GET only."""

    def __init__(self, why: str):
        self.why = why

    async def __call__(self, scope, receive, send) -> None:
        raise ApiError(f"{scope['path'][:200]} is not implemented by localspec: {self.why}", status=501,
                       code="not_implemented")


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _refuse(message: str, param: str | None = None) -> None:
    raise ApiError(message, param=param, code="invalid_value")


def openai_body(body, chat: bool, n_ctx: int, has_template: bool) -> tuple[dict, bool]:
    """(an OpenAI body, whether it is a chat) for an Ollama /api/chat or /api/generate body."""
    if not isinstance(body, dict):
        _refuse("the request body must be a JSON object")
    stream = body.get("stream")
    if stream is None:   # absent or null: Ollama streams
        stream = True
    elif not isinstance(stream, bool):
        _refuse("'stream' must be a boolean", "stream")
    if body.get("think"):
        _refuse("this model does not support thinking ('think')", "think")
    out: dict = {"stream": stream}
    if chat:
        messages = body.get("messages")
        for m in messages if isinstance(messages, list) else []:
            if isinstance(m, dict) and m.get("images"):
                _refuse("images are not supported", "images")
        out["messages"] = messages
        if body.get("tools") is not None:
            out["tools"] = body["tools"]
    else:
        for name in ("images", "suffix", "context", "template"):
            if body.get(name):
                _refuse(f"'{name}' is not supported", name)
        prompt, system = body.get("prompt") or "", body.get("system")   # none: a load request
        if not isinstance(prompt, str) or not (system is None or isinstance(system, str)):
            _refuse("'prompt' (and 'system', if given) must be strings", "prompt")
        if body.get("raw") or not has_template:   # raw: the prompt as given, no chat template
            out["prompt"], chat = prompt, False
        else:
            out["messages"] = [*([{"role": "system", "content": system}] if system else []),
                               {"role": "user", "content": prompt}]
            chat = True
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        _refuse("'format' must be \"json\" or a JSON schema (an object)", "format")
    options = body.get("options") or {}
    if not isinstance(options, dict):
        _refuse("'options' must be an object", "options")
    out.update((k, options[k]) for k in OPTIONS if k in options)
    predict = options.get("num_predict")
    if predict is not None:
        if not isinstance(predict, int) or isinstance(predict, bool):
            _refuse("options.num_predict must be an integer", "options.num_predict")
        out["max_tokens"] = predict if predict > 0 else n_ctx   # 0, -1, -2: until the context is full
    else:
        out["max_tokens"] = n_ctx   # Ollama's default: no limit but the context
    num_ctx = options.get("num_ctx")
    if num_ctx is not None and (not isinstance(num_ctx, int) or isinstance(num_ctx, bool) or num_ctx > n_ctx):
        _refuse(f"options.num_ctx must be an integer of at most the server's context, {n_ctx} tokens "
                f"(start it with a larger --n-ctx), got {str(num_ctx)[:40]}", "options.num_ctx")
    return out, chat


class Ollama:
    """The Ollama routes over a running `app.Server`."""

    def __init__(self, server):
        self.server = server

    # ---- generation ------------------------------------------------------------------------------
    async def chat(self, request: Request):
        return await self._generate(request, chat=True)

    async def generate(self, request: Request):
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, chat: bool):
        start = time.perf_counter_ns()
        server = self.server
        server._authorize(request)
        server._refuse_if_full()
        body = await read_json(request)
        target = server.session.target
        mapped, as_chat = openai_body(body, chat, server.session.n_ctx, target.chat_template is not None)
        model = body.get("model") if isinstance(body.get("model"), str) and body.get("model") else server.model_id
        if not body.get("messages" if chat else "prompt"):   # Ollama's way to load a model: nothing to do
            unload = body.get("keep_alive") in (0, "0", "0s", "0m")
            return JSONResponse({**Shape(model, chat, None, start).part(done=True),
                                 "done_reason": "unload" if unload else "load"})
        req = parse(mapped, server.defaults, as_chat, ollama=True)
        job, watcher = await server.submit(request, req)
        shape = Shape(model, chat, req.tools, start)
        try:
            if req.stream:
                return EventStream(shape.lines(job), job.cancel, media_type="application/x-ndjson")
            text, result = await collect(job)
        finally:
            watcher.cancel()
        return JSONResponse(shape.whole(text, result))

    # ---- the model -------------------------------------------------------------------------------
    def _model(self) -> dict:
        target = self.server.session.target
        path = target.path
        stat = path.stat() if path.exists() else None
        size = stat.st_size if stat else 0
        modified = datetime.fromtimestamp(stat.st_mtime if stat else 0, timezone.utc)
        family = target.meta("general.architecture") or ""
        stem = path.stem.rsplit(".", 1)
        details = {"parent_model": "", "format": "gguf", "family": family, "families": [family] if family else None,
                   "parameter_size": target.meta("general.size_label") or "",
                   "quantization_level": stem[1].upper() if len(stem) == 2 else ""}
        digest = hashlib.sha256(f"{path}:{size}:{modified}".encode()).hexdigest()   # not the file's bytes
        name = self.server.model_id
        return {"name": name, "model": name, "modified_at": modified.isoformat().replace("+00:00", "Z"),
                "size": size, "digest": digest, "details": details}

    async def tags(self, request: Request) -> JSONResponse:
        self.server._authorize(request)
        return JSONResponse({"models": [self._model()]})

    async def ps(self, request: Request) -> JSONResponse:
        self.server._authorize(request)
        model = self._model()
        model.pop("modified_at")
        return JSONResponse({"models": [{**model, "expires_at": "2999-01-01T00:00:00Z", "size_vram": 0,
                                         "context_length": self.server.session.n_ctx}]})

    async def show(self, request: Request) -> JSONResponse:
        self.server._authorize(request)
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("model", body.get("name")), str):
            _refuse("'model' is required", "model")
        target, model = self.server.session.target, self._model()
        template = target.chat_template or ""
        family = model["details"]["family"]
        info = {"general.architecture": family, "general.parameter_count": target.describe()["n_params"],
                f"{family}.context_length": self.server.session.n_ctx}
        return JSONResponse({"license": "", "modelfile": f"# served by localspec\nFROM {target.name}\n",
                             "parameters": "", "template": template, "details": model["details"],
                             "model_info": info, "modified_at": model["modified_at"],
                             "capabilities": ["completion", "tools"] if template else ["completion"]})

    async def version(self, request: Request) -> JSONResponse:
        return JSONResponse({"version": OLLAMA_VERSION, "localspec": __version__})


class Shape:
    """Ollama's objects for one answer, streamed or whole."""

    def __init__(self, model: str, chat: bool, tools, start_ns: int):
        self.model, self.chat, self.tools, self.start = model, chat, tools, start_ns

    def part(self, text: str = "", calls: list[dict] | None = None, done: bool = False) -> dict:
        out = {"model": self.model, "created_at": now()}
        if self.chat:
            out["message"] = {"role": "assistant", "content": text}
            if calls:
                out["message"]["tool_calls"] = ollama_calls(calls)
        else:
            out["response"] = text
        out["done"] = done
        return out

    def last(self, result: dict, text: str = "", calls: list[dict] | None = None) -> dict:
        prefill = result.get("prefill_seconds") or 0.0
        return {**self.part(text, calls, done=True),
                "done_reason": "stop" if result["finish"] == "stop" or calls else "length",
                "total_duration": time.perf_counter_ns() - self.start, "load_duration": 0,
                "prompt_eval_count": result["n_prompt"], "prompt_eval_duration": int(prefill * 1e9),
                "eval_count": result["n_tokens"], "eval_duration": int(result["seconds"] * 1e9),
                "localspec": {**usage(result)["localspec"], "cached_tokens": result["n_cached"]}}

    def whole(self, text: str, result: dict) -> dict:
        content, calls = reply_calls(text, self.tools.names, self.tools.parallel) if self.tools else (text, [])
        return self.last(result, content if calls else text, calls)

    async def lines(self, job):
        split = CallSplitter(self.tools.names, self.tools.parallel) if self.tools else None
        while True:
            kind, value = await job.queue.get()
            if kind == "text":
                text = split.feed(value) if split is not None else value
                if text:
                    yield _line(self.part(text))
            elif kind == "error" or value["finish"] == "cancelled":
                yield _line({"error": value.message if kind == "error" else "the server is shutting down"})
                return
            else:
                rest, calls = split.finish() if split is not None else ("", [])
                if rest:
                    yield _line(self.part(rest))
                if calls:   # in a part of their own (as Ollama), then the usual last line
                    yield _line(self.part(calls=calls))
                    value = {**value, "finish": "stop"}
                yield _line(self.last(value))
                return


def _line(obj: dict) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()
