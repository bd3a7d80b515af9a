"""Chat prompts in which a message's text stays text.

A GGUF's chat template writes its turn markers as special-token text (`<|im_start|>`), which the
tokenizer reads back as those tokens. Reading the whole rendered prompt that way would also read
the same text inside a message as real markers: a user, or any client of the server, could close
its own turn and open a forged system turn. So only the template's own text may hold special
tokens; every message's content is tokenized literally.

The template is rendered twice: as is, and with each message's content replaced by a random
placeholder. The placeholders cut the rendering into the template's own pieces; if the pieces with
the real contents put back reproduce the real rendering exactly (a template that strips contents
is recognised too), the prompt is tokenized the way llama.cpp would tokenize the whole string,
except that no special token is looked for inside a content. A template that changes contents in
another way (drops them, changes case) gets the plain reading, and only when no content holds
special-token text; otherwise the prompt is refused.
"""

from __future__ import annotations

import secrets
from typing import Callable, Sequence

from .files import EngineError

# llama_token_attr flags. Special-token parsing adds control and unknown tokens to what plain
# tokenizing matches (user-defined tokens are matched either way).
_SPECIAL = (1 << 3) | (1 << 0)  # LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_UNKNOWN
_LSTRIP, _RSTRIP = 1 << 7, 1 << 8  # the token takes the whitespace on its left / right
_SPACE = " \t\n\v\f\r"  # what C's isspace, which llama.cpp strips with, calls whitespace

# How templates are seen to pass a content on: unchanged, or trimmed (Gemma's `| trim`).
_AS_GIVEN: tuple[Callable[[str], str], ...] = (lambda c: c, str.strip)


def formatter(model, template: str):
    """llama-cpp-python's renderer of `template` (Jinja2, as Hugging Face renders chat templates)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    special = lambda t: model.token_text(t).decode("utf-8", "replace") if t >= 0 else ""  # noqa: E731
    return Jinja2ChatFormatter(template=template, eos_token=special(model.eos), bos_token=special(model.bos))


def chat_tokens(model, fmt, messages: Sequence[dict], tools: list[dict] | None = None) -> list[int]:
    """Tokens of `messages` rendered by `fmt` (a `formatter`), special tokens only where the template
    wrote them, ending with the assistant's generation prompt. `tools` is passed to the template
    as Hugging Face templates take it (their text, like the template's, is read for special tokens)."""
    result = fmt(messages=list(messages), tools=tools)
    text = result.prompt
    # The renderer's contract is that the template writes BOS itself (`{{ bos_token }}`).
    head = [model.bos] if not result.added_special and model.add_bos else []
    slots = [i for i, m in enumerate(messages) if isinstance(m.get("content"), str)]
    contents = [messages[i]["content"] for i in slots]
    nonce = secrets.token_hex(8)
    marks = [f"lsx{nonce}m{n}x" for n in range(len(slots))]
    marked = [dict(m) for m in messages]
    for i, mark in zip(slots, marks):
        marked[i]["content"] = mark
    try:
        pieces = _cut(fmt(messages=marked, tools=tools).prompt, marks)
    except Exception:  # a template that looks into contents may refuse a placeholder: read plainly
        pieces = None
    if pieces is not None:
        for shown in _AS_GIVEN:
            given = [shown(c) for c in contents]
            if _join(pieces, given) == text:
                return head + _literal(model, pieces, given)
    if any(_reads_special(model, c) for c in contents):
        raise EngineError(
            f"a message holds special-token text (such as a chat turn marker), and {model.name}'s chat "
            "template changes message text in a way that keeps it from being read literally; remove it")
    return head + model.tokenize(text, add_special=False, parse_special=True)


def _cut(rendered: str, marks: list[str]) -> list[str] | None:
    """The template's pieces around the placeholders, or None unless each occurs once, in order."""
    pieces, rest = [], rendered
    for mark in marks:
        if rendered.count(mark) != 1 or mark not in rest:
            return None
        before, rest = rest.split(mark)
        pieces.append(before)
    return [*pieces, rest]


def _join(pieces: list[str], contents: list[str]) -> str:
    return "".join(p + c for p, c in zip(pieces, [*contents, ""]))


def _reads_special(model, text: str) -> bool:
    return model.tokenize(text, add_special=False, parse_special=True) != model.tokenize(text, add_special=False)


def _literal(model, pieces: list[str], contents: list[str]) -> list[int]:
    """What llama.cpp's tokenizer makes of the joined text with special tokens parsed, except that
    none is looked for inside a content.

    llama.cpp cuts the text at special tokens and tokenizes each run of text between them on its
    own (SentencePiece puts a space before each); here the runs are the same, a content joined with
    the template text around it up to the nearest special token, so honest input gives the tokens
    the whole string gives. (Tokenizing a content on its own would not: BPE merges and leading
    spaces change at its edges.) The template's special tokens are found by llama.cpp itself, in
    each piece; only a special-token text across a content's edge is no longer read, the point."""
    ids: list[int] = []
    run: list[str] = []
    strip_next = False  # the last special token takes the whitespace after it (RSTRIP)

    def add(text: str) -> None:
        nonlocal strip_next
        if strip_next:
            text = text.lstrip(_SPACE)
            strip_next = not text
        run.append(text)

    for piece, content in zip(pieces, [*contents, None]):
        at = 0
        for token in model.tokenize(piece, add_special=False, parse_special=True):
            attr = model.token_attr(token)
            if not attr & _SPECIAL:
                continue
            marker = model.token_text(token).decode("utf-8", "replace")
            found = piece.find(marker, at)
            if found < 0:  # not cut out of the text by the special-token pass: leave it to the run
                continue
            add(piece[at:found])
            text = "".join(run)
            if attr & _LSTRIP:
                text = text.rstrip(_SPACE)
            if text:
                ids += model.tokenize(text, add_special=False, parse_special=False)
            run.clear()
            ids.append(token)
            strip_next = bool(attr & _RSTRIP)
            at = found + len(marker)
        add(piece[at:])
        if content is not None:
            add(content)
    text = "".join(run)
    if text:
        ids += model.tokenize(text, add_special=False, parse_special=False)
    return ids
