"""Forced tool calls at T = 1 (`tool_choice: "required"`, 20 seeds): each reply is a call whose
arguments validate against its function's schema, the grammar holding under speculative sampling.
About 30 s on 2 cores, hence in the slow tier (tests/conftest.py SLOW)."""

from __future__ import annotations

import json

import pytest

from tests.test_serve import client, served  # noqa: F401 - the module's server
from tests.test_serve_tools import ASK, TOOLS

jsonschema = pytest.importorskip("jsonschema")


def test_required_calls_validate_at_t1_over_20_seeds(served):
    c = client(served)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for seed in range(20):
        r = c.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice="required",
                                      temperature=1, seed=seed, max_tokens=96)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", (seed, choice)
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
