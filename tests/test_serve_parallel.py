"""`localspec serve --parallel 4` through the openai client: concurrent requests, batched.

One server with 4 slots runs in-process for the module (the embedded default pair, greedy by
default). Each request's text must equal the same request sent alone; a client that leaves frees
its slot within a step; under 64 clients at once the slots and the queue keep their limits.
"""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

SLOTS = 4
QUEUE = 8
QUESTIONS = ["Tell me about lighthouses.", "Name three rivers.", "What is a prime number?", "Describe rain.",
             "Write a haiku about cats.", "Why is the sky blue?", "List four metals.", "What is 7 times 8?"]


@pytest.fixture(scope="module")
def served(model_paths):
    from localspec.config import SamplingConfig
    from localspec.serve.app import Server
    from localspec.serve.api import Defaults
    from localspec.serve.http import listen, start_in_thread
    from localspec.loading.session import LoadConfig, Session

    session = Session.load(LoadConfig(threads=1, n_ctx=1024, parallel=SLOTS))
    server = Server(session, Defaults(SamplingConfig(temperature=0.0), max_tokens=24), max_queue=QUEUE,
                    warm_start=False, parallel=SLOTS)
    sock = listen("127.0.0.1", 0)
    uv, thread = start_in_thread(server, sock)
    yield SimpleNamespace(server=server, session=session, url=f"http://127.0.0.1:{sock.getsockname()[1]}")
    uv.should_exit = True
    thread.join(30)
    session.close()


def client(served) -> "openai.OpenAI":
    return openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=120)


def ask(served, question: str, max_tokens: int = 24) -> str:
    reply = client(served).chat.completions.create(
        model="x", messages=[{"role": "user", "content": question}], max_tokens=max_tokens, temperature=0)
    return reply.choices[0].message.content


def wait_until(condition, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def wait_idle(served) -> None:
    wait_until(lambda: not served.server._running and not served.server._waiting, "the server stayed busy")


def in_threads(fn, args) -> list:
    out: list = [None] * len(args)

    def run(i, a):
        try:
            out[i] = fn(a)
        except Exception as e:   # noqa: BLE001 - the caller looks at it
            out[i] = e
    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(args)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


def test_eight_concurrent_greedy_requests_each_equal_the_request_alone(served):
    alone = [ask(served, q) for q in QUESTIONS]
    wait_idle(served)
    both = in_threads(lambda q: ask(served, q), QUESTIONS)
    assert both == alone
    health = httpx.get(served.url + "/health").json()
    assert health["slots"] == SLOTS and health["slots_busy"] == 0


def test_a_disconnect_frees_its_slot_and_the_next_request_is_answered(served):
    wait_idle(served)
    expected = ask(served, QUESTIONS[1], 16)
    wait_idle(served)
    c = client(served)
    with c.chat.completions.with_streaming_response.create(
            model="x", messages=[{"role": "user", "content": "Write a long story about the sea."}],
            max_tokens=2000, temperature=0, stream=True) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break   # the generation runs: leave
    wait_until(lambda: not served.server._running, "the slot stayed busy after the client left", 30)
    assert ask(served, QUESTIONS[1], 16) == expected


def test_slots_and_queue_hold_under_64_clients(served):
    wait_idle(served)
    seen = {"busy": 0, "held": 0}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            h = httpx.get(served.url + "/health", timeout=30).json()
            seen["busy"] = max(seen["busy"], h["slots_busy"])
            seen["held"] = max(seen["held"], h["slots_busy"] + h["queue"])
            time.sleep(0.02)
    watcher = threading.Thread(target=watch)
    watcher.start()

    def one(i):
        r = httpx.post(served.url + "/v1/completions", json={"prompt": f"Number {i} is", "max_tokens": 4}, timeout=300)
        return r.status_code, r.json()
    try:
        answers = in_threads(one, range(64))
    finally:
        stop.set()
        watcher.join(30)
    codes = [a[0] for a in answers]
    assert set(codes) <= {200, 503}, answers
    assert codes.count(200) >= SLOTS + QUEUE
    assert all(body["error"]["code"] == "queue_full" for code, body in answers if code == 503)
    assert all(body["choices"][0]["text"] for code, body in answers if code == 200)
    # running and admitted requests (waiting for a slot or being tokenized) never pass the limits
    assert 2 <= seen["busy"] <= SLOTS and seen["held"] <= SLOTS + QUEUE
    wait_idle(served)
    assert httpx.get(served.url + "/health").json()["slots_busy"] == 0
