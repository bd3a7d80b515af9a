"""The grammar of a forced tool call, fed the call text token by token through llama.cpp's grammar
engine on the real SmolLM2 vocabulary, in every call format.

The function's `parameters` use both kinds of reference seen in the wild: `"#/$defs/..."` (one
named `name`, as the call's own key is) and `"#/properties/..."` (zod-to-json-schema's default).
A call that satisfies the schema must be accepted to the end (where the end of generation may
come); one that breaks a referenced definition must be refused before it completes. The grammar
used to wrap `parameters` inside a `{name, arguments}` schema, which rebased these references
onto the wrapper: `#/$defs/name` bound the argument to the function-name literal, and
`#/properties/unit` pointed at nothing (a GrammarError under tool_choice "required").
"""

from __future__ import annotations

import json

import pytest

from localspec.engine import GrammarError
from localspec.serve.tools import CALL_FORMATS, call_format, call_grammar, call_text, parse_tools

jsonschema = pytest.importorskip("jsonschema")

PARAMETERS = {
    "type": "object",
    "properties": {
        "who": {"$ref": "#/$defs/name"},              # the wrapper's own key: bound to the function name
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "fallback": {"$ref": "#/properties/unit"},    # zod-to-json-schema's style
        "level": {"$ref": "#/$defs/unit"},            # a definition named like a property of another type
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 3},
    },
    "required": ["who", "unit", "fallback", "level"],
    "$defs": {
        "name": {"type": "object", "properties": {"first": {"type": "string", "maxLength": 12},
                                                  "last": {"type": "string", "maxLength": 12}},
                 "required": ["first"]},
        "unit": {"type": "integer"},
        "tag": {"enum": ["a", "b"]},
    },
}
DEFS_ONLY = {**PARAMETERS, "properties": {k: v for k, v in PARAMETERS["properties"].items() if k != "fallback"},
             "required": ["who", "unit", "level"]}
"""The same without the `#/properties` reference (which alone made the old grammar a GrammarError)."""


def tools(parameters: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "get_weather", "parameters": parameters}},
            {"type": "function", "function": {"name": "name", "parameters": {   # a second tool, its own refs
                "type": "object", "properties": {"x": {"$ref": "#/$defs/name"}}, "required": ["x"],
                "$defs": {"name": {"type": "boolean"}}}}}]

GOOD = {"who": {"first": "Ada", "last": "Lovelace"}, "unit": "celsius", "fallback": "fahrenheit", "level": 3,
        "tags": ["a", "b"]}
BAD = {
    "who is the function name": {**GOOD, "who": "get_weather"},
    "who lacks its required first": {**GOOD, "who": {"last": "Lovelace"}},
    "fallback outside #/properties/unit": {**GOOD, "fallback": "kelvin"},
    "level a string, not #/$defs/unit": {**GOOD, "level": "celsius"},
    "a tag outside #/$defs/tag": {**GOOD, "tags": ["c"]},
}


def test_every_format_is_enumerated():
    assert {call_format(t) for t in ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", None)} == set(CALL_FORMATS)


def cases(parameters: dict) -> tuple[dict, dict]:
    """(a call's arguments that satisfy `parameters`, {why: arguments that break them})."""
    if parameters is PARAMETERS:
        return GOOD, BAD
    good = {k: v for k, v in GOOD.items() if k != "fallback"}
    return good, {why: {k: v for k, v in args.items() if k != "fallback"} for why, args in BAD.items()
                  if "fallback" not in why}


@pytest.mark.parametrize("parameters", [DEFS_ONLY, PARAMETERS], ids=["defs", "defs+properties"])
def test_the_test_data_means_what_it_says(parameters):
    good, bad = cases(parameters)
    jsonschema.validate(good, parameters)
    for args in bad.values():
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(args, parameters)


def accepts(model, gbnf: str, text: str) -> bool:
    """Whether the grammar takes `text`, as the model would write it, to a point where it may end."""
    grammar = model.grammar(gbnf)
    try:
        for token in model.tokenize(text, add_special=False):
            if not grammar.allowed([token])[0]:
                return False
            grammar.accept(token)
        return bool(grammar.allowed([model.eos])[0])
    finally:
        grammar.close()


@pytest.mark.parametrize("fmt", CALL_FORMATS)
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
@pytest.mark.parametrize("parameters", [DEFS_ONLY, PARAMETERS], ids=["defs", "defs+properties"])
def test_a_call_goes_through_its_grammar_token_by_token(target, fmt, choice, parameters):
    good, bad = cases(parameters)
    gbnf = call_grammar(parse_tools({"tools": tools(parameters), "tool_choice": choice}), fmt)
    assert accepts(target, gbnf, call_text("get_weather", good, fmt))
    compact = call_text("get_weather", good, fmt).replace(", ", ",").replace(": ", ":")
    assert accepts(target, gbnf, compact)
    for why, args in bad.items():
        assert not accepts(target, gbnf, call_text("get_weather", args, fmt)), why
    if choice == "required":   # the other tool, under its own `$defs/name`
        assert accepts(target, gbnf, call_text("name", {"x": True}, fmt))
        assert not accepts(target, gbnf, call_text("name", {"x": {"first": "Ada"}}, fmt))
    else:                      # a named choice offers that one only
        assert not accepts(target, gbnf, call_text("name", {"x": True}, fmt))
    assert not accepts(target, gbnf, call_text("get_weather", good, "llama3" if fmt != "llama3" else "json"))


def test_properties_refs_are_a_call_not_a_400():
    """`#/properties/...` refs: "auto" accepted the tool, "required" refused it (a GrammarError)."""
    offered = parse_tools({"tools": tools(PARAMETERS)[:1], "tool_choice": "required"})
    for fmt in CALL_FORMATS:
        try:
            call_grammar(offered, fmt)
        except GrammarError as e:
            pytest.fail(f"{fmt}: {e}")


def test_the_call_text_is_read_back():
    from localspec.serve.calls import parse_calls

    for fmt in CALL_FORMATS:
        assert parse_calls(call_text("get_weather", GOOD, fmt), ("get_weather", "name")) == (
            "", [{"name": "get_weather", "arguments": json.loads(json.dumps(GOOD))}])


def test_the_same_references_in_a_plain_schema(target):
    """response_format and Ollama's format take the same converter: a definition named like a
    property of another type (`#/$defs/unit` beside a property `unit`) once bound to that property's
    rule, so `level` had to be "celsius" or "fahrenheit" instead of an integer."""
    from localspec.engine import schema_grammar

    good, bad = cases(DEFS_ONLY)
    gbnf = schema_grammar(DEFS_ONLY)
    assert accepts(target, gbnf, json.dumps(good))
    for why, args in bad.items():
        assert not accepts(target, gbnf, json.dumps(args)), why
