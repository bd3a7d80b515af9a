"""The fault pass's findings on Ollama's API (issue 43): every answer under /api/ that is not one is
Ollama's `{"error": message}` (so that the `ollama` client's ResponseError carries text), tool turns
that name no call, and `"stream": null`.

The routing cases need no model: a server over a stand-in session answers them before any handler
reads it. The generation cases run on the embedded default pair (`served`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.test_serve import post, served  # noqa: F401 - the module's server

ollama = pytest.importorskip("ollama")
httpx = pytest.importorskip("httpx")

PLAIN = {"temperature": 0, "num_predict": 4}


@pytest.fixture(scope="module")
def bare():
    """A server over a session with no models: for answers that never reach one."""
    from localspec.config import SamplingConfig
    from localspec.serve.api import Defaults
    from localspec.serve.app import Server
    from localspec.serve.http import listen, start_in_thread

    session = SimpleNamespace(target=SimpleNamespace(path=Path("/nonexistent/model.gguf")))
    server = Server(session, Defaults(SamplingConfig(temperature=0.0)), warm_start=False)
    sock = listen("127.0.0.1", 0)
    uv, thread = start_in_thread(server, sock)
    yield SimpleNamespace(server=server, url=f"http://127.0.0.1:{sock.getsockname()[1]}")
    uv.should_exit = True
    thread.join(30)


def olla(url: str) -> "ollama.Client":
    return ollama.Client(host=url, timeout=60)


def error_of(call) -> "ollama.ResponseError":
    with pytest.raises(ollama.ResponseError) as e:
        call()
    assert isinstance(e.value.error, str), e.value.error   # a dict here: an OpenAI-shaped body
    return e.value


# -- part 1: refusals under /api/ in Ollama's shape ------------------------------------------------

@pytest.mark.parametrize("name, call, words", [
    ("pull", lambda c: c.pull("smollm2"), "localspec pull"),
    ("pull-streamed", lambda c: list(c.pull("smollm2", stream=True)), "localspec pull"),
    ("push", lambda c: c.push("me/model"), "does not manage models"),
    ("create", lambda c: c.create("mine", from_="smollm2"), "does not manage models"),
    ("copy", lambda c: c.copy("a", "b"), "does not manage models"),
    ("delete", lambda c: c.delete("a"), "does not manage models"),
    ("embed", lambda c: c.embed(model="x", input="hi"), "embeddings"),
    ("embeddings", lambda c: c.embeddings(model="x", prompt="hi"), "embeddings"),
])
def test_ollamas_endpoints_localspec_lacks_are_501_in_ollamas_shape(bare, name, call, words):
    e = error_of(lambda: call(olla(bare.url)))
    assert e.status_code == 501 and words in e.error and "not implemented" in e.error, e.error


@pytest.mark.parametrize("method", ["HEAD", "POST"])
def test_blobs_are_501_in_ollamas_shape(bare, method):
    r = httpx.request(method, bare.url + "/api/blobs/sha256:" + "0" * 64, content=b"x")
    assert r.status_code == 501, r.text
    if method != "HEAD":
        assert isinstance(r.json()["error"], str) and set(r.json()) == {"error"}


@pytest.mark.parametrize("method, path, allow", [
    ("GET", "/api/show", "POST"), ("POST", "/api/tags", "GET"), ("GET", "/api/chat", "POST"),
    ("PUT", "/api/generate", "POST"), ("DELETE", "/api/version", "GET"),
])
def test_a_wrong_method_under_api_is_405_in_ollamas_shape(bare, method, path, allow):
    r = httpx.request(method, bare.url + path, json={})
    assert r.status_code == 405, r.text
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    assert path in body["error"] and allow in body["error"] and allow in r.headers["allow"]


def test_an_unknown_path_under_api_is_404_in_ollamas_shape(bare):
    for path in ("/api/nothing", "/api/", "/api/chat/extra", "/api"):
        r = httpx.post(bare.url + path, json={})
        assert r.status_code == 404 and set(r.json()) == {"error"} and isinstance(r.json()["error"], str), r.text
        e = ollama.ResponseError(r.text, r.status_code)   # what the client raises on a 4xx
        assert isinstance(e.error, str) and "no such endpoint" in e.error and path in e.error


def test_outside_api_refusals_keep_openais_shape(bare):
    for method, path, status in (("POST", "/v1/nothing", 404), ("GET", "/v1/chat/completions", 405),
                                 ("POST", "/v1/embeddings", 404)):
        r = httpx.request(method, bare.url + path, json={})
        assert r.status_code == status and isinstance(r.json()["error"], dict), r.text
        assert path in r.json()["error"]["message"]


def test_the_index_lists_only_what_is_served(bare):
    endpoints = httpx.get(bare.url + "/").json()["endpoints"]
    assert "POST /api/chat" in endpoints and not any("pull" in e or "embed" in e for e in endpoints)


# -- part 2: tool turns that name no call, and "stream": null ---------------------------------------

CALLS = [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
         {"function": {"name": "get_time", "arguments": {"city": "Paris"}}}]


def history(*results: dict) -> list[dict]:
    return [{"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": CALLS}, *results]


def test_an_ollama_tool_turn_answers_the_next_unanswered_call():
    from localspec.serve.messages import messages

    bare_results = history({"role": "tool", "content": "18 C"}, {"role": "tool", "content": "noon"})
    out = messages({"messages": bare_results}, ollama=True)
    ids = [c["id"] for c in out[1]["tool_calls"]]
    assert [(m["tool_call_id"], m["name"]) for m in out[2:]] == [(ids[0], "get_weather"), (ids[1], "get_time")]
    # Named by function (Ollama's tool_name), in any order: each takes its own call's id
    named = history({"role": "tool", "content": "noon", "tool_name": "get_time"},
                    {"role": "tool", "content": "18 C"})
    out = messages({"messages": named}, ollama=True)
    assert [(m["tool_call_id"], m["name"]) for m in out[2:]] == [(ids[1], "get_time"), (ids[0], "get_weather")]
    # A result with no call before it is still a result, of nothing named
    alone = messages({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}]}, ollama=True)
    assert alone[1] == {"role": "tool", "content": "x", "tool_call_id": "", "name": ""}


def test_openai_still_requires_the_id():
    from localspec.serve.errors import ApiError
    from localspec.serve.messages import messages

    with pytest.raises(ApiError, match="tool_call_id"):
        messages({"messages": history({"role": "tool", "content": "18 C"})})


def test_stream_null_is_absent():
    from localspec.serve.ollama import openai_body

    for chat, body in ((True, {"messages": []}), (False, {"prompt": "hi"})):
        assert openai_body({**body, "stream": None}, chat, 512, True)[0]["stream"] is True
        assert openai_body({**body, "stream": False}, chat, 512, True)[0]["stream"] is False


def test_tool_turns_without_ids_and_stream_null_are_answered(served):
    tools = [{"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        for name in ("get_weather", "get_time")]
    turns = history({"role": "tool", "content": "18 C"}, {"role": "tool", "content": "noon"})
    r = post(served, "/api/chat", {"model": "x", "messages": turns, "tools": tools, "stream": False, "options": PLAIN})
    assert r.status_code == 200 and r.json()["done"], r.text
    whole = olla(served.url).chat(model="x", messages=turns, tools=tools, stream=False, options=PLAIN)
    assert whole.done
    for path, body in (("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}), ("/api/generate", {"prompt": "hi"})):
        with httpx.stream("POST", served.url + path, json={"model": "x", **body, "stream": None, "options": PLAIN},
                          timeout=60) as s:
            assert s.status_code == 200 and s.headers["content-type"].startswith("application/x-ndjson")
            lines = [line for line in s.iter_lines() if line]
        assert len(lines) >= 2, lines   # streamed, as when "stream" is absent
