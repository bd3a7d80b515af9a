"""`localspec serve`'s ASGI application driven by hand, without uvicorn: the client's side of each
exchange is scripted, so cases a real server and client cannot be made to show on demand are
shown exactly (a send() that returns silently once the client has gone, as uvicorn 0.29-0.32's
does; a request answered before its body is tokenized). On the embedded default pair.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

MAX_TOKENS = 400   # far more than a step: a stream that runs to its end is plain to see


@pytest.fixture(scope="module")
def session(model_paths):
    from localspec.loading.session import LoadConfig, Session

    s = Session.load(LoadConfig(threads=1))
    yield s
    s.close()


@pytest.fixture
def server(session):
    from localspec.config import SamplingConfig
    from localspec.serve.app import Server
    from localspec.serve.api import Defaults

    s = Server(session, Defaults(SamplingConfig(temperature=0.0), max_tokens=24), max_queue=0, warm_start=False)
    yield s
    s.close()


class Exchange:
    """One HTTP request as an ASGI server would hand it over (spec 2.4, as uvicorn >= 0.29 declare):
    `receive` gives the body, then waits until `leave()` to report the disconnect; `send` records
    what it is given and returns silently, before and after the client has gone."""

    def __init__(self, path: str, body: dict | bytes):
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
            "query_string": b"", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080),
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(self.body)).encode())],
        }
        self._read = False
        self._gone = asyncio.Event()
        self.status: int | None = None
        self.chunks: list[bytes] = []
        self.streaming = asyncio.Event()   # set at the first non-empty body chunk

    def leave(self) -> None:
        self._gone.set()

    async def receive(self) -> dict:
        if not self._read:
            self._read = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body" and message.get("body"):
            self.chunks.append(message["body"])
            self.streaming.set()

    def error_code(self) -> str:
        return json.loads(b"".join(self.chunks))["error"]["code"]


def finished(server, how: str) -> float:
    """Generations of `server` that ended `how`, from its /metrics text."""
    line = f'localspec_generations_total{{finish="{how}"}} '
    return sum(float(x.split()[-1]) for x in server.metrics.render(0, False).splitlines() if x.startswith(line))


def test_a_stream_whose_client_left_stops_though_send_returns_silently(server):
    """Starlette >= 0.42 leaves noticing the disconnect to send() under spec 2.4, and uvicorn
    0.29-0.32's send() returns silently: the server's own watcher must stop the generation."""
    app = server.app()

    async def scenario() -> Exchange:
        stream = Exchange("/v1/completions", {"prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "stream": True})
        call = asyncio.create_task(app(stream.scope, stream.receive, stream.send))
        await stream.streaming.wait()
        stream.leave()
        await call
        return stream

    stream = asyncio.run(scenario())
    server.close()   # waits for the worker: the generation has ended, its counts are in
    assert stream.status == 200
    assert finished(server, "cancelled") == 1 and finished(server, "length") == 0
    assert server.metrics.completion_tokens < MAX_TOKENS / 4


def test_a_full_or_closing_server_refuses_a_large_body_before_tokenizing_it(server, session, monkeypatch):
    tokenized = []
    for name in ("tokenize", "chat_prompt"):   # chat_prompt renders, then calls tokenize
        real = getattr(session.target, name)
        monkeypatch.setattr(session.target, name, lambda *a, real=real, name=name, **kw:
                            tokenized.append(name) or real(*a, **kw))
    large = {"messages": [{"role": "user", "content": "lighthouse " * 90_000}], "max_tokens": 4}   # ~1 MB
    app = server.app()

    async def scenario() -> tuple[Exchange, Exchange]:
        # --max-queue 0 and a generation running: no place left
        stream = Exchange("/v1/completions", {"prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "stream": True})
        call = asyncio.create_task(app(stream.scope, stream.receive, stream.send))
        await stream.streaming.wait()
        tokenized.clear()
        full = Exchange("/v1/chat/completions", large)
        await app(full.scope, full.receive, full.send)
        assert tokenized == [], "tokenized before it was refused"
        server.stop_generation()   # shutdown has begun
        closing = Exchange("/v1/chat/completions", large)
        await app(closing.scope, closing.receive, closing.send)
        stream.leave()
        await call
        return full, closing

    full, closing = asyncio.run(scenario())
    assert full.status == 503 and full.error_code() == "queue_full"
    assert closing.status == 503 and closing.error_code() == "shutting_down"
    assert tokenized == []


def test_admitted_requests_are_tokenized_one_at_a_time(server, session, monkeypatch):
    """The tokenizer has a thread of its own: a burst of admitted bodies cannot take every core.
    Each call waits a while for a rival to show up beside it; none may."""
    lock, rival = threading.Lock(), threading.Event()
    active, peak = [0], [0]
    real = session.target.chat_prompt

    def watched(messages, tools=None):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            if active[0] > 1:
                rival.set()
        try:
            rival.wait(0.5)
            return real(messages, tools)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(session.target, "chat_prompt", watched)
    monkeypatch.setattr(server, "max_queue", 4)
    app = server.app()

    async def scenario() -> list[Exchange]:
        burst = [Exchange("/v1/chat/completions", {"messages": [{"role": "user", "content": f"Say {i}."}],
                                                   "max_tokens": 1}) for i in range(3)]
        await asyncio.gather(*(app(e.scope, e.receive, e.send) for e in burst))
        return burst

    burst = asyncio.run(scenario())
    assert [e.status for e in burst] == [200] * 3
    assert peak[0] == 1
