"""JSON schemas as GBNF, refusing what the converter would not enforce.

The conversion is llama-cpp-python's `json_schema_to_gbnf` (the port of llama.cpp's
json-schema-to-grammar). It passes over some keywords in silence and turns contradictions into
something else (`minItems` 3 with `maxItems` 1 gives exactly 3 items), so output "under" such a
schema could break it while finishing with `stop`. `check_schema` walks the schema first and refuses,
in one line naming the keyword and where it is, what is unsatisfiable or would not be enforced.

Two things the converter gets wrong are worked around rather than refused: it names the rule of a
`$ref` after the reference's last segment and reuses any rule already of that name, so
`"#/$defs/unit"` could bind to the rule of a property `unit` (`_named_refs` gives every referenced
schema a name nothing else can take); and it writes each minimum out in full (`minLength` 5 is five
`char`s), so a large minimum costs grammar text, build time and memory in proportion
(`MAX_MINIMUM`).
"""

from __future__ import annotations

import json
import re

from llama_cpp import llama_grammar

from .files import EngineError


class SchemaError(EngineError):
    """A JSON schema that cannot be used (grammar.GrammarError is its subclass for callers)."""


UNENFORCED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems", "not",
              "if", "then", "else", "patternProperties", "propertyNames", "minProperties", "maxProperties",
              "contains", "minContains", "maxContains", "dependentRequired", "dependentSchemas",
              "unevaluatedProperties", "unevaluatedItems")
"""Keywords that constrain values but that the converter passes over in silence."""

FORMATS = ("date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5")
"""The string formats the converter writes rules for; any other `format` would be ignored."""

MAX_DEPTH = 64
_INVALID_IN_NAMES = re.compile(r"[^a-zA-Z0-9-]+")   # what the converter turns into "-" in a rule's name

MAX_NESTING = 1000
"""How deep GBNF groups may nest (grammar.check_repetitions). The converter nests one optional group
per item that `maxLength`/`maxItems`/a pattern's `{m,n}` allows beyond the minimum."""

MAX_MINIMUM = 1 << 17
"""The most characters and items a schema's minimums may ask for, all together (`minLength`,
`minItems`, a pattern's `{m}`/`{m,}`/`{m,n}`; `minProperties` and `minContains` are refused
outright, in UNENFORCED): each unit is at least one character the model must write before the
grammar lets it stop. The context the reply must fit is not known where a schema is checked
(tools, response_format and Ollama's format are read before any model is asked), so the bound is
fixed and generous: 131,072 = 2**17, the context the common long-context models are trained for
(Llama 3.1, Qwen 2.5: 128k tokens) and 32 times localspec's default n_ctx (4096). A minimum past
it fills such a whole context at one character a token, a quarter of it at the ~4 characters a
token BPE vocabularies average on text, so with a prompt beside it no server here could finish it.
Counted as the converter writes them (a definition reached through several references once, a
repeat inside a repeat once each): the bound holds the grammar's size (2e7 took 44 s and 1.9 GB to
answer in a fault pass; at the bound the text is ~650 kB and llama.cpp builds it in ~0.2 s),
while a reply whose nested minimums multiply past the context ends at the length limit."""


def schema_grammar(schema: str | dict, error: type[EngineError] = SchemaError) -> str:
    """GBNF for a JSON schema (text or parsed), after `check_schema`; `error` is what is raised."""
    try:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise SchemaError(f"a JSON schema must be an object, got {type(parsed).__name__}")
        check_schema(parsed)
        return _strict_strings(llama_grammar.json_schema_to_gbnf(json.dumps(_named_refs(parsed))))
    except SchemaError as e:
        raise error(str(e)) from None
    except json.JSONDecodeError as e:
        raise error(f"the JSON schema is not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise error("the JSON schema nests too deeply") from None
    except Exception as e:   # the converter raises ValueError, KeyError, TypeError... on odd schemas
        detail = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise error(f"unsupported JSON schema: {detail}") from None


class _Walk:
    """What one check has seen: the references followed, the nodes whose minimums are counted (a
    schema reached twice, through two references, is one rule in the grammar), and their total."""

    def __init__(self):
        self.refs: set = set()
        self.counted: set = set()
        self.minimum = 0

    def count(self, node: dict, key: str, value: int, where: str) -> None:
        """Add `value`, the minimum `key` (in `node`) asks for, to the schema's total; refuse past MAX_MINIMUM."""
        if (id(node), key) in self.counted:
            return
        self.counted.add((id(node), key))
        self.minimum += value
        if self.minimum > MAX_MINIMUM:
            alone = "" if value == self.minimum else f" (with the schema's other minimums, {self.minimum})"
            _refuse(key, where, f"asks for at least {value} characters or items{alone}: more than the "
                    f"{MAX_MINIMUM} any context here can hold")


def check_schema(root: dict) -> None:
    """Refuse (SchemaError) what is unsatisfiable or would not be enforced, anywhere in `root`."""
    _walk(root, root, "the schema", 0, _Walk())


def _walk(node, root: dict, where: str, depth: int, seen: _Walk) -> None:
    if depth > MAX_DEPTH:
        raise SchemaError("the JSON schema nests too deeply")
    if isinstance(node, list):
        for i, sub in enumerate(node):
            _walk(sub, root, f"{where}[{i}]", depth + 1, seen)
        return
    if not isinstance(node, dict):
        return
    _check_node(node, root, where, seen)
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and ref not in seen.refs:   # the converter goes there too
        seen.refs.add(ref)
        _walk(_resolve(ref, root), root, ref, depth + 1, seen)
    for key in ("items", "additionalProperties", "prefixItems", "anyOf", "oneOf", "allOf"):
        if key in node:
            _walk(node[key], root, f"{where}.{key}", depth + 1, seen)
    for key in ("properties", "$defs", "definitions"):
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                _walk(sub, root, f"{where}.{key}.{name}", depth + 1, seen)


def _refuse(key: str, where: str, why: str) -> None:
    raise SchemaError(f"unsupported JSON schema: '{key}' (in {where}) {why}")


def _check_node(node: dict, root: dict, where: str, seen: _Walk) -> None:
    for key in UNENFORCED:
        if key in node:
            _refuse(key, where, "cannot be enforced by the grammar converter; drop it or check it after generation")
    if "$ref" in node:
        _check_ref(node["$ref"], root, where)
        return   # the converter follows the reference and reads nothing else here
    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        _refuse("enum", where, "must list at least one value: an empty enum allows nothing")
    kind = node.get("type")
    fixed = any(k in node for k in ("const", "enum", "anyOf", "oneOf")) or isinstance(kind, list)
    if "format" in node and not ("const" in node or "enum" in node):   # a fixed value needs no format
        fmt = node["format"]
        if kind not in (None, "string") or fixed or "pattern" in node or fmt not in FORMATS:
            shown = json.dumps(fmt)[:40]
            _refuse("format", where, f"{shown} is not enforced by the grammar converter (it enforces "
                    f"{', '.join(FORMATS[:4])} on strings without a 'pattern'); use a 'pattern' or drop it")
    if "required" in node and kind in (None, "object") and not fixed:
        _check_required(node, root, where)
    _check_counts(node, where, "minLength", "maxLength", seen,
                  enforced=kind == "string" and not fixed and "pattern" not in node and "format" not in node,
                  alone="only on a 'type': 'string' without 'pattern', 'format', 'enum' or 'const'")
    items = node.get("items", node.get("prefixItems"))
    if isinstance(items, list) and not fixed:   # a tuple: exactly len(items) items
        low, high = node.get("minItems", 0), node.get("maxItems", len(items))
        if not (isinstance(low, int) and isinstance(high, int) and low <= len(items) <= high):
            _refuse("minItems" if "minItems" in node else "maxItems", where,
                    f"contradicts the {len(items)} items the tuple fixes")
    else:
        _check_counts(node, where, "minItems", "maxItems", seen,
                      enforced=kind in (None, "array") and not fixed and isinstance(items, dict),
                      alone="only on an array with a single 'items' schema")
    if isinstance(node.get("pattern"), str) and not fixed:
        seen.count(node, "pattern", _check_pattern(node["pattern"], where), where)


def _check_required(node: dict, root: dict, where: str) -> None:
    """`required` names the converter writes: its own `properties`' (or, in an `allOf` without
    them, its parts'); it passes over any other name, so output would lack it yet finish."""
    required = node["required"]
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        _refuse("required", where, f"must be a list of property names, got {json.dumps(required)[:40]}")
    named = set(node["properties"]) if isinstance(node.get("properties"), dict) else set()
    if "properties" not in node and isinstance(node.get("allOf"), list):
        for part in node["allOf"]:
            part = _resolve(part["$ref"], root) if isinstance(part, dict) and isinstance(part.get("$ref"), str) else part
            if isinstance(part, dict) and isinstance(part.get("properties"), dict):
                named |= set(part["properties"])
    for name in required:
        if name not in named:
            _refuse("required", where, f"names {json.dumps(name)[:60]}, which is not in 'properties': the grammar "
                    f"would never write it; add it to 'properties' or drop it from 'required'")


def _check_counts(node: dict, where: str, low_key: str, high_key: str, seen: _Walk, enforced: bool,
                  alone: str) -> None:
    given = [k for k in (low_key, high_key) if k in node]
    if not given:
        return
    if not enforced:
        _refuse(given[0], where, f"is not enforced here ({alone})")
    for key in given:
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            _refuse(key, where, f"must be a whole number of at least 0, got {json.dumps(value)[:40]}")
    low, high = node.get(low_key, 0), node.get(high_key)
    if high is not None and low > high:
        _refuse(low_key, where, f"is {low}, more than '{high_key}' {high}: nothing satisfies both")
    if high is not None and high - low > MAX_NESTING:
        _refuse(high_key, where, f"is {high}: the grammar allows at most {MAX_NESTING} more than "
                f"'{low_key}' ({low}), one nested group each")
    if low:
        seen.count(node, low_key, low, where)


def _check_pattern(pattern: str, where: str) -> int:
    """What the converter's regex reader gets wrong: a reversed `{m,n}` (it writes m copies and drops
    the maximum), and a `}` or `]` that closes nothing (it loops forever on it: a hung request).
    Returns the copies its repeats' minimums write out (each `{m}`, `{m,}`, `{m,n}`: m)."""
    i, n, minimum = 0, len(pattern), 0
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif c == "{":
            j = pattern.find("}", i)
            parts = [p.strip() for p in pattern[i + 1:j if j >= 0 else n].split(",")]
            if len(parts) <= 2 and parts[0].isdigit() and all(p.isdigit() for p in parts[1:] if p):
                low = int(parts[0])
                high = low if len(parts) == 1 else int(parts[1]) if parts[1] else None
                if high is not None and low > high:
                    _refuse("pattern", where, f"repeats {{{low},{high}}}: at least {low} and at most {high} "
                            f"allows nothing")
                if high is not None and high - low > MAX_NESTING:
                    _refuse("pattern", where, f"repeats {{{low},{high}}}: the grammar allows at most "
                            f"{MAX_NESTING} optional repeats, one nested group each")
                if low > MAX_MINIMUM:   # the total is checked by the caller; this stops a 10**100 early
                    _refuse("pattern", where, f"repeats at least {low} times: more than the {MAX_MINIMUM} "
                            f"any context here can hold")
                minimum += low
            i = j if j >= 0 else n
        elif c in "}]":
            _refuse("pattern", where, f"has a '{c}' at offset {i} that closes nothing (write \\{c} for the "
                    f"character itself)")
        i += 1
    return minimum


def _check_ref(ref, root: dict, where: str) -> None:
    """A `$ref` that comes back to itself through references and alternatives alone, before any
    text, is left recursion: llama.cpp cannot parse the grammar, and no output could finish."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return   # the converter reports those itself
    seen, todo = set(), [ref]
    while todo:
        current = todo.pop()
        target = _resolve(current, root)
        if target is None:
            raise SchemaError(f"unsupported JSON schema: '$ref' {json.dumps(current)[:60]} (in {where}) "
                              f"points at nothing in the schema")
        for nxt in _passed_through(target):
            if nxt == ref:
                raise SchemaError(f"unsupported JSON schema: '$ref' {json.dumps(ref)[:60]} (in {where}) leads back "
                                  f"to itself before any text (left recursion): no output could ever finish")
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)


def _passed_through(node) -> list:
    """The references the converter enters from `node` without writing any text first."""
    if not isinstance(node, dict):
        return []
    if isinstance(node.get("$ref"), str):
        return [node["$ref"]] if node["$ref"].startswith("#") else []
    alternatives = node.get("oneOf") or node.get("anyOf") or []
    out = []
    for alt in alternatives if isinstance(alternatives, list) else []:
        out += _passed_through(alt)
    return out


def _resolve(ref: str, root: dict):
    target = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target


_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_VALUES = ("const", "enum", "default", "examples")   # JSON values, not schemas: a "$ref" in them is data
_RULE_NAMES = ("space", "root", "dot", "char", "item", "tuple", "alternative", "additional", "string", "number",
               "integer", "boolean", "null", "value", "object", "array", "uuid", "date", "time")
"""The first words of the rule names the converter makes without a property's name in them."""


def _named_refs(root: dict) -> dict:
    """A copy of `root` whose local `$ref`s all point into one table of its own, each referenced
    schema under a name nothing else in the grammar can take. The converter names a reference's
    rule after the reference's last segment and reuses a rule already of that name: `"#/$defs/unit"`
    would bind to the rule of a property named `unit` (output that breaks the schema yet finishes)."""
    words = set(_RULE_NAMES)
    _keys(root, words)
    table = "ref"
    while any(word.startswith(table) for word in words):   # so no other rule's name starts with it
        table += "x"
    names: dict[int, str] = {}
    defs: dict[str, object] = {}

    def name(ref: str) -> str | None:
        target = _resolve(ref, root)
        if not isinstance(target, dict):
            return None   # the converter reports it
        if id(target) not in names:
            names[id(target)] = f"{table}{len(names)}x"   # the x: "ref1" + a de-duplicating 0 is not "ref10"
            defs[names[id(target)]] = copy(target)
        return names[id(target)]

    def copy(node, schemas: bool = True):
        if isinstance(node, list):
            return [copy(sub, schemas) for sub in node]
        if not isinstance(node, dict) or not schemas:
            return node
        out = {}
        for key, value in node.items():
            ref = name(value) if key == "$ref" and isinstance(value, str) and value.startswith("#") else None
            if ref is not None:
                out[key] = f"#/{table}/{ref}"
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {k: copy(v) for k, v in value.items()}
            else:
                out[key] = copy(value, key not in _VALUES)
        return out

    out = copy(root)
    out[table] = defs
    return out


def _keys(node, into: set) -> None:
    """Every key anywhere in `node`, as the converter would write it in a rule name."""
    if isinstance(node, list):
        for sub in node:
            _keys(sub, into)
    elif isinstance(node, dict):
        for key, value in node.items():
            into.add(_INVALID_IN_NAMES.sub("-", str(key)))
            _keys(value, into)


_LOOSE_CHAR = r'char ::= [^"\\] |'
_STRICT_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'


def _strict_strings(gbnf: str) -> str:
    """JSON strings hold no raw control characters (RFC 8259): llama-cpp-python 0.3's port lets
    them through (`char ::= [^"\\]`), llama.cpp's own converter excludes them; use llama.cpp's."""
    return "\n".join(_STRICT_CHAR + line[len(_LOOSE_CHAR):] if line.startswith(_LOOSE_CHAR) else line
                     for line in gbnf.split("\n"))
