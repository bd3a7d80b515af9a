"""Chat messages of a request, checked and put in the form chat templates take.

OpenAI's roles: system (and developer, its newer name), user, assistant, tool. Content is a string
or a list of text parts. An assistant turn may carry `tool_calls` (arguments as a JSON string,
which must hold an object) instead of text; a `tool` turn carries a call's result and the
`tool_call_id` it answers (Ollama's: the function's `tool_name`, or nothing). Templates get the
calls as Hugging Face's templates read them: the arguments as an object, the result with the call's
id and the function's `name`, looked up from the call it answers.
"""

from __future__ import annotations

import json

from .errors import ApiError

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def content(message: dict, i: int) -> str:
    value = message.get("content")
    if value is None and message.get("role") == "assistant":
        return ""  # an assistant turn may carry no text (OpenAI allows it there only)
    if value is None or value == []:
        raise ApiError("message content is required (a string or a list of text parts)",
                       param=f"messages[{i}].content", code="missing_required_parameter")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ApiError("only text content parts are supported", param=f"messages[{i}].content",
                               code="unsupported_content")
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError("message content must be a string or a list of text parts", param=f"messages[{i}].content",
                   code="invalid_type")


def arguments(value, where: str) -> dict:
    """A call's arguments as an object: OpenAI sends a JSON string, Ollama an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except (ValueError, RecursionError):   # deep nesting overflows the parser: bad input too
            raise ApiError(f"{where} is not valid JSON", param=where, code="invalid_value") from None
    if not isinstance(value, dict):
        raise ApiError(f"{where} must be a JSON object", param=where, code="invalid_value")
    return value


def history_call_id(i: int, j: int) -> str:
    """An id for a call in the history that came without one (Ollama's): 9 letters and digits,
    which Mistral's templates insist on, fixed by its place so a conversation renders the same."""
    return f"c{i:04d}{j:04d}"[:9]


def tool_calls(calls, i: int) -> list[dict]:
    """An assistant turn's calls, OpenAI's shape (`id` optional: Ollama's have none)."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise ApiError(f"{where} must be a list", param=where, code="invalid_type")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]):
            raise ApiError(f"{where}[{j}] needs a function with a name", param=f"{where}[{j}]", code="invalid_value")
        args = arguments(function.get("arguments", {}), f"{where}[{j}].function.arguments")
        call_id = call.get("id") if isinstance(call.get("id"), str) else history_call_id(i, j)
        out.append({"id": call_id, "type": "function", "function": {"name": function["name"], "arguments": args}})
    return out


def messages(body: dict, ollama: bool = False) -> list[dict]:
    """The checked messages of `body`. A tool turn answers a call of the last assistant turn:
    the one its `tool_call_id` names, else the first unanswered call of its `tool_name` (Ollama's),
    else (Ollama's, with neither) the first unanswered call, so that templates get the call's id and
    name either way. OpenAI requires the id; Ollama requires neither."""
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise ApiError("'messages' must be a non-empty list", param="messages",
                       code="missing_required_parameter" if given is None else "invalid_type")
    out: list[dict] = []
    names: dict[str, str] = {}   # call id -> function name, for the tool turns that answer them
    unanswered: list[dict] = []   # the last assistant turn's calls no tool turn has answered yet
    for i, m in enumerate(given):
        if not isinstance(m, dict):
            raise ApiError(f"messages[{i}] must be an object", param=f"messages[{i}]", code="invalid_type")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise ApiError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r:.40}",
                           param=f"messages[{i}].role", code="invalid_value")
        message = {"role": ROLES[role], "content": content(m, i)}
        if role == "assistant":
            unanswered = []
            if m.get("tool_calls"):
                message["tool_calls"] = tool_calls(m["tool_calls"], i)
                names.update((c["id"], c["function"]["name"]) for c in message["tool_calls"])
                unanswered = list(message["tool_calls"])
        if role == "tool":
            call_id, name = _answered(m, i, names, unanswered, ollama)
            message["tool_call_id"], message["name"] = call_id, name
        out.append(message)
    return out


def _answered(m: dict, i: int, names: dict[str, str], unanswered: list[dict], ollama: bool) -> tuple[str, str]:
    """(call id, function name) of the call tool turn `m` answers; taken off `unanswered`."""
    call_id = m.get("tool_call_id") if isinstance(m.get("tool_call_id"), str) else ""
    name = m.get("name") or m.get("tool_name")   # Ollama names the function instead
    name = name if isinstance(name, str) else ""
    if not (call_id or name or ollama):
        raise ApiError(f"messages[{i}] (role tool) needs the 'tool_call_id' it answers",
                       param=f"messages[{i}].tool_call_id", code="missing_required_parameter")
    if call_id:
        call = next((c for c in unanswered if c["id"] == call_id), None)
    else:
        call = next((c for c in unanswered if not name or c["function"]["name"] == name), None)
    if call is not None:
        unanswered.remove(call)
        call_id = call_id or call["id"]
    return call_id, name or names.get(call_id, "")
