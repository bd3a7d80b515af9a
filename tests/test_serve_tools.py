"""Tool calling in `localspec serve`: the reply parsers of each format (Hermes, Llama 3.1, Mistral,
plain JSON) and the streaming splitter without a model; then, through the official `openai`
client on the embedded default pair (SmolLM2-135M, whose template takes no tools: they go in a
system prompt, calls come as plain JSON), forced calls whose arguments validate against the
function's schema at T = 0 (at T = 1 over 20 seeds: test_serve_tools_sampled), a tool-result round trip, "auto" replies, and refusals.
"""

from __future__ import annotations

import json

import pytest

from localspec.serve.calls import CallSplitter, parse_calls
from tests.test_serve import client, post, served  # noqa: F401 - the module's server

jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer"}}, "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather forecast for a city",
                                            "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
             "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
             "required": ["a", "b"]}}}]
NAMES = ("get_weather", "add")
ASK = [{"role": "user", "content": "What will the weather be in Paris tomorrow?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


# ---- the parsers (no model) -------------------------------------------------------------------------

@pytest.mark.parametrize("text, content, n", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "", 1),   # Hermes
    ('Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
     '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>', "Let me look.", 2),
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', "", 1),                    # Llama 3.1 JSON
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
     '{"name": "add", "parameters": {"a": 1, "b": 2}}', "", 2),                             # ...after python_tag
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "add", "arguments": {"a": 1, "b": 2}}]', "", 2),                             # Mistral
    ('[{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", 1),                   # Mistral, marker unread
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', "", 1),       # plain JSON, fenced
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"name": "add", "arguments": {"a": 1, "b": 2}}', "", 2),
])
def test_calls_are_read_in_every_format(text, content, n):
    got_content, calls = parse_calls(text, NAMES)
    assert got_content == content and len(calls) == n
    assert calls[0] == CALL
    if n == 2:
        assert calls[1] == {"name": "add", "arguments": {"a": 1, "b": 2}}


@pytest.mark.parametrize("text", [
    "Paris will be sunny.",
    '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',      # malformed JSON
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}',         # never closed (cut off)
    '<tool_call>{"name": "launch", "arguments": {}}</tool_call>',                 # not an offered function
    '{"name": "get_weather", "arguments": [1, 2]}',                               # arguments not an object
    '{"name": "get_weather", "arguments": {"city": "Paris"}} and then some text',
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}',       # Mistral, cut off
    '<|python_tag|>print("hi")',                                                  # Llama's code, not a call
    '{"city": "Paris"}',                                                          # JSON, but not a call
    '{"name": "get_weather", "city": "Paris"}',                                   # no arguments: not a call
    "[" * 5000,                                                                   # nesting past the parser
])
def test_anything_else_stays_text(text):
    assert parse_calls(text, NAMES) == (text, [])


def test_openai_shaped_and_capital_fenced_calls_are_read():
    shaped = '{"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}'
    assert parse_calls(shaped, NAMES) == ("", [CALL])
    assert parse_calls('```JSON\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', NAMES) == ("", [CALL])


def test_call_ids_are_nine_letters_and_digits():
    """Mistral's templates refuse any other id on the next turn."""
    from localspec.serve.calls import new_call_id
    from localspec.serve.messages import history_call_id

    for call_id in [new_call_id() for _ in range(20)] + [history_call_id(3, 1), history_call_id(12345, 678)]:
        assert len(call_id) == 9 and call_id.isalnum(), call_id


def test_deeply_nested_arguments_in_the_history_are_a_400():
    from localspec.serve.errors import ApiError
    from localspec.serve.messages import arguments

    with pytest.raises(ApiError, match="not valid JSON"):
        arguments("[" * 5000, "messages[1].tool_calls[0].function.arguments")


def test_the_splitter_streams_text_and_holds_calls():
    split = CallSplitter(NAMES)
    pieces = ["Sure", ", one moment. <tool", '_call>{"name": "add", "arguments": {"a": 1, "b": 2}}', "</tool_call>"]
    assert [split.feed(p) for p in pieces] == ["Sure", ", one moment. ", "", ""]
    assert split.finish() == ("", [{"name": "add", "arguments": {"a": 1, "b": 2}}])
    split = CallSplitter(NAMES)   # a reply that starts like JSON but is not a call: all of it, at the end
    assert [split.feed(p) for p in [" ", '{"x"', ": 1}"]] == ["", "", ""]
    assert split.finish() == (' {"x": 1}', [])
    split = CallSplitter(NAMES)   # plain text streams at once, a stray '<' too
    assert [split.feed(p) for p in ["Hi", " <b>", " there"]] == ["Hi", " <b>", " there"]
    assert split.finish() == ("", [])


def test_parallel_false_keeps_the_first_call():
    split = CallSplitter(NAMES, parallel=False)
    split.feed('{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"name": "add", "arguments": {}}')
    assert split.finish() == ("", [CALL])


def test_the_forced_grammar_of_each_format_parses_and_reads_back(served):
    from localspec.serve.calls import parse_calls as read
    from localspec.serve.tools import call_grammar, call_text, parse_tools

    tools = parse_tools({"tools": TOOLS, "tool_choice": "required"})
    for fmt in ("hermes", "llama3", "mistral", "json"):
        served.session.target.grammar(call_grammar(tools, fmt)).close()   # llama.cpp takes it
        assert read(call_text("get_weather", {"city": "Paris"}, fmt), NAMES) == ("", [CALL])


def test_the_template_messages_of_a_template_without_tools():
    from localspec.serve.tools import parse_tools, template_messages

    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "18 C, sunny", "tool_call_id": "c1", "name": "get_weather"},
               {"role": "user", "content": "Thanks"}]
    messages, tools = template_messages(history, parse_tools({"tools": TOOLS}), "{{ messages }}")
    assert tools is None and [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "get_weather" in messages[0]["content"] and "The weather forecast" in messages[0]["content"]
    assert json.loads(messages[2]["content"]) == CALL
    assert messages[3]["content"] == "Tool result (get_weather):\n18 C, sunny\n\nThanks"
    given, offered = template_messages(history, parse_tools({"tools": TOOLS}), "{% for t in tools %}{% endfor %}")
    assert given is history and offered == TOOLS
    # a result no call was matched to (an Ollama turn with no name and nothing unanswered) says so plainly
    bare = [{"role": "user", "content": "Hi"}, {"role": "tool", "content": "42"}]
    messages, _ = template_messages(bare, parse_tools({"tools": TOOLS}), "{{ messages }}")
    assert messages[-1]["content"] == "Hi\n\nTool result:\n42"


def test_more_than_a_megabyte_of_tools_is_refused():
    from localspec.serve.errors import ApiError
    from localspec.serve.tools import parse_tools

    big = [{"type": "function", "function": {"name": f"f{i}", "description": "x" * 10_000}} for i in range(110)]
    with pytest.raises(ApiError, match="more than 1048576 bytes"):
        parse_tools({"tools": big})


# ---- on the server --------------------------------------------------------------------------------

def test_a_forced_call_validates_against_the_schema_at_t0_streamed_or_not(served):
    c = client(served)
    whole = c.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice=NAMED, temperature=0,
                                      max_tokens=96)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and len(call.id) == 9 and call.id.isalnum() and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER)
    chunks = list(c.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice=NAMED,
                                            temperature=0, max_tokens=96, stream=True))
    deltas = [d for ch in chunks for d in ch.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in deltas] == ["get_weather"] and deltas[0].index == 0
    assert json.loads(deltas[0].function.arguments) == args   # greedy: the same call
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks)


def test_a_tool_result_goes_back_in(served):
    c = client(served)
    first = c.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
                                      max_tokens=96)
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    again = c.chat.completions.create(model="x", messages=history, tools=TOOLS, temperature=0, max_tokens=24)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the result is in the prompt: the rendered history holds it, after the call
    from localspec.serve.messages import messages
    from localspec.serve.tools import parse_tools, template_messages

    target = served.session.target
    rendered, _ = template_messages(messages({"messages": history}), parse_tools({"tools": TOOLS}),
                                    target.chat_template)
    text = target.detokenize(target.chat_prompt(rendered))
    assert text.index(call.function.arguments) < text.index("18 degrees and sunny")
    assert again.usage.prompt_tokens == len(target.chat_prompt(rendered))


def test_auto_on_a_question_that_needs_no_tool_answers_in_text(served):
    # SmolLM2-135M, greedy, answers these in prose (it seldom calls a tool unforced, even when one fits)
    c = client(served)
    for question in ("Tell me about lighthouses.", "What will the weather be in Paris tomorrow?"):
        r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": question}], tools=TOOLS,
                                      temperature=0, max_tokens=24)
        assert r.choices[0].message.content and not r.choices[0].message.tool_calls
        chunks = list(c.chat.completions.create(model="x", messages=[{"role": "user", "content": question}],
                                                tools=TOOLS, temperature=0, max_tokens=24, stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == r.choices[0].message.content


def test_auto_at_t1_never_fails(served):
    c = client(served)
    for seed in range(5):
        r = c.chat.completions.create(model="x", messages=ASK, tools=TOOLS, temperature=1, seed=seed, max_tokens=32)
        choice = r.choices[0]
        assert choice.finish_reason in ("stop", "length", "tool_calls")
        assert choice.message.content or choice.message.tool_calls


def test_tool_choice_none_offers_nothing(served):
    c = client(served)
    plain = c.chat.completions.create(model="x", messages=ASK, temperature=0, max_tokens=16)
    none = c.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice="none", temperature=0,
                                     max_tokens=16)
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens


def _tool(**function) -> list[dict]:
    return [{"type": "function", "function": function}]


@pytest.mark.parametrize("body, param, words", [
    ({"tools": {"type": "function"}}, "tools", "must be a list"),
    ({"tools": ["get_weather"]}, "tools[0]", '"type": "function"'),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", '"type": "function"'),
    ({"tools": _tool(description="no name")}, "tools[0].function.name", "has no name"),
    ({"tools": _tool(name="has space")}, "tools[0].function.name", "letters, digits"),
    ({"tools": _tool(name="f", parameters="x")}, "tools[0].function.parameters", "must be a JSON schema"),
    ({"tools": _tool(name="f", parameters={"type": "bogus"})}, "tools[0].function.parameters", "describe an object"),
    ({"tools": _tool(name="f", parameters={"type": "object", "properties": {"a": {"type": "bogus"}}})},
     "tools[0].function.parameters", "unsupported JSON schema"),
    ({"tools": _tool(name="f", parameters={"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}})},
     "tools[0].function.parameters", "'minimum'"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools", "two tools are named 'get_weather'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "launch"}}}, "tool_choice",
     "not among the tools"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", '"none", "auto", "required"'),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "drop response_format"),
    ({"functions": [{"name": "f"}]}, "functions", "deprecated"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[0].tool_calls[0].function.arguments", "not valid JSON"),
])
def test_bad_tool_specs_are_400_naming_the_problem(served, body, param, words):
    r = post(served, "/v1/chat/completions", {"messages": ASK, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_tools_are_refused_on_completions(served):
    r = post(served, "/v1/completions", {"prompt": "hi", "tools": TOOLS})
    assert r.status_code == 400 and "chat/completions" in r.json()["error"]["message"]
