"""The HTTP plumbing of `localspec serve` (Starlette): reading bodies, server-sent events,
disconnects, OpenAI-style error answers, and counting answers for /metrics."""

from __future__ import annotations

import json
import threading

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from .serve_api import ApiError
from .serve_metrics import Metrics

MAX_BODY = 1 << 20     # bytes of a request body


class EventStream(StreamingResponse):
    """text/event-stream that cancels its job however the response ends (even unstarted)."""

    def __init__(self, events, cancel: threading.Event):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.cancel = cancel

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.cancel.set()


class CountRequests:
    """ASGI middleware: count every answer by endpoint and status for /metrics."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {}

        async def counting(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting)
        finally:
            self.metrics.request(scope["path"], status.get("code", 500))


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


async def watch_disconnect(request: Request, cancel: threading.Event) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


def sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return JSONResponse(ApiError(str(exc.detail), status=exc.status_code).body(), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(ApiError(f"internal error ({type(exc).__name__}: {exc})", status=500,
                                 kind="server_error").body(), status_code=500)


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
