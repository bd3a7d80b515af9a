"""Ollama's API on `localspec serve`, through the official `ollama` Python client, on the embedded
default pair: chat and generate (streamed NDJSON and not), tags, show, version, ps, `format` as a
JSON schema, tools in Ollama's shape, options, refusals in Ollama's `{"error": ...}`; and greedy
text through Ollama's API and OpenAI's equals `localspec generate`'s."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.test_serve import CLI, PROMPT, client, post, served  # noqa: F401 - the module's server
from tests.test_serve_tools import ASK, TOOLS, WEATHER

ollama = pytest.importorskip("ollama")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

GREEDY = {"temperature": 0, "num_predict": 24}


def olla(served) -> "ollama.Client":
    return ollama.Client(host=served.url, timeout=120)


@pytest.fixture(scope="module")
def generated() -> str:
    r = subprocess.run(CLI + ["generate", PROMPT, "--json", "--temperature", "0", "--max-tokens", "24"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["text"]


def test_greedy_text_through_ollama_and_openai_equals_generate(served, generated):
    o = olla(served)
    ask = [{"role": "user", "content": PROMPT}]
    whole = o.chat(model="anything", messages=ask, stream=False, options=GREEDY)
    assert whole.message.content == generated and whole.message.role == "assistant"
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 24
    assert whole.prompt_eval_count > 0 and whole.total_duration >= whole.eval_duration > 0
    assert whole.model == "anything" and whole.created_at
    raw = post(served, "/api/chat", {"model": "m", "messages": ask, "stream": False, "options": GREEDY}).json()
    ls = raw["localspec"]   # the client's models drop fields they do not know
    assert raw["message"]["content"] == generated
    assert ls["drafter"] == "auto" and 0 <= ls["alpha"] <= 1 and ls["n_drafted"] > 0 and ls["cached_tokens"] > 0
    parts = list(o.chat(model="anything", messages=ask, stream=True, options=GREEDY))
    assert "".join(p.message.content for p in parts) == generated
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and parts[-1].eval_count == 24
    assert o.generate(model="x", prompt=PROMPT, stream=False, options=GREEDY).response == generated
    assert "".join(p.response for p in o.generate(model="x", prompt=PROMPT, options=GREEDY, stream=True)) == generated
    # OpenAI's API with tools offered but tool_choice "none": the same text, nothing offered
    r = client(served).chat.completions.create(model="x", messages=ask, temperature=0, max_tokens=24,
                                               tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.content == generated


def test_streams_are_ndjson_by_default(served):
    with httpx.stream("POST", served.url + "/api/generate", json={"prompt": PROMPT, "options": {"num_predict": 4}},
                      timeout=60) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] and lines[-1]["done_reason"] == "length" and lines[-1]["eval_count"] == 4
    assert all(not line["done"] for line in lines[:-1])


def test_raw_generate_and_a_load_request(served):
    o = olla(served)
    raw = o.generate(model="x", prompt="The three primary colours are", raw=True, stream=False,
                     options={"temperature": 0, "num_predict": 8, "seed": 3, "top_k": 40, "repeat_penalty": 1.0})
    assert raw.response and raw.eval_count == 8
    loaded = o.generate(model="x", prompt="")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    # Ollama's documented load and unload calls carry no prompt at all
    for body, reason in (({"model": "x"}, "load"), ({"model": "x", "keep_alive": 0}, "unload")):
        r = httpx.post(served.url + "/api/generate", json=body)
        assert r.status_code == 200 and r.json()["done_reason"] == reason, r.text


def test_num_predict_absent_means_the_context_as_in_ollama():
    from localspec.serve.ollama import openai_body

    body = {"prompt": "hi", "options": {"temperature": 0}}
    assert openai_body(body, False, 2048, True)[0]["max_tokens"] == 2048
    for predict, want in ((0, 2048), (-1, 2048), (-2, 2048), (7, 7)):
        body = {"prompt": "hi", "options": {"num_predict": predict}}
        assert openai_body(body, False, 2048, True)[0]["max_tokens"] == want


def test_format_schema_output_validates(served):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "year": {"type": "integer"}}, "required": ["name", "year"]}
    o = olla(served)
    r = o.chat(model="x", messages=[{"role": "user", "content": "Name a famous lighthouse as JSON."}],
               format=schema, stream=False, options={"temperature": 0, "num_predict": 64})
    assert r.done_reason == "stop"
    jsonschema.validate(json.loads(r.message.content), schema)
    g = o.generate(model="x", prompt="Name a famous lighthouse as JSON.", format=schema, stream=False,
                   options={"temperature": 0, "num_predict": 64})
    assert g.done_reason == "stop"
    jsonschema.validate(json.loads(g.response), schema)
    g = o.generate(model="x", prompt="A JSON object please.", format="json", stream=False,
                   options={"temperature": 0, "num_predict": 8})   # any JSON object: its start, at least
    assert g.response.lstrip().startswith("{")


def test_tools_in_ollamas_shape_and_a_result_back(served):
    # Ollama has no tool_choice: the call is the model's choice. SmolLM2-135M answers this one in
    # prose, so the call below is fed back as history and the reply checked as text.
    o = olla(served)
    r = o.chat(model="x", messages=ASK, tools=TOOLS, stream=False, options={"temperature": 0, "num_predict": 24})
    assert r.message.content or r.message.tool_calls
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
               {"role": "tool", "content": "18 degrees and sunny", "tool_name": "get_weather"}]
    again = o.chat(model="x", messages=history, tools=TOOLS, stream=False, options={"temperature": 0, "num_predict": 16})
    assert again.done and (again.message.content or again.message.tool_calls)


def test_a_call_in_ollamas_shape(served, monkeypatch):
    # What the model wrote is read the same way as for OpenAI; here its text is stood in for.
    from localspec.serve import ollama as api

    shape = api.Shape("x", True, __import__("localspec.serve.tools", fromlist=["parse_tools"]).parse_tools(
        {"tools": TOOLS}), 0)
    result = {"finish": "stop", "n_prompt": 5, "n_tokens": 9, "n_cached": 0, "prefill_seconds": 0.1, "seconds": 0.2,
              "alpha": 1.0, "draft_efficiency": 1.0, "tokens_per_pass": 2.0, "mean_k": 2.0, "drafter": "auto",
              "tokens_per_second": 45.0, "n_drafted": 4, "n_accepted": 4, "seed": 1}
    body = shape.whole('{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}', result)
    assert body["message"]["tool_calls"] == [{"function": {"name": "get_weather",
                                                           "arguments": {"city": "Paris", "unit": "celsius"}}}]
    jsonschema.validate(body["message"]["tool_calls"][0]["function"]["arguments"], WEATHER)
    parsed = ollama.ChatResponse.model_validate(body)   # the client's own model of the answer
    assert parsed.message.tool_calls[0].function.arguments["city"] == "Paris"


def test_tags_show_version_ps(served):
    o = olla(served)
    (model,) = o.list().models
    assert model.model == served.server.model_id and model.size > 0 and model.details.format == "gguf"
    assert model.details.family == "llama" and model.details.quantization_level == "F32"
    shown = o.show(model.model)
    assert "<|im_start|>" in shown.template and "tools" in shown.capabilities
    assert shown.modelinfo["llama.context_length"] == served.session.n_ctx
    (running,) = o.ps().models
    assert running.model == model.model and running.size == model.size
    version = httpx.get(served.url + "/api/version").json()
    assert version["version"] and version["localspec"]


@pytest.mark.parametrize("path, body, words", [
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "options": {"num_ctx": 10 ** 6}}, "num_ctx"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "options": {"temperature": "hot"}},
     "must be a number"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "format": "xml"}, "'format'"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "format": {"type": "bogus"}},
     "unsupported JSON schema"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, "images"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {}}]},
     "has no name"),
    ("/api/chat", {"messages": "hi"}, "non-empty list"),
    ("/api/generate", {"prompt": 3}, "'prompt'"),
    ("/api/generate", {"prompt": "hi", "options": {"num_predict": "many"}}, "num_predict"),
    ("/api/generate", {"prompt": "hi", "stream": "yes"}, "'stream'"),
    ("/api/show", {"model": None}, "'model' is required"),
])
def test_refusals_are_ollamas_error_shape(served, path, body, words):
    r = post(served, path, {"model": "x", **body})
    assert r.status_code == 400 and set(r.json()) == {"error"} and words in r.json()["error"], r.text


def test_the_client_reports_a_refusal(served):
    with pytest.raises(ollama.ResponseError) as e:
        olla(served).chat(model="x", messages=[{"role": "user", "content": "hi"}], options={"num_ctx": 10 ** 6},
                          stream=False)
    assert e.value.status_code == 400 and "num_ctx" in e.value.error
