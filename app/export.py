"""A conversation as a file: Markdown to read and share, JSON to keep everything.

Markdown holds the path that is shown, each reply's thinking and each attachment's text folded in
`<details>` blocks, with a line of facts per reply; JSON holds every message of the tree (all
versions and branches) with its parent, thinking, facts, figures and attachments, and the path shown.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.history import History, Message

FORMAT, VERSION = "colibri-conversation", 2
SHOWN = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "seed")  # in this order


def facts_line(m: Message) -> str:
    """One line: the model, the thinking switch, the sampling that wrote a reply, its figures."""
    f, s = m.facts, m.stats
    parts = [f["model"]] if f.get("model") else []
    if f.get("thinking") is not None:
        parts.append("thinking on" if f["thinking"] else "thinking off")
    sampling = f.get("sampling", {})
    parts += [f"{k} {sampling[k]}" for k in SHOWN if sampling.get(k) is not None]
    if s.get("generated_tokens"):
        parts.append(f"{s['generated_tokens']} tokens at {s.get('decode_tok_s', 0):.1f} tok/s")
    if s.get("thinking_tokens"):
        parts.append(f"{s['thinking_tokens']} of them thinking")
    if s.get("finish_reason") in ("length", "context", "cancelled"):
        parts.append({"length": "hit the token limit", "context": "the context was full",
                      "cancelled": "stopped"}[s["finish_reason"]])
    elif s.get("finish_reason") == "interrupted":
        parts.append("interrupted: the app closed while it was written")
    return " · ".join(str(p) for p in parts)


def to_markdown(history: History, cid: int) -> str:
    conv = history.conversation(cid)
    parts = [f"# {conv.title}\n"]
    if conv.system_prompt:
        parts.append(f"**System:** {conv.system_prompt}\n")
    for m in history.messages(cid):
        head = "User" if m.role == "user" else "Assistant"
        if m.versions > 1:
            head += f" (version {m.version} of {m.versions})"
        body = m.content
        if m.reasoning:
            tokens = m.stats.get("thinking_tokens")
            summary = f"Thinking ({tokens} tokens)" if tokens else "Thinking"
            body = f"<details><summary>{summary}</summary>\n\n{m.reasoning}\n\n</details>\n\n{body}"
        body += "".join(_attachment_md(a) for a in m.attachments)
        line = facts_line(m) if m.role == "assistant" else ""
        parts.append(f"## {head}\n\n{body}\n" + (f"\n*{line}*\n" if line else ""))
    return "\n".join(parts)


def _attachment_md(a: dict[str, Any]) -> str:
    """An attached file: its name, kind and tokens, its text folded (fenced, so Markdown in it stays text)."""
    kind = {"pdf": "PDF", "markdown": "Markdown"}.get(a["kind"], a["kind"])
    tokens = f", {a['tokens']:,} tokens" if a.get("tokens") is not None else ""
    fence = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", a["text"])), default=0))
    return (f"\n\n<details><summary>Attached: {a['name']} ({kind}{tokens})</summary>\n\n{fence}\n{a['text']}\n{fence}"
            f"\n\n</details>")


def _message_doc(m: Message) -> dict[str, Any]:
    return {k: v for k, v in asdict(m).items() if k not in ("conversation_id", "version", "versions")}


def to_json(history: History, cid: int) -> str:
    """Every message (all versions and branches, oldest first) with its `parent_id`; `path` lists
    the ids of the messages shown, first to last."""
    conv = history.conversation(cid)
    by_id, _ = history.tree(cid)
    history.attach_files(cid, list(by_id.values()))
    doc = {"format": FORMAT, "version": VERSION, **asdict(conv),
           "path": [m.id for m in history.messages(cid)],
           "messages": [_message_doc(m) for m in by_id.values()]}
    return json.dumps(doc, indent=2, ensure_ascii=False)
