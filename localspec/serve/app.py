"""`localspec serve`: an OpenAI-compatible HTTP server (Starlette + uvicorn) over one loaded pair.

`parallel` generations at a time (`--parallel N`, default 1). The event loop reads and checks
requests, and admits each to a bounded FIFO (`max_queue` places besides the running ones) before
rendering and tokenizing it in a thread of its own (one: a flood of admitted bodies cannot take
every core); when the queue is full or the server is shutting down a request is answered 503 at
once, before any of that work. A generation runs `stream_text` in a worker thread (one per slot)
and hands its text to the loop through an asyncio queue (`loop.call_soon_threadsafe`). With
N > 1 the generations run in the slots of a `SlotPool`: each in its own thread, their decodes
batched together (engine.slots), a request going to the free slot whose cache shares the longest
prefix with its prompt; each slot keeps its own controllers, priced by their share of the batch. The target's KV cache is reused across requests by common
prefix (`Model.sync` in the decoder), so a chat that resends its history only prefills the new
turn; `usage.prompt_tokens_details.cached_tokens` says how much was reused. That also tells a
client, by the count and by the prefill time, how much of its prompt the previous client's shared:
`prefix_share=False` (`--no-prefix-share`) starts every request from an empty cache instead.

Each request gets a fresh drafter (`Session.make_drafter`; the draft model's own cache is reused
the same way); the k controller lives as long as the server, one per temperature band (greedy,
sampled), warm-started from the saved record and saved every SAVE_EVERY requests and at shutdown.
A client that goes away stops its generation within one step: the worker checks a flag between
steps and closes the stream, whose `finally` rewinds the caches to the accepted text.
The API itself (parsing, refusals, response objects) is `localspec.serve.api`; the HTTP plumbing
(the API key, streams, disconnects, running uvicorn) `localspec.serve.http`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from localspec.loading.controllers import Controllers
from localspec.loading.pool import SlotPool
from localspec.decoding.controller import KController
from localspec.engine import Cancelled
from localspec.tokens import common_prefix
from .api import ApiError, Defaults, Reply, parse
from .calls import CallSplitter
from .http import CountRequests, EventStream, api_error, collect, http_error, index, internal_error, key_matches, read_json, sse, watch_disconnect
from .metrics import Metrics
from .ollama import ollama_routes
from .prompt import prompt_tokens
from localspec.decoding.stats import RunStats
from localspec.decoding.stream import stream_text

SAVE_EVERY = 16        # requests between saves of the controller record
RETRY_AFTER = 2        # seconds, in the 503 of a full queue


@dataclass(eq=False)   # each job is itself (the running set holds them)
class Job:
    """One admitted request, between the event loop and the worker thread."""

    sampling: object
    decode: object
    loop: asyncio.AbstractEventLoop
    prompt: list[int] = field(default_factory=list)   # filled in once admitted
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    result: dict | None = None   # the final statistics, set by the worker before "done" (for the log)

    def emit(self, kind: str, value) -> None:
        """From the worker: hand (kind, value) to the request's coroutine."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))
        except RuntimeError:   # the loop has closed: nobody is listening any more
            pass


class Server:
    """The state of a running server: the session, the queue, the controllers, the counters."""

    def __init__(self, session, defaults: Defaults, *, api_key: str | None = None, max_queue: int = 16,
                 cors_origins: tuple[str, ...] = (), warm_start: bool = True, prefix_share: bool = True,
                 log: Callable[[str], None] | None = None, parallel: int = 1):
        self.session = session
        self.log = log   # one line per answer and one at shutdown; None: silent (the tests' servers)
        self.defaults = defaults
        self.api_key = api_key
        self.max_queue = max_queue
        self.prefix_share = prefix_share
        self.cors_origins = tuple(cors_origins)
        self.warm_start = warm_start
        self.model_id = Path(str(session.target.path)).stem
        self.metrics = Metrics()
        self.parallel = parallel
        # Slots share the session's models, loaded for them (LoadConfig.parallel); one needs none.
        self.pool = SlotPool(session, parallel, session.target.n_seq // parallel) if parallel > 1 else None
        self._executor = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="localspec-generate")
        self._tokenizer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-tokenize")
        self._slots: asyncio.Semaphore | None = None   # made in the server's event loop
        self._queue: list[Job] = []   # admitted, waiting for a generation slot
        self._running: set[Job] = set()
        self._closing = False
        # per slot, made on first use with the defaults then in force
        self._controllers: list[Controllers | None] = [None] * parallel
        self._since_save = 0
        self._saving = threading.Lock()
        self._closed = False
        self.answered = 0   # HTTP answers, for the line at shutdown

    # ---- the ASGI application -------------------------------------------------------------------
    def app(self) -> Starlette:
        routes = [
            Route("/", index, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            *ollama_routes(self),
        ]
        middleware = [Middleware(CountRequests, metrics=self.metrics, log=self._log_answer if self.log else None)]
        if self.cors_origins:
            middleware.append(Middleware(CORSMiddleware, allow_origins=list(self.cors_origins),
                                         allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"]))
        handlers = {ApiError: api_error, HTTPException: http_error, Exception: internal_error}
        return Starlette(routes=routes, middleware=middleware, exception_handlers=handlers,
                         lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        yield
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        if not key_matches(request.headers.get("authorization", ""), self.api_key):
            raise ApiError("invalid or missing API key: send 'Authorization: Bearer KEY'", status=401,
                           code="invalid_api_key", kind="authentication_error")

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": self.model_id, "busy": bool(self._running),
                             "slots": self.parallel, "slots_busy": len(self._running), "queue": self._waiting})

    async def prometheus(self, request: Request) -> PlainTextResponse:
        self._authorize(request)
        return PlainTextResponse(self.metrics.render(self._waiting, len(self._running), self.parallel),
                                 media_type="text/plain; version=0.0.4")

    async def models(self, request: Request) -> JSONResponse:
        self._authorize(request)
        s = self.session
        created = int(s.target.path.stat().st_mtime) if s.target.path.exists() else 0
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_id, "object": "model", "created": created, "owned_by": "localspec",
            # names, not paths: this answers without an API key when none is set
            "localspec": {"target": s.target.name, "draft": s.draft.name if s.draft else None,
                          "drafter": s.drafter_kind, "n_ctx": s.n_ctx, "parallel": self.parallel},
        }]})

    async def chat_completions(self, request: Request):
        return await self._complete(request, chat=True)

    async def completions(self, request: Request):
        return await self._complete(request, chat=False)

    # ---- one request ----------------------------------------------------------------------------
    async def _complete(self, request: Request, chat: bool):
        self._authorize(request)
        self._refuse_if_full()   # before reading a body that would only be refused
        req = parse(await read_json(request), self.defaults, chat)
        job, watcher = await self.submit(request, req)
        try:
            reply = Reply(chat, self.model_id)
            if req.stream:   # the stream watches for the disconnect from here on
                return EventStream(self._events(job, reply, req.include_usage, req.tools), job.cancel)
            text, result = await collect(job)
        finally:
            watcher.cancel()
        return JSONResponse(reply.whole(text, result, req.tools))

    async def submit(self, request: Request, req) -> tuple[Job, asyncio.Task]:
        """Admit `req` (an api.Request), tokenize it and start its generation: (the job, the task
        that cancels it when the client leaves, for the caller to cancel once it watches itself)."""
        loop = asyncio.get_running_loop()
        job = Job(req.sampling, req.decode, loop)
        self._admit(job)
        request.state.job = job   # for the request's log line
        watcher = asyncio.create_task(watch_disconnect(request.receive, job.cancel))
        try:
            try:
                # A chat template over thousands of messages takes seconds: not on the event loop.
                job.prompt, job.sampling = await loop.run_in_executor(
                    self._tokenizer, prompt_tokens, self.session.target, self.session.n_ctx, req)
            except BaseException:
                self._queue.remove(job)
                raise
            await self._start(job)
        except BaseException:
            watcher.cancel()
            raise
        return job, watcher

    def _refuse_if_full(self) -> None:
        """503 at once when shutting down, or when the running generations and the admitted
        requests (waiting for a slot, or being tokenized) fill the slots and the queue's places.
        A waiting request whose client has gone no longer holds a place."""
        if self._closing:
            raise ApiError("the server is shutting down", status=503, kind="server_error", code="shutting_down")
        busy = len(self._running)
        waiting = self._waiting
        if busy + waiting >= self.max_queue + self.parallel:
            runs = f"{busy} generation{'s run' if busy > 1 else ' runs'} and " if busy else ""
            raise ApiError(f"the server is busy: {runs}{waiting} requests wait (--max-queue {self.max_queue}); "
                           "retry later", status=503, kind="server_error",
                           code="queue_full", headers={"Retry-After": str(RETRY_AFTER)})

    def _admit(self, job: Job) -> None:
        """Take a place in the queue, or refuse (`_refuse_if_full`)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.parallel)
        self._refuse_if_full()
        self._queue.append(job)

    @property
    def _waiting(self) -> int:
        return sum(not j.cancel.is_set() for j in self._queue)

    async def _start(self, job: Job) -> None:
        """Wait for a generation slot (FIFO), then run `job` in a worker; the slot is freed when
        the worker is done with it, not when the client goes."""
        try:
            await self._slots.acquire()
        finally:
            self._queue.remove(job)
        if self._closing:
            self._slots.release()
            raise ApiError("the server is shutting down", status=503, kind="server_error", code="shutting_down")
        self._running.add(job)

        def done(_) -> None:
            self._running.discard(job)
            self._slots.release()
        try:
            future = job.loop.run_in_executor(self._executor, self._generate, job)
        except BaseException:
            done(None)
            raise
        future.add_done_callback(done)

    async def _events(self, job: Job, reply: Reply, include_usage: bool, tools=None):
        """Server-sent events: chunks, the finishing chunk, usage if asked for, [DONE]. With tools,
        text that may be a call is held back, and the calls come whole at the end (`CallSplitter`)."""
        split = CallSplitter(tools.names, tools.parallel) if tools else None
        if reply.chat:
            yield sse(reply.chunk(first=True, include_usage=include_usage))
        while True:
            kind, value = await job.queue.get()
            if kind == "done" and split is not None and value["finish"] != "cancelled":
                rest, calls = split.finish()
                if rest:
                    yield sse(reply.chunk(rest, include_usage=include_usage))
                if calls:
                    yield sse(reply.calls_chunk(calls, include_usage))
                    value = {**value, "finish": "tool_calls"}
            if kind == "text":
                text = split.feed(value) if split is not None else value
                if text:
                    yield sse(reply.chunk(text, include_usage=include_usage))
            elif kind == "error" or value["finish"] == "cancelled":
                error = value if kind == "error" else ApiError("the server is shutting down", 503, kind="server_error")
                yield sse(error.body())
                break
            else:
                yield sse(reply.chunk(finish=value["finish"], include_usage=include_usage))
                if include_usage:
                    yield sse(reply.usage_chunk(value))
                break
        yield b"data: [DONE]\n\n"

    # ---- the worker thread ----------------------------------------------------------------------
    def _generate(self, job: Job) -> None:
        """Run one generation (worker thread); every way it ends is emitted as "done" or "error"."""
        if job.cancel.is_set():   # the client left while it waited
            self.metrics.cancelled()
            job.emit("done", {"finish": "cancelled"})
            return
        slot = 0
        try:
            if self.pool is not None:
                slot = self.pool.acquire(job.prompt)   # one is free: the semaphore counts them
            self._run(job, slot)
        except Exception as e:
            job.emit("error", ApiError(f"generation failed: {e}", status=500, kind="server_error",
                                       code="generation_failed"))
        finally:
            if self.pool is not None:
                self.pool.release(slot)

    def _run(self, job: Job, slot: int) -> None:
        session, pool = self.session, self.pool
        target, draft = (session.target, session.draft) if pool is None else (pool.targets[slot], pool.drafts[slot])
        drafter = session.make_drafter() if pool is None else pool.drafter(slot)
        controller = self._controller(slot, job.sampling.temperature, drafter)
        if not self.prefix_share:
            # Nothing of another client's prompt may shorten this prefill or show in cached_tokens.
            for model in (target, draft):
                if model is not None:
                    model.truncate(0)
        cached = common_prefix(target.tokens, job.prompt[:-1])
        for model in (target, draft):
            if model is not None:
                # a client gone mid-prefill stops it, not just the next step (a slot: its next decode)
                model.abort_when = job.cancel
        stats, finish, prefill = RunStats(), None, None
        start = time.perf_counter()
        stream = stream_text(target, drafter, job.prompt, job.sampling, job.decode, controller,
                             np.random.default_rng(job.sampling.seed))
        joined = contextlib.nullcontext() if pool is None else pool.generating(slot, controller)
        try:
            with joined:
                for chunk in stream:
                    step = chunk.step
                    if prefill is None:
                        prefill = time.perf_counter() - start - step.t_draft - step.t_verify - step.t_python
                    stats.add(step)
                    if chunk.text:
                        job.emit("text", chunk.text)
                    if step.finish is not None:
                        finish = step.finish
                    elif job.cancel.is_set():
                        finish = "cancelled"
                        break
                stream.close()   # rewinds the caches to the accepted text, still in the batch
        except Cancelled:   # stopped inside a long prefill, or (a slot) before a decode
            finish = "cancelled"
        finally:
            stream.close()
            self.metrics.generated(stats, finish)
            self._maybe_save()
        job.result = {**stats.summary(), "finish": finish, "n_prompt": len(job.prompt), "n_cached": cached,
                      "prefill_seconds": prefill, "drafter": session.drafter_kind, "seed": job.sampling.seed}
        if pool is not None:
            job.result["slot"] = slot
        job.emit("done", job.result)

    def _controller(self, slot: int, temperature: float, drafter) -> KController:
        """Slot `slot`'s controller for this drafter and temperature band: one generation uses a
        controller at a time, so the slots' threads never share one."""
        if self._controllers is None:   # dropped (a test's new defaults): all made anew
            self._controllers = [None] * self.parallel
        if self._controllers[slot] is None:   # made on first use, from the defaults then in force
            self._controllers[slot] = Controllers(self.session, k=self.defaults.k, warm=self.warm_start)
        return self._controllers[slot].get(drafter, temperature)

    def _maybe_save(self, force: bool = False) -> None:
        with self._saving:
            self._since_save += 1
            if not (force or self._since_save >= SAVE_EVERY) or not self.warm_start:
                return
            self._since_save = 0
            for kept in self._controllers or ():
                if kept is not None:
                    kept.save_all()

    # ---- ending ---------------------------------------------------------------------------------
    def stop_generation(self) -> None:
        """Shutdown has begun: refuse new requests, stop the running generations within a step."""
        self._closing = True
        for job in list(self._running):
            job.cancel.set()

    def close(self) -> None:
        """Wait for the worker, then save what the controllers learned (the session is the caller's)."""
        self.stop_generation()
        self._tokenizer.shutdown(wait=True)
        self._executor.shutdown(wait=True)
        if self._since_save:
            self._maybe_save(force=True)
        if self.log is not None and not self._closed:
            n = self.answered
            self.log(f"localspec: stopped after {n} request{'' if n == 1 else 's'}")
        self._closed = True

    def _log_answer(self, line: str) -> None:
        self.answered += 1
        self.log(line)

