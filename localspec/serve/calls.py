"""Reading tool calls out of a reply, whole or as it streams.

`parse_calls` knows every format of `tools.call_format` whatever the template: Hermes
`<tool_call>{json}</tool_call>` blocks (text around them stays the reply's content), and a reply
that is only calls: Mistral's `[TOOL_CALLS][{...}, ...]`, Llama 3.1's `{"name", "parameters"}`
(after `<|python_tag|>` or not, several separated by `;` or new lines), a plain `{"name",
"arguments"}` object or a list of them, in a ```json fence or not. A call must name an offered
function and carry an object of arguments (a JSON string holding one is read too); a reply with
anything else, a malformed block or an unknown name, is plain text: never an error.

`CallSplitter` streams text as it comes until the reply begins to look like a call (a `{`, `[`,
a tag or the prefix of one); from there it holds the rest back, and at the end either the calls
or the held text come out.
"""

from __future__ import annotations

import json
import re
import secrets

HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
OPENERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "{", "[", "```")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S | re.I)


ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def new_call_id() -> str:
    """9 letters and digits, as llama.cpp's server makes them: Mistral's templates refuse any other
    id ("Tool call IDs should be alphanumeric strings with length 9!") on the next turn."""
    return "".join(secrets.choice(ID_CHARS) for _ in range(9))


def _call(obj, names) -> dict | None:
    """{"name", "arguments": dict} from one call object, or None if it is not a call."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):   # OpenAI's own shape, written out
        return _call(obj["function"], names)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in names:
        return None
    keys = set(obj) - {"name", "id", "type"}
    if len(keys) != 1 or not keys <= {"arguments", "parameters"}:
        return None   # {"name": "f", "city": "Paris"} is not a call: its arguments would be lost
    args = obj[keys.pop()]
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    return {"name": obj["name"], "arguments": args}


def _json_calls(text: str, names) -> list[dict] | None:
    """The calls when `text` is nothing but call objects (or lists of them); None otherwise."""
    text = text.strip()
    for marker in ("[TOOL_CALLS]", "<|python_tag|>"):
        if text.startswith(marker):
            text = text[len(marker):].strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    decoder, calls, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at] in " \t\r\n;,":
            at += 1
        if at == len(text):
            return calls or None
        try:
            value, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):   # a reply of thousands of "[": text, never a 500
            return None
        for obj in value if isinstance(value, list) and value else [value]:
            call = _call(obj, names)
            if call is None:
                return None
            calls.append(call)


def parse_calls(text: str, names) -> tuple[str, list[dict]]:
    """(content, calls) of a reply; no calls: (text, []) unchanged."""
    blocks = HERMES.findall(text)
    if blocks:
        calls = []
        for block in blocks:
            found = _json_calls(block, names)
            if not found:
                return text, []
            calls += found
        rest = HERMES.sub("", text)
        if "<tool_call>" in rest:   # one left open: cut off, or not a call after all
            return text, []
        return rest.strip(), calls
    calls = _json_calls(text, names)
    return ("", calls) if calls else (text, [])


def openai_calls(calls: list[dict]) -> list[dict]:
    return [{"id": new_call_id(), "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
            for c in calls]


def ollama_calls(calls: list[dict]) -> list[dict]:
    return [{"function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]


class CallSplitter:
    """Streams a reply's text while it cannot be a call; holds the rest once it may be one."""

    def __init__(self, names, parallel: bool = True):
        self.names, self.parallel = names, parallel
        self.sent = ""        # text already streamed
        self.held = ""        # text held back: a call, perhaps
        self.locked = False   # a call has begun: hold everything to the end

    def feed(self, text: str) -> str:
        """The part of `text` to stream now ('' while it is held)."""
        self.held += text
        if self.locked:
            return ""
        if not self.sent.strip():   # at the reply's start, any format's call may begin
            head = self.held.lstrip()
            if not head or any(o.startswith(head) for o in OPENERS):
                return ""
            if head.startswith(OPENERS):
                self.locked = True
                return ""
        at = self.held.find("<tool_call>")   # Hermes calls may follow some text
        self.locked = at >= 0
        if at < 0:   # a tag's beginning at the end waits for the next piece
            tail = len(self.held)
            at = next((i for i in range(max(tail - 10, 0), tail) if "<tool_call>".startswith(self.held[i:])), tail)
        out, self.held = self.held[:at], self.held[at:]
        self.sent += out
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """(text still to stream, calls) once the reply is complete."""
        content, calls = parse_calls(self.sent + self.held, self.names)
        if not calls:
            out, self.held = self.held, ""
            return out, []
        if not self.parallel:
            calls = calls[:1]
        rest = content[len(self.sent.strip()):].strip() if content.startswith(self.sent.strip()) else ""
        return rest, calls


def reply_calls(text: str, names, parallel: bool) -> tuple[str, list[dict]]:
    """A whole reply's (content, calls): the first call only unless `parallel`."""
    content, calls = parse_calls(text, names)
    return content, calls if parallel else calls[:1]
