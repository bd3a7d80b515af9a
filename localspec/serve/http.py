"""The HTTP plumbing of `localspec serve` (Starlette, uvicorn): the API key, reading bodies,
server-sent events, disconnects, error answers (OpenAI's shape, Ollama's under /api/), counting
answers for /metrics, and running uvicorn (in the foreground, or in a thread for the tests)."""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import threading
import time
from typing import Callable

import uvicorn
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from .errors import ApiError
from .metrics import Metrics

MAX_BODY = 1 << 20     # bytes of a request body
MAX_LOGGED = 200       # characters of a request's path in its log line


def key_matches(authorization: str, key: str) -> bool:
    """Whether an Authorization header value is `Bearer KEY`: the scheme in any case (RFC 7235),
    the key compared in constant time. On bytes: compare_digest refuses str with non-ASCII text
    (a TypeError, a 500). Starlette decodes header bytes as latin-1, so encoding back gives the
    bytes the client sent; a non-ASCII key matches its UTF-8 bytes."""
    scheme, _, token = authorization.strip().partition(" ")
    same = hmac.compare_digest(token.strip().encode("latin-1"), key.encode("utf-8"))
    return same and scheme.lower() == "bearer"


class EventStream(StreamingResponse):
    """text/event-stream (or Ollama's NDJSON) that cancels its job when the client leaves, and
    however the response ends (even unstarted)."""

    def __init__(self, events, cancel: threading.Event, media_type: str = "text/event-stream"):
        super().__init__(events, media_type=media_type,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.cancel = cancel

    async def __call__(self, scope, receive, send) -> None:
        # Starlette (>= 0.42) listens for the disconnect only under ASGI spec < 2.4, leaving it to
        # send() to fail; uvicorn 0.29-0.32 declare 2.4 and their send() returns silently once the
        # client is gone. So the stream watches for itself, whichever versions run.
        watcher = asyncio.create_task(watch_disconnect(receive, self.cancel))
        try:
            await super().__call__(scope, receive, send)
        finally:
            watcher.cancel()
            self.cancel.set()


class CountRequests:
    """ASGI middleware: count every answer by endpoint and status for /metrics, and hand `log` one
    line per answer once it has been sent whole (`request_line`; a generation's handler leaves its
    job in `request.state.job`)."""

    def __init__(self, app, metrics: Metrics, log: Callable[[str], None] | None = None):
        self.app, self.metrics, self.log = app, metrics, log

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {}
        start = time.monotonic()

        async def counting(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting)
        finally:
            code = status.get("code", 500)
            self.metrics.request(scope["path"], code)
            if self.log is not None:
                state = scope.get("state", {})
                self.log(request_line(scope["method"], scope["path"], code, time.monotonic() - start,
                                      getattr(state.get("job"), "result", None), state.get("refusal")))


def request_line(method: str, path: str, status: int, seconds: float, result: dict | None,
                 refusal: str | None = None) -> str:
    """`localspec: POST /v1/chat/completions 200 · 24 tokens · α 0.950 · 1.23 s`: tokens and α
    for a generation (α — when nothing was drafted), the seconds from the request to its answer's
    last byte; for a refused request, why (the error's message). The path and the message come
    from the client: shown escaped and cut, never as terminal control codes."""
    parts = [f"localspec: {method[:16]} {_shown(path)} {status}"]
    if result is not None:
        alpha = result.get("alpha")
        parts += [f"{result['n_tokens']} tokens", "α —" if alpha is None else f"α {alpha:.3f}"]
    if refusal:
        parts.append(_shown(refusal, 2 * MAX_LOGGED))
    return " · ".join([*parts, f"{seconds:.2f} s"])


def _shown(text: str, most: int = 0) -> str:
    most = most or MAX_LOGGED
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text[:most]) + ("…" if len(text) > most else "")


async def read_json(request: Request):
    length = request.headers.get("content-length", "")
    too_large = ApiError(f"the request body is larger than {MAX_BODY} bytes", status=413, code="body_too_large")
    if length.isdigit() and int(length) > MAX_BODY:
        raise too_large
    data = bytearray()
    async for part in request.stream():
        data += part
        if len(data) > MAX_BODY:
            raise too_large
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(f"the request body is not valid JSON ({e})", code="invalid_json") from None
    except RecursionError:
        raise ApiError("the request body nests too deeply", code="invalid_json") from None


async def watch_disconnect(receive, cancel: threading.Event) -> None:
    """Set `cancel` when the ASGI `receive` channel says the client has gone (after the body)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


def sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def ollama_path(path: str) -> bool:
    """Whether `path` is under Ollama's /api/, where refusals take Ollama's shape: its client reads
    `error` as the message, and an OpenAI-shaped body would hand it a dict."""
    return path == "/api" or path.startswith("/api/")


def refusal(request: Request, error: ApiError) -> JSONResponse:
    """`error` as the answer, in Ollama's shape (`{"error": message}`) under /api/, else OpenAI's."""
    request.state.refusal = error.message   # for the request's log line
    body = {"error": error.message} if ollama_path(request.url.path) else error.body()
    return JSONResponse(body, status_code=error.status, headers=error.headers)


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    return refusal(request, exc)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """The router's 404 and 405, with a message that says what to do instead."""
    where = f"{request.method[:16]} {_shown(request.url.path)}"
    headers = getattr(exc, "headers", None) or {}
    if exc.status_code == 404:
        message = f"{where}: no such endpoint (GET / lists them)"
    elif exc.status_code == 405:
        message = f"{where}: method not allowed; use {headers.get('allow') or headers.get('Allow') or 'another'}"
    else:
        message = str(exc.detail)
    return refusal(request, ApiError(message, status=exc.status_code, headers=headers,
                                     code="not_found" if exc.status_code == 404 else None))


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    return refusal(request, ApiError(f"internal error ({type(exc).__name__}: {exc})", status=500, kind="server_error"))


async def index(request: Request) -> JSONResponse:
    """`GET /`: where the API is, for a person or a client probing the address (the app's own
    routes, so the list cannot drift from them)."""
    endpoints = [f"{method} {route.path}" for route in request.app.routes if route.path != "/" and route.methods
                 for method in sorted(route.methods - {"HEAD"})]   # no methods: Ollama's, refused (501)
    return JSONResponse({"name": "localspec", "api": "OpenAI-compatible, under /v1", "endpoints": endpoints})


async def collect(job) -> tuple[str, dict]:
    """A whole (non-streamed) answer: the job's text and its final statistics."""
    parts = []
    while True:
        kind, value = await job.queue.get()
        if kind == "text":
            parts.append(value)
        elif kind == "error":
            raise value
        elif value["finish"] == "cancelled":
            raise ApiError("the request was cancelled (client gone or server shutting down)", status=503,
                           kind="server_error", code="cancelled")
        else:
            return "".join(parts), value


# ---- running uvicorn ---------------------------------------------------------------------------

class Uvicorn(uvicorn.Server):
    """uvicorn that stops the running generation as soon as shutdown is asked for."""

    def __init__(self, config: uvicorn.Config, owner):
        super().__init__(config)
        self.owner = owner

    def handle_exit(self, sig, frame) -> None:
        self.owner.stop_generation()
        super().handle_exit(sig, frame)


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening socket (port 0: a free one); OSError says why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def make_uvicorn(server, log_level: str = "warning") -> Uvicorn:
    """uvicorn over `server` (a localspec.serve.app.Server: its app, stopped by stop_generation)."""
    config = uvicorn.Config(server.app(), log_level=log_level, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=5)
    return Uvicorn(config, server)


def run(server, sock: socket.socket, log_level: str = "warning") -> None:
    """Serve on `sock` until Ctrl-C / SIGTERM (blocks)."""
    make_uvicorn(server, log_level).run(sockets=[sock])


def start_in_thread(server, sock: socket.socket) -> tuple[Uvicorn, threading.Thread]:
    """Serve from a background thread (tests); stop with `.should_exit = True` and join."""
    uv = make_uvicorn(server)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True, name="localspec-serve")
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    return uv, thread
