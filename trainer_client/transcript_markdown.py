"""A transcript (chat messages as the trainer and `coding-train eval` keep them) as Markdown a person
reads: each turn under its role, tool calls with their arguments, tool answers as code blocks."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

FENCE = "~~~~"
"""Code fences of tildes: a model's output full of backticks cannot close them."""


def transcript_markdown(title: str, facts: dict[str, Any], messages: Sequence[dict[str, Any]]) -> str:
    """`title`, a line of `facts` (reward, turns, ...), then every message in order."""
    lines = [f"# {title}", "", " · ".join(f"{key}: {value}" for key, value in facts.items()), ""]
    for message in messages:
        lines += _message(message)
    return "\n".join(lines) + "\n"


def _message(message: dict[str, Any]) -> list[str]:
    role = message.get("role", "?")
    name = f" ({message['name']})" if message.get("name") else ""
    lines = [f"## {role}{name}", ""]
    content = _text(message.get("content"))
    if content:
        lines += [FENCE, content, FENCE, ""] if role == "tool" else [content, ""]
    for call in message.get("tool_calls") or ():
        function = call.get("function", call)
        arguments = function.get("arguments")
        shown = arguments if isinstance(arguments, str) else json.dumps(arguments, indent=1, ensure_ascii=False)
        lines += [f"**call** `{function.get('name', '?')}`", "", FENCE + "json", shown, FENCE, ""]
    return lines


def _text(content: Any) -> str:
    """Message content as text: a string as it is, a list of parts joined by their text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    return "\n".join(str(part.get("text", part)) if isinstance(part, dict) else str(part) for part in content).strip()
