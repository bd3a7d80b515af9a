"""`localspec serve` through the official `openai` client, on the embedded default pair.

One server runs in-process (uvicorn in a thread, a free port) for the whole module; greedy (T = 0)
answers are compared with `localspec generate` and with plain decoding on the same models.
"""

from __future__ import annotations

import hmac
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

PROMPT = "Tell me about lighthouses."
CLI = [sys.executable, "-m", "localspec"]


@pytest.fixture(scope="module")
def served(model_paths):
    from localspec.config import SamplingConfig
    from localspec.serve.app import Server
    from localspec.serve.api import Defaults
    from localspec.serve.http import listen, start_in_thread
    from localspec.loading.session import LoadConfig, Session

    # One thread: the event loop, the test's clients and llama.cpp share two cores here.
    session = Session.load(LoadConfig(threads=1))
    defaults = Defaults(SamplingConfig(temperature=0.0), max_tokens=24)
    server = Server(session, defaults, max_queue=16, warm_start=False)
    sock = listen("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    uv, thread = start_in_thread(server, sock)
    yield SimpleNamespace(server=server, session=session, url=url)
    uv.should_exit = True
    thread.join(30)
    session.close()


def client(served, key: str = "none") -> "openai.OpenAI":
    return openai.OpenAI(base_url=served.url + "/v1", api_key=key, max_retries=0, timeout=60)


def plain_greedy(served, tokens: list[int], max_tokens: int = 24) -> str:
    """Plain decoding (no drafter) on the server's own target: what speculation must reproduce."""
    from localspec.config import DecodeConfig, SamplingConfig
    from localspec.decoding.stream import stream_text

    wait_idle(served)
    chunks = stream_text(served.session.target, None, tokens, SamplingConfig(temperature=0.0),
                         DecodeConfig(max_tokens=max_tokens))
    return "".join(c.text for c in chunks)


def chat_tokens(served, text: str) -> list[int]:
    return served.session.target.chat_prompt([{"role": "user", "content": text}])


def wait_until(condition, what: str, seconds: float = 120) -> None:
    """Poll `condition`; `seconds` only guards against a hang (no test reads a duration)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def wait_idle(served, seconds: float = 120) -> None:
    wait_until(lambda: not served.server._running and not served.server._waiting, "the server stayed busy",
               seconds)


def metric(served, name: str) -> float:
    text = httpx.get(served.url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"localspec_{name}"))


def post(served, path: str, body, **kw) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(served.url + path, content=data, headers={"content-type": "application/json"}, timeout=60, **kw)


def test_chat_equals_generate_streamed_or_not_with_localspec_usage(served):
    r = subprocess.run(CLI + ["generate", PROMPT, "--json", "--temperature", "0", "--max-tokens", "24"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    expected = json.loads(r.stdout)["text"]
    c = client(served)
    whole = c.chat.completions.create(model="any", messages=[{"role": "user", "content": PROMPT}],
                                      temperature=0, max_tokens=24)
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].finish_reason == "length"
    u = whole.usage
    assert u.completion_tokens == 24 and u.total_tokens == u.prompt_tokens + 24
    ls = u.model_extra["localspec"]
    assert ls["drafter"] == "auto" and ls["n_drafted"] > 0 and 0 <= ls["alpha"] <= 1
    assert {"draft_efficiency", "tokens_per_pass", "mean_k", "tokens_per_second"} <= set(ls)

    stream = c.chat.completions.create(model="any", messages=[{"role": "user", "content": PROMPT}],
                                       temperature=0, max_tokens=24, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == expected
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert all(ch.usage is None for ch in chunks[:-1]) and chunks[-1].choices == []
    last = chunks[-1].usage
    assert last.completion_tokens == 24 and last.model_extra["localspec"]["drafter"] == "auto"
    # The same prompt again: the target's cache already holds all of it but the last token.
    assert last.prompt_tokens_details.cached_tokens == last.prompt_tokens - 1


def test_completions_streamed_or_not_equal_plain_greedy(served):
    prompt = "The three primary colours are"
    expected = plain_greedy(served, served.session.target.tokenize(prompt, True, True), 16)
    c = client(served)
    whole = c.completions.create(model="x", prompt=prompt, max_tokens=16, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].text == expected
    assert whole.usage.model_extra["localspec"]["tokens_per_pass"] >= 1
    chunks = list(c.completions.create(model="x", prompt=prompt, max_tokens=16, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"
    # a stop string ends the text before it, with finish_reason "stop"
    cut = expected.strip().split()[2]
    stopped = c.completions.create(model="x", prompt=prompt, max_tokens=16, temperature=0, stop=[cut])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == expected[: expected.index(cut)]


@pytest.mark.parametrize("body, param, words", [
    ({"n": 2}, "n", "one choice"),
    ({"tools": {"type": "function", "function": {"name": "f"}}}, "tools", "must be a list"),
    ({"logprobs": True}, "logprobs", "log probabilities"),
    ({"logit_bias": {"one": 5}}, "logit_bias", "token ids to numbers in [-100, 100]"),
    ({"logit_bias": {"1": 500}}, "logit_bias", "token ids to numbers in [-100, 100]"),
    ({"logit_bias": [1, 5]}, "logit_bias", "must be an object"),
    ({"logit_bias": {"999999": -100}}, "logit_bias", "outside the vocabulary"),   # a mistyped ban did nothing
    ({"response_format": {"type": "xml"}}, "response_format", "text, json_object or json_schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "bogus"}}}},
     "response_format", "unsupported JSON schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema":
      {"type": "string", "pattern": "(("}}}}, "response_format", "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema":   # the converter: hangs
      {"type": "string", "pattern": "^a}$"}}}}, "response_format", "closes nothing"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema":
      {"type": "string", "format": "email"}}}}, "response_format", "'format'"),
    ({"presence_penalty": 2.5}, "presence_penalty", "between -2 and 2"),
    ({"frequency_penalty": "x"}, "frequency_penalty", "must be a number"),
    ({"repeat_penalty": 0}, "repeat_penalty", "a number > 0"),
    ({"repeat_penalty": 1e-300}, "repeat_penalty", "logits are float32"),
    ({"temperature": "hot"}, "temperature", "must be a number"),
    ({"top_k": -1}, "top_k", "top-k must be >= 0"),
    ({"top_p": 1.5}, "top_p", "top-p must be in (0, 1]"),
    ({"max_tokens": 0}, "max_tokens", "max-tokens must be >= 1"),
    ({"stop": 3}, "stop", "string or a list"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "tool_call_id"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role", "one of"),
    ({"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role", "one of"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "required"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content", "required"),
    ({"max_completion_tokens": 2, "max_tokens": "x"}, "max_tokens", "must be an integer"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
])
def test_refusals_are_400_with_an_openai_error_body(served, body, param, words):
    r = post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and words in err["message"]


def test_penalties_and_logit_bias_apply(served):
    """Accepted, and applied: greedy text changes under each (tests/test_penalties.py checks what
    they compute and that speculation keeps it)."""
    c = client(served)
    ask = dict(model="x", messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
               max_tokens=24, temperature=0)
    plain = c.chat.completions.create(**ask).choices[0].message.content
    penalized = c.chat.completions.create(**ask, presence_penalty=1.5, frequency_penalty=0.5).choices[0].message.content
    assert penalized != plain
    first = served.session.target.tokenize(plain, add_special=False)[0]   # the reply's first token, banned
    banned = c.chat.completions.create(**ask, logit_bias={str(first): -100}).choices[0].message.content
    assert banned != plain
    extension = c.chat.completions.create(**ask, extra_body={"repeat_penalty": 1.5}).choices[0].message.content
    assert extension != plain


def test_bad_json_long_prompts_and_large_bodies(served):
    r = post(served, "/v1/chat/completions", b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert post(served, "/v1/completions", [1, 2]).status_code == 400
    n_ctx = served.session.target.n_ctx
    with pytest.raises(openai.BadRequestError) as e:
        client(served).completions.create(model="x", prompt="lighthouse " * n_ctx, max_tokens=4)
    message = e.value.body["message"]
    assert str(n_ctx) in message and "tokens, too long for the context of" in message
    assert e.value.body["code"] == "context_length_exceeded"
    r = post(served, "/v1/completions", json.dumps({"prompt": "x" * (1 << 20)}))
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    # found by probing: each of these was a 500
    assert post(served, "/v1/chat/completions", b"[" * 200_000).status_code == 400   # RecursionError
    r = post(served, "/v1/completions", b'{"prompt": "\\ud800 lone surrogate"}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_a_client_gone_during_a_long_prefill_stops_it(served):
    """A prompt of ~3,500 tokens takes ~30 s to prefill on one thread here; llama.cpp's abort
    callback stops it once the client has left, rather than at the next step. Told by counts, not
    by time: a prefill run to its end would leave all the prompt but its last token in the cache."""
    wait_idle(served)
    target = served.session.target
    prompt = "lighthouse keeper " * 1200
    n_prompt = len(target.tokenize(prompt, True, True))
    cancelled = metric(served, 'generations_total{finish="cancelled"}')
    body = json.dumps({"prompt": prompt, "max_tokens": 4}).encode()
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localspec\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: served.server._running, "the generation did not start")
    # the client has gone, its generation in (or just before) the prefill
    wait_idle(served)
    assert metric(served, 'generations_total{finish="cancelled"}') == cancelled + 1
    assert len(target.tokens) < n_prompt - 1, "the prefill ran to its end"
    expected = plain_greedy(served, chat_tokens(served, "Name a colour."), 8)
    reply = client(served).chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0)
    assert reply.choices[0].message.content == expected


def test_clients_that_left_the_queue_hold_no_place(served):
    wait_idle(served)
    served.server.max_queue = 1
    stream_cm, response = _start_long_stream(served)
    try:
        try:   # waits behind the stream, then gives up
            httpx.post(served.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=0.5)
        except httpx.TimeoutException:
            pass
        wait_until(lambda: not served.server._waiting, "the departed client still counts as waiting")
        try:   # the place is free again: admitted to wait, not refused
            r = httpx.post(served.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=0.5)
            assert r.status_code != 503, r.text
        except httpx.TimeoutException:
            pass
    finally:
        stream_cm.__exit__(None, None, None)
        served.server.max_queue = 16
    wait_idle(served)


def test_api_key(served):
    served.server.api_key = "sesame"
    try:
        with pytest.raises(openai.AuthenticationError):
            client(served, "wrong").models.list()
        assert post(served, "/v1/completions", {"prompt": "hi"}).status_code == 401
        assert httpx.get(served.url + "/health").status_code == 200   # stays open
        models = client(served, "sesame").models.list()
        assert [m.id for m in models.data] == [served.server.model_id]
    finally:
        served.server.api_key = None


@pytest.mark.parametrize("header, ok", [
    (b"Bearer sesame", True), (b"bearer sesame", True), (b"BEARER  sesame", True),   # RFC 7235: any case
    (b"Bearer wrong", False), (b"Bearer sesam", False), (b"Bearer sesame2", False), (b"Basic sesame", False),
    (b"Bearersesame", False), (b"Bearer", False), (b"", False), (b"sesame", False),
    (b"Bearer s\xc3\xa9same", False),   # non-ASCII bytes: refused (401), not a 500
])
def test_the_api_key_check(served, monkeypatch, header, ok):
    compared = []
    real = hmac.compare_digest

    def spy(a, b):
        compared.append((type(a), type(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    monkeypatch.setattr(served.server, "api_key", "sesame")
    r = httpx.get(served.url + "/v1/models", headers={"authorization": header} if header else {})
    assert r.status_code == (200 if ok else 401), r.text
    assert compared == [(bytes, bytes)]   # in constant time, on bytes


def test_a_non_ascii_api_key_matches_its_utf8_bytes(served, monkeypatch):
    monkeypatch.setattr(served.server, "api_key", "sésame")
    assert httpx.get(served.url + "/v1/models", headers={"authorization": "Bearer sésame".encode()}).status_code == 200
    assert httpx.get(served.url + "/v1/models", headers={"authorization": b"Bearer s\xe9same"}).status_code == 401


def test_no_prefix_share_starts_every_request_from_an_empty_cache(served, monkeypatch):
    """--no-prefix-share: nothing of the last request's prompt is reused (no shorter prefill to
    time) or reported (cached_tokens 0), in the target or the draft."""
    wait_idle(served)
    body = {"prompt": "The lighthouse keeper climbed the stairs at dusk, as every evening.", "max_tokens": 2,
            "temperature": 0}
    assert post(served, "/v1/completions", body).status_code == 200   # the caches now hold this prompt
    fed = {"target": [], "draft": []}
    for name in fed:
        model = getattr(served.session, name)
        real = model.eval
        monkeypatch.setattr(model, "eval", lambda tokens, logits_from=None, real=real, name=name:
                            fed[name].append(len(tokens)) or real(tokens, logits_from))

    def ask() -> dict:
        for calls in fed.values():
            calls.clear()
        r = post(served, "/v1/completions", body)
        assert r.status_code == 200, r.text
        return r.json()["usage"]

    shared = ask()   # the control: the same request reuses the whole prompt but its last token
    n = shared["prompt_tokens"]
    assert shared["prompt_tokens_details"]["cached_tokens"] == n - 1 and fed["target"][0] == 0
    monkeypatch.setattr(served.server, "prefix_share", False)
    alone = ask()
    assert alone["prompt_tokens_details"]["cached_tokens"] == 0
    assert fed["target"][0] == n - 1 and fed["draft"][0] == n - 1   # both prefilled from the start


def _start_long_stream(served):
    """A streaming request that generates for a long time, read up to its second chunk."""
    stream_cm = httpx.stream("POST", served.url + "/v1/completions", timeout=60,
                             json={"prompt": "Once upon a time", "max_tokens": 500, "stream": True})
    response = stream_cm.__enter__()
    lines = response.iter_lines()
    seen = 0
    for line in lines:
        if line.startswith("data: {"):
            seen += 1
            if seen == 2:
                break
    # The line iterator goes with the response: dropping it could close the stream early.
    response.lines = lines
    return stream_cm, response


def test_a_full_queue_answers_503_with_retry_after(served):
    wait_idle(served)
    served.server.max_queue = 0
    stream_cm, response = _start_long_stream(served)
    try:
        with pytest.raises(openai.APIStatusError) as e:
            client(served).completions.create(model="x", prompt="hi", max_tokens=2)
        assert e.value.status_code == 503
        assert e.value.response.headers["retry-after"].isdigit()
        assert e.value.body["code"] == "queue_full"
    finally:
        stream_cm.__exit__(None, None, None)
        served.server.max_queue = 16
    wait_idle(served)


def test_a_client_that_leaves_mid_stream_stops_its_generation(served):
    wait_idle(served)
    cancelled = metric(served, 'generations_total{finish="cancelled"}')
    tokens_before = metric(served, "completion_tokens_total")
    stream_cm, response = _start_long_stream(served)
    stream_cm.__exit__(None, None, None)   # the client goes away
    wait_idle(served)
    assert metric(served, 'generations_total{finish="cancelled"}') == cancelled + 1
    assert metric(served, "completion_tokens_total") - tokens_before < 100   # far from its 500
    # the caches were rewound: the next request is answered as by a fresh server
    expected = plain_greedy(served, chat_tokens(served, "Name a colour."), 12)
    reply = client(served).chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == expected


def test_eight_concurrent_streams_are_all_answered(served):
    prompts = [f"Count from {i} to {i + 5}." for i in range(8)]
    expected = {p: plain_greedy(served, chat_tokens(served, p), 8) for p in prompts}
    got: dict[str, str] = {}
    errors: list[BaseException] = []

    def ask(p: str) -> None:
        try:
            chunks = client(served).chat.completions.create(
                model="x", messages=[{"role": "user", "content": p}], max_tokens=8, temperature=0, stream=True)
            got[p] = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert got == expected


def test_metrics_and_models(served):
    text = httpx.get(served.url + "/metrics").text
    for name in ("requests_total", "completion_tokens_total", "alpha", "draft_efficiency", "tokens_per_pass",
                 "queue_depth"):
        assert f"# TYPE localspec_{name} " in text
    assert 'localspec_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    data = httpx.get(served.url + "/v1/models").json()["data"][0]
    assert data["object"] == "model" and data["localspec"]["drafter"] == "auto"


def test_serve_without_the_extra_says_how_to_install_it():
    code = ("import sys; sys.modules['starlette'] = None; sys.argv = ['localspec', 'serve']; "
            "from localspec.cli.app import main; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: localspec serve needs starlette: pip install 'localspec[serve]'"]


REPO = Path(__file__).resolve().parent.parent
LOGGED = re.compile(r"localspec: (?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d{3})"
                    r"(?: · (?P<tokens>\d+) tokens · α (?P<alpha>\d\.\d{3}|—))?(?: · (?P<reason>[^·]+))? · \d+\.\d\d s")


def test_one_log_line_per_answer_and_one_at_shutdown(served):
    from localspec.config import SamplingConfig
    from localspec.serve.app import Server
    from localspec.serve.api import Defaults
    from localspec.serve.http import listen, start_in_thread

    wait_idle(served)
    lines: list[str] = []
    server = Server(served.session, Defaults(SamplingConfig(temperature=0.0), max_tokens=8), warm_start=False,
                    log=lines.append)
    sock = listen("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    uv, thread = start_in_thread(server, sock)
    try:
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        messages = [{"role": "user", "content": PROMPT}]
        whole = c.chat.completions.create(model="x", messages=messages, temperature=0, max_tokens=8)
        streamed = list(c.completions.create(model="x", prompt="The sea is", temperature=0, max_tokens=5,
                                             stream=True, stream_options={"include_usage": True}))
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/no%1B%5B2Jwhere").status_code == 404   # a path with ESC [2J in it
        index = httpx.get(url + "/")   # a pointer to the API, not a 404
        assert index.status_code == 200 and "POST /v1/chat/completions" in index.json()["endpoints"]
        hot = httpx.post(url + "/v1/completions", json={"prompt": "x", "temperature": 5})   # OpenAI's range: 0-2
        assert hot.status_code == 400 and "between 0 and 2" in hot.json()["error"]["message"]
    finally:
        uv.should_exit = True
        thread.join(30)
    *answers, last = lines
    assert last == "localspec: stopped after 6 requests"   # once, after every answer's line
    matches = [LOGGED.fullmatch(line) for line in answers]
    assert None not in matches, answers
    parsed = {(m["path"], m["status"]): m for m in matches}
    chat, completion = parsed["/v1/chat/completions", "200"], parsed["/v1/completions", "200"]
    assert chat["method"] == "POST" and int(chat["tokens"]) == whole.usage.completion_tokens
    assert chat["alpha"] == f"{whole.usage.model_extra['localspec']['alpha']:.3f}"
    assert int(completion["tokens"]) == streamed[-1].usage.completion_tokens == 5
    assert parsed["/health", "200"]["tokens"] is None
    assert (r"/no\x1b[2Jwhere", "404") in parsed   # the client's path escaped, no control codes
    assert ("/", "200") in parsed
    assert parsed["/v1/completions", "400"]["reason"] == "temperature must be between 0 and 2, got 5"   # why
    assert len(answers) == 6


def test_serve_logs_its_requests_and_says_when_it_stopped():
    """The command wires the log to stderr: a line per request, one at Ctrl-C."""
    import queue

    p = subprocess.Popen(CLI + ["serve", "--port", "0", "--threads", "1", "--max-tokens", "4"],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()   # stderr's lines, then None at its end

    def read() -> None:
        for line in p.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()

    def line_with(text: str) -> str:
        """The next stderr line holding `text` (the timeout only guards against a hang)."""
        while True:
            line = lines.get(timeout=120)
            assert line is not None, f"stderr ended before a line with {text!r}"
            if text in line:
                return line

    try:
        url = re.search(r"(http://\S+)/v1", line_with("localspec serve: http://"))[1]
        assert httpx.get(url + "/v1/models", timeout=60).status_code == 200
        logged = line_with("localspec: ")
        assert LOGGED.fullmatch(logged.strip()) and "GET /v1/models 200" in logged, logged
        p.send_signal(signal.SIGINT)
        assert line_with("stopped") == "localspec: stopped after 1 request\n"
        assert p.wait(timeout=60) == 130
    finally:
        p.kill()
        p.wait()


def test_models_gives_the_documented_id_and_any_form_of_it_is_served(served):
    target = Path(str(served.session.target.path))
    data = httpx.get(served.url + "/v1/models").json()["data"]
    assert [d["id"] for d in data] == [target.stem]   # "SmolLM2-135M-Instruct.F32", no ".gguf"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    documented = " ".join(readme.split("- `GET /v1/models` —", 1)[1].split("\n- ", 1)[0].split())
    assert documented.startswith("the one model (id: the target file's name without `.gguf`")
    # Clients send the id back as `model`; the file name, or anything else, is served the same.
    c = client(served)
    for name in (target.stem, target.name, "gpt-4o"):
        r = c.completions.create(model=name, prompt="Hi", max_tokens=2, temperature=0)
        assert r.model == target.stem and r.usage.completion_tokens >= 1
