"""A stored conversation as Markdown (to read) and as JSON (to process), and the listing as JSON.

The JSON shape is stable: fields are only ever added, and `version` changes if one's meaning does.

    {"format": "localspec.conversation", "version": 1,
     "id": 3, "title": "...", "created": "2025-01-02T10:03:04+00:00", "updated": "...",
     "settings": {...}, "system": "..." | null,
     "messages": [{"role": "user" | "assistant", "content": "...", "partial": false,
                   "created": "...", "updated": "...", "stats": {...} | null}, ...]}

Times are ISO 8601 in UTC, to the second; `settings` and `stats` are what the chat recorded.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from .conversation import Conversation, Message, Summary

FORMAT = "localspec.conversation"
VERSION = 1


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def local_time(t: float) -> str:
    """For people: this machine's time zone, to the minute."""
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def to_dict(conv: Conversation) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "id": conv.id,
        "title": conv.title,
        "created": iso(conv.created),
        "updated": iso(conv.updated),
        "settings": conv.settings,
        "system": conv.system,
        "messages": [{"role": m.role, "content": m.content, "partial": m.partial, "created": iso(m.created),
                      "updated": iso(m.updated), "stats": m.stats} for m in conv.messages],
    }


def to_json(conv: Conversation) -> str:
    return json.dumps(to_dict(conv), ensure_ascii=False, indent=2) + "\n"


def summary_dict(s: Summary) -> dict:
    """A `localspec history --json` row."""
    return {"id": s.id, "title": s.title, "created": iso(s.created), "updated": iso(s.updated),
            "messages": s.n_messages, "partial": s.partial}


FINISH_WORDS = {"length": "max tokens", "stopped": "stopped", "context": "context full"}
"""How a reply that did not end on its own ended ("stop", the model's own end, says nothing)."""


def _number(stats: dict, key: str) -> float | None:   # hand-edited files: a wrong type is left out
    value = stats.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def stats_line(stats: dict | None) -> str:
    """The numbers of a reply, the one form the chat shows under a reply (live and resumed) and the
    Markdown export writes; keys the caller did not record are left out, unknown ones stay in the
    JSON only. Two speeds: decode only (what the chat's panel and `generate` report as tokens/s)
    and with the prefill (`tokens_per_second`: from sending to the last token)."""
    if not stats:
        return ""
    parts = []
    if isinstance(stats.get("n_tokens"), int):
        parts.append(f"{stats['n_tokens']} tokens")
    if stats.get("continued") is True:   # the numbers are those of the part that continued it
        parts[:1] = [f"continued: {parts[0]}" if parts else "continued"]
    if (alpha := _number(stats, "alpha")) is not None:
        parts.append(f"α {alpha:.3f}")
    per_pass = _number(stats, "tokens_per_pass")
    if per_pass is None:   # chats saved before the name was tokens_per_pass
        per_pass = _number(stats, "tokens_per_step")
    if per_pass is not None:
        parts.append(f"{per_pass:.2f} tokens/target pass")
    decode, wall = _number(stats, "decode_tokens_per_second"), _number(stats, "tokens_per_second")
    if decode is not None:
        parts.append(f"{decode:.1f} tokens/s decode" + ("" if wall is None else f" ({wall:.1f} with prefill)"))
    elif wall is not None:
        parts.append(f"{wall:.1f} tokens/s with prefill")
    trees, steps = stats.get("tree_steps"), stats.get("n_steps")
    if isinstance(trees, int) and trees > 0 and isinstance(steps, int):
        parts.append(f"tree {trees}/{steps} steps")
    for key in ("k", "drafter", "temperature"):
        if stats.get(key) is not None:
            parts.append(f"{key} {stats[key]}")
    if stats.get("finish") in FINISH_WORDS:
        parts.append(FINISH_WORDS[stats["finish"]])
    if isinstance(stats.get("n_prompt_tokens"), int):
        cached = f" ({stats['cached_tokens']} cached)" if isinstance(stats.get("cached_tokens"), int) else ""
        parts.append(f"prompt {stats['n_prompt_tokens']} tokens{cached}")
    return " · ".join(parts)


def _pair(settings: dict) -> str:
    names = [str(settings[k]).replace("\\", "/").rsplit("/", 1)[-1] for k in ("target", "draft") if settings.get(k)]
    return " + ".join(names)


def _reply_note(m: Message) -> str:
    notes = [stats_line(m.stats)] if m.role == "assistant" and m.stats else []
    if m.partial:
        notes.append("partial: stopped or cut off before it finished")
    return " · ".join(n for n in notes if n)


def to_markdown(conv: Conversation) -> str:
    head = [f"# {conv.title or f'Conversation {conv.id}'}", ""]
    about = [f"conversation {conv.id}", local_time(conv.created)]
    if _pair(conv.settings):
        about.append(_pair(conv.settings))
    head += [f"*{' · '.join(about)}*", ""]
    if conv.system:
        head += ["## system", "", conv.system, ""]
    body = []
    for m in conv.messages:
        body += [f"## {m.role}", "", m.content if m.content else "*(empty)*", ""]
        note = _reply_note(m)
        if note:
            body += [f"*{note}*", ""]
    return "\n".join(head + body).rstrip("\n") + "\n"
