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


def stats_line(stats: dict | None) -> str:
    """The numbers of a reply in the words `localspec generate` uses; keys the caller did not record
    are left out, and unknown ones stay in the JSON only."""
    if not stats:
        return ""
    parts = []
    if isinstance(stats.get("n_tokens"), int):
        parts.append(f"{stats['n_tokens']} tokens")
    if isinstance(stats.get("alpha"), (int, float)):
        parts.append(f"α {stats['alpha']:.3f}")
    if isinstance(stats.get("tokens_per_step"), (int, float)):
        parts.append(f"{stats['tokens_per_step']:.2f} tokens/target pass")
    if isinstance(stats.get("tokens_per_second"), (int, float)):
        parts.append(f"{stats['tokens_per_second']:.1f} tokens/s")
    for key in ("k", "drafter", "temperature"):
        if stats.get(key) is not None:
            parts.append(f"{key} {stats[key]}")
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
