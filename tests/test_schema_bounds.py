"""JSON schemas whose grammar could not be what they say: `required` names that are not among the
`properties` (the converter passes over them: output lacks them yet finishes), and minimums past
what a context can hold (the converter writes each unit of a minimum out: `minLength` 2e7 in a
forced tool call took 44 s and 1.9 GB to answer, 1e12 a 400 "MemoryError"). Each is refused in
one line naming the keyword: by `schema_grammar`, by the server (response_format, tools, Ollama's
format: 400, at once) and by the CLI's `--json-schema` (one `error:` line, exit 2).
"""

from __future__ import annotations

import time

import pytest

from localspec.engine import GrammarError, schema_grammar
from localspec.engine.schema import MAX_MINIMUM, MAX_NESTING

MISSING = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city", "country"]}
HUGE = 20_000_000


def refusal(schema) -> str:
    with pytest.raises(GrammarError) as e:
        schema_grammar(schema)
    assert "\n" not in str(e.value)
    return str(e.value)


def string(**kw) -> dict:
    return {"type": "string", **kw}


def array(**kw) -> dict:
    return {"type": "array", "items": {"type": "integer"}, **kw}


# ---- required ----------------------------------------------------------------------------------

@pytest.mark.parametrize("schema, words", [
    (MISSING, "'required' (in the schema) names \"country\", which is not in 'properties'"),
    ({"type": "object", "required": ["a"]}, "names \"a\""),                                  # no properties at all
    ({"type": "object", "additionalProperties": {"type": "string"}, "required": ["a"]}, "names \"a\""),
    ({"type": "object", "properties": {"in": {"type": "object", "properties": {}, "required": ["x"]}}},
     "'required' (in the schema.properties.in) names \"x\""),
    ({"$defs": {"d": MISSING}, "type": "object", "properties": {"p": {"$ref": "#/$defs/d"}}}, "names \"country\""),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": "a"}, "must be a list"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": [1]}, "must be a list"),
])
def test_required_names_without_a_property_are_refused(schema, words):
    assert words in refusal(schema)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": []},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}}], "required": ["a"]},
    {"enum": [{"a": 1}], "required": ["b"]},   # a fixed value: nothing to require
])
def test_required_names_with_their_property_are_kept(schema):
    assert "root ::=" in schema_grammar(schema)


# ---- minimums ------------------------------------------------------------------------------------

@pytest.mark.parametrize("schema, keyword", [
    (string(minLength=HUGE), "minLength"),
    (string(minLength=10 ** 12), "minLength"),
    (string(minLength=MAX_MINIMUM + 1), "minLength"),
    (string(minLength=HUGE, maxLength=HUGE + 5), "minLength"),
    (array(minItems=HUGE), "minItems"),
    (array(minItems=MAX_MINIMUM + 1, maxItems=MAX_MINIMUM + 1), "minItems"),
    (string(pattern=f"^a{{{HUGE}}}$"), "pattern"),
    (string(pattern=f"^(ab){{{HUGE},}}$"), "pattern"),
    (string(pattern=f"^x[a-z]{{{HUGE},{HUGE + 3}}}$"), "pattern"),
    (string(pattern="^" + "a{60000}" * 3 + "$"), "pattern"),   # together past the bound
    ({"type": "object", "minProperties": HUGE}, "minProperties"),
    (array(minContains=HUGE), "minContains"),
])
def test_each_minimum_past_a_context_is_refused_naming_it(schema, keyword):
    started = time.monotonic()
    message = refusal(schema)
    assert f"'{keyword}'" in message and time.monotonic() - started < 1, message


def test_minimums_add_up_across_the_schema():
    third = MAX_MINIMUM // 3 + 1
    schema = {"type": "object", "properties": {
        "a": string(minLength=third), "b": array(minItems=third), "c": string(pattern=f"^z{{{third}}}$")}}
    assert "'pattern' (in the schema.properties.c)" in refusal(schema)
    del schema["properties"]["c"]
    assert "root ::=" in schema_grammar(schema)


def test_a_definition_reached_twice_is_written_and_counted_once():
    half = {"$defs": {"s": string(minLength=MAX_MINIMUM // 2)}, "type": "object",
            "properties": {"a": {"$ref": "#/$defs/s"}, "b": {"$ref": "#/$defs/s"}, "c": {"$ref": "#/$defs/s"}}}
    assert "root ::=" in schema_grammar(half)


def test_at_the_bound_the_grammar_builds_quickly(target):
    for schema in (string(minLength=MAX_MINIMUM), array(minItems=MAX_MINIMUM), string(pattern=f"^a{{{MAX_MINIMUM}}}$")):
        started = time.monotonic()
        target.grammar(schema_grammar(schema)).close()
        assert time.monotonic() - started < 10


@pytest.mark.parametrize("schema, words", [
    (string(maxLength=MAX_NESTING + 1), "'maxLength'"),
    (string(minLength=5000, maxLength=5000 + MAX_NESTING + 1), "'maxLength'"),
    (array(maxItems=MAX_NESTING + 1), "'maxItems'"),
    (array(minItems=10, maxItems=10 + MAX_NESTING + 1), "'maxItems'"),
    (string(pattern=f"^a{{0,{MAX_NESTING + 1}}}$"), "'pattern'"),
])
def test_the_caps_on_maximums_still_hold(schema, words):
    assert words in refusal(schema)


@pytest.mark.parametrize("schema", [
    string(minLength=5000, maxLength=5000 + MAX_NESTING), array(minItems=MAX_MINIMUM),
    string(pattern=f"^a{{{MAX_MINIMUM}}}$"), string(pattern="^a{3,}b{2}$")])
def test_minimums_inside_the_bound_are_kept(schema):
    assert "root ::=" in schema_grammar(schema)


# ---- the server and the CLI ------------------------------------------------------------------------

from tests.test_serve import post, served  # noqa: E402, F401 - the module's server

ASK = [{"role": "user", "content": "hi"}]


def _tool(parameters: dict) -> dict:
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
            "tool_choice": "required"}


def _object(**properties) -> dict:
    return {"type": "object", "properties": properties}


BODIES = {
    "response_format": lambda schema: {"response_format": {"type": "json_schema",
                                                           "json_schema": {"name": "x", "schema": schema}}},
    "tools[0].function.parameters": lambda schema: _tool(schema),
}
SCHEMAS = [
    (_object(s=string(minLength=HUGE)), "'minLength'"),
    (_object(s=string(minLength=10 ** 12)), "'minLength'"),
    (_object(a=array(minItems=HUGE)), "'minItems'"),
    (_object(p=string(pattern=f"^a{{{HUGE}}}$")), "'pattern'"),
    (_object(o={"type": "object", "minProperties": HUGE}), "'minProperties'"),
    (MISSING, "'required' (in the schema) names \"country\""),
]


@pytest.mark.parametrize("param", BODIES)
@pytest.mark.parametrize("schema, words", SCHEMAS, ids=[w.split("'")[1] + str(i) for i, (_, w) in enumerate(SCHEMAS)])
def test_the_server_answers_400_at_once(served, param, schema, words):
    started = time.monotonic()
    r = post(served, "/v1/chat/completions", {"model": "x", "messages": ASK, "max_tokens": 4, **BODIES[param](schema)})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("schema, words", SCHEMAS, ids=[w.split("'")[1] + str(i) for i, (_, w) in enumerate(SCHEMAS)])
def test_ollama_format_answers_400_at_once(served, schema, words):
    started = time.monotonic()
    r = post(served, "/api/chat", {"model": "x", "messages": ASK, "format": schema, "stream": False,
                                   "options": {"num_predict": 4}})
    assert r.status_code == 400 and words in r.json()["error"], r.text
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("schema, words", [
    ('{"type": "string", "minLength": 20000000}', "'minLength' (in the schema) asks for at least 20000000"),
    ('{"type": "object", "properties": {}, "required": ["a"]}', "'required' (in the schema) names \"a\""),
])
def test_the_cli_gives_one_error_line(schema, words):
    from tests.test_hostile import one_error_line
    from tests.test_hostile_cli import run

    r = run("generate", "--json-schema", schema, "--max-tokens", "2", "hi", timeout=60)
    line = one_error_line(r)
    assert line.startswith("error: --json-schema:") and words in line, line
