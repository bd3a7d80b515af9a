"""Tool (function) calling: the tools of a request checked, offered to the model, and forced.

`parse_tools` checks OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` (each function's
`parameters` goes through the same JSON-schema checks and conversion as response_format, so a
schema the grammar could not enforce is a 400 here too). The tools reach the model through its
chat template when the template takes `tools` (Qwen, Llama 3.1, Mistral, SmolLM3...); for one
that does not (SmolLM2), a system prompt lists them and asks for a plain JSON call, and earlier
calls and their results are written into the turns as text.

The reply format is read off the template (`call_format`): Hermes `<tool_call>{json}</tool_call>`,
Llama 3.1's `{"name", "parameters"}`, Mistral's `[TOOL_CALLS][{...}]`, else a plain JSON object
`{"name", "arguments"}`. With tool_choice "required" or a named function the reply is constrained
by `call_grammar`: one call in that format, arguments from the function's schema, through the
decoder's grammar machinery, so it stays exact under speculation. A forced reply is one call
(parallel_tool_calls lets an "auto" reply make several); the replies are read in `calls`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .errors import ApiError

MAX_TOOLS = 1 << 20   # bytes of the tools list as JSON (the body limit, 1 MiB, is met first over HTTP)
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")   # OpenAI's rule for function names
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tools:
    """The checked tools of one request."""

    functions: tuple[dict, ...]   # {"name", "description", "parameters"}
    choice: str = "auto"          # "auto", "required" or "function" (the one named in `forced`)
    forced: str | None = None
    parallel: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f["name"] for f in self.functions)

    @property
    def constrained(self) -> bool:
        return self.choice != "auto"

    def offered(self) -> list[dict]:
        """The list as templates take it (OpenAI's shape); a named choice offers that one only."""
        return [{"type": "function", "function": f} for f in self.functions
                if self.forced is None or f["name"] == self.forced]


def _refuse(message: str, param: str) -> None:
    raise ApiError(message, param=param, code="invalid_value")


def parse_tools(body: dict) -> Tools | None:
    """The request's tools, or None when there are none or tool_choice is "none" (not offered)."""
    for old, new in (("functions", "tools"), ("function_call", "tool_choice")):
        if body.get(old) not in (None, "none", "auto") and body.get(old) != []:
            _refuse(f"'{old}' is the deprecated form of '{new}': send '{new}'", old)
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        _refuse("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            _refuse("'tool_choice' needs 'tools' to choose from", "tool_choice")
        return None
    if not isinstance(tools, list):
        _refuse('\'tools\' must be a list of {"type": "function", "function": {"name": ..., "parameters": {...}}}',
                "tools")
    if len(json.dumps(tools)) > MAX_TOOLS:
        _refuse(f"'tools' is more than {MAX_TOOLS} bytes of JSON", "tools")
    functions = tuple(_function(tool, i) for i, tool in enumerate(tools))
    names = [f["name"] for f in functions]
    for name in names:
        if names.count(name) > 1:
            _refuse(f"two tools are named {name!r}", "tools")
    if choice == "none":
        return None
    if choice is None or choice in ("auto", "required"):
        return Tools(functions, choice or "auto", None, parallel is not False)
    named = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = named.get("name") if isinstance(named, dict) else None
    if not isinstance(name, str):
        _refuse('\'tool_choice\' must be "none", "auto", "required" or {"type": "function", "function": '
                '{"name": ...}}', "tool_choice")
    if name not in names:
        _refuse(f"tool_choice names {name[:64]!r}, which is not among the tools ({', '.join(names)[:200]})",
                "tool_choice")
    return Tools(functions, "function", name, parallel is not False)


def _function(tool, i: int) -> dict:
    """One tool, checked: {"type": "function", "function": {"name", "description"?, "parameters"?}}."""
    from localspec.engine.grammar import GrammarError, schema_grammar

    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        _refuse(f'{where} must be {{"type": "function", "function": {{...}}}}', where)
    function = tool.get("function")
    if not isinstance(function, dict):
        _refuse(f"{where}.function must be an object with a name", f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        _refuse(f"{where}.function has no name", f"{where}.function.name")
    if not NAME.fullmatch(name):
        _refuse(f"{where}.function.name {name[:70]!r} must be 1-64 letters, digits, '_', '.' or '-'",
                f"{where}.function.name")
    description = function.get("description", "")
    if not isinstance(description, str):
        _refuse(f"{where}.function.description must be a string", f"{where}.function.description")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = NO_PARAMETERS
    if not isinstance(parameters, dict):
        _refuse(f"{where}.function.parameters must be a JSON schema (an object), got {type(parameters).__name__}",
                f"{where}.function.parameters")
    if parameters.get("type", "object") != "object":
        _refuse(f"{where}.function.parameters must describe an object (\"type\": \"object\"), got "
                f"{json.dumps(parameters.get('type'))[:40]}", f"{where}.function.parameters")
    try:
        schema_grammar(parameters)   # the same checks and converter as response_format's schemas
    except GrammarError as e:
        _refuse(f"{where}.function.parameters: {e}", f"{where}.function.parameters")
    return {"name": name, "description": description, "parameters": parameters}


# ---- the reply's format, and the prompt ---------------------------------------------------------

CALL_FORMATS = ("hermes", "llama3", "mistral", "json")
"""Every format `call_format` reads off a template, and `call_text`/`call_grammar` write."""


def call_format(template: str | None) -> str:
    """How the model writes a call, as its template shows: hermes, llama3, mistral, or json."""
    template = template or ""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3"
    return "json"


def takes_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


def call_text(name: str, args: dict, fmt: str) -> str:
    """One call written as the model of format `fmt` writes it."""
    key = "parameters" if fmt == "llama3" else "arguments"
    obj = json.dumps({"name": name, key: args}, ensure_ascii=False)
    if fmt == "hermes":
        return f"<tool_call>\n{obj}\n</tool_call>"
    return f"[TOOL_CALLS][{obj}]" if fmt == "mistral" else obj


def system_prompt(tools: Tools, fmt: str) -> str:
    """The tools for a template that does not take them: what they are and how to call one."""
    listed = "\n".join(json.dumps(f, ensure_ascii=False) for f in tools.offered())
    example = call_text("FUNCTION_NAME", {"ARGUMENT": "VALUE"}, fmt)
    must = ("You must call one of these tools now. " if tools.constrained else
            "If a tool would help, call it. If no tool is needed, answer in plain text as usual. ")
    several = "To call several, write one call per line. " if tools.parallel and not tools.constrained else ""
    return (f"You have access to these tools (functions), described as JSON schemas:\n{listed}\n\n{must}"
            f"To call a tool, reply with only the call, no other text, in this form:\n{example}\n{several}"
            "A tool's result comes back in a message that begins with \"Tool result\".")


def template_messages(messages: list[dict], tools: Tools | None, template: str | None) -> tuple[list[dict], list | None]:
    """(messages, tools) to render: as given when the template takes tools; otherwise with the
    calls and results written as text (a result as a user turn, joined to any user turn beside it,
    for templates that insist on alternating roles) and the tools in the system prompt."""
    if takes_tools(template):
        return messages, tools.offered() if tools else None
    fmt = call_format(template)
    out: list[dict] = []
    for m in messages:
        role, text = m["role"], m["content"]
        if m.get("tool_calls"):
            calls = "\n".join(call_text(c["function"]["name"], c["function"]["arguments"], fmt) for c in m["tool_calls"])
            text = f"{text}\n{calls}" if text else calls
        if role == "tool":
            who = m.get("name") or m.get("tool_call_id")   # neither: an Ollama turn no call was matched to
            role, text = "user", (f"Tool result ({who}):\n{text}" if who else f"Tool result:\n{text}")
        if out and role == "user" == out[-1]["role"] and m["role"] != out[-1].get("was"):
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{text}"}
            continue
        out.append({"role": role, "content": text, "was": m["role"]})
    for m in out:
        del m["was"]
    if tools is not None:
        prompt = system_prompt(tools, fmt)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, None


# ---- the grammar of a forced call ---------------------------------------------------------------

_LITERAL = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]')
_RULE = re.compile(r"^([A-Za-z0-9-]+) ::=", re.M)


def _prefixed(gbnf: str, prefix: str) -> str:
    """`gbnf` with every rule renamed `prefix` + name (string literals and classes untouched)."""
    names = set(_RULE.findall(gbnf))
    word = re.compile(r"(?<![A-Za-z0-9-])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
                      + r")(?![A-Za-z0-9-])")
    out, at = [], 0
    for m in _LITERAL.finditer(gbnf):
        out.append(word.sub(lambda w: prefix + w.group(1), gbnf[at:m.start()]))
        out.append(m.group(0))
        at = m.end()
    out.append(word.sub(lambda w: prefix + w.group(1), gbnf[at:]))
    return "".join(out)


def _literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def call_grammar(tools: Tools, fmt: str) -> str:
    """GBNF for one call in format `fmt` to one of the offered functions (the forced one).

    Each function's arguments get the grammar of its `parameters` as they are, from their own root,
    with its rules renamed `t<i>-a-...`; only the call around them is written here, as the JSON
    converter writes an object of two required properties. Wrapping `parameters` inside a
    `{name, arguments}` schema instead would rebase its `$ref`s onto the wrapper: `#/properties/x`
    would point at nothing, and `#/$defs/name` at the function's name."""
    from localspec.engine.grammar import schema_grammar

    key = "parameters" if fmt == "llama3" else "arguments"
    parts, alternatives = [], []
    for i, f in enumerate(tools.offered()):
        arguments = _prefixed(schema_grammar(f["function"]["parameters"]), f"t{i}-a-")
        head = " call-space ".join([_literal(json.dumps("name")), '":"', _literal(json.dumps(f["function"]["name"]))])
        parts += [f't{i}-call ::= "{{" call-space {head} "," call-space {_literal(json.dumps(key))} call-space ":" '
                  f'call-space t{i}-a-root "}}" call-space', arguments]
        alternatives.append(f"t{i}-call")
    call = "call ::= " + " | ".join(alternatives)
    root = {"hermes": 'root ::= "<tool_call>\\n" call "\\n</tool_call>"',
            "mistral": 'root ::= "[TOOL_CALLS][" call "]"'}.get(fmt, "root ::= call")
    return "\n".join([root, call, 'call-space ::= " "?', *parts]) + "\n"
