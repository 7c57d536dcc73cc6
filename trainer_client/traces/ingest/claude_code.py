"""Claude Code session transcripts (`~/.claude/projects/<project>/<session>.jsonl`).

Each line is a record with a `type`. `user` and `assistant` records carry an Anthropic
message; Claude Code writes every content block of one model response as its own
`assistant` record, all sharing `message.id`, so a turn is the union of those records.
Records link through `uuid`/`parentUuid`; the history of a turn is the chain of its
ancestors, which keeps rewound branches and pre-compaction context out of it.
Subagent (`isSidechain`) records and `agent-*.jsonl` / `subagents/` files are other
conversations and are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer_client.records import TraceState
from trainer_client.traces.ingest.base import TraceIngester
from trainer_client.traces.messages import (
    ToolSchemaCollector,
    assistant_message,
    flatten_text,
    tool_call,
    tool_message,
    with_system_prompt,
)

NON_MESSAGE_TYPES = frozenset({"summary", "system", "file-history-snapshot", "queue-operation", "progress"})
"""Record types known to carry no model turn: titles, notices, file backups, queue and hook events."""

SYNTHETIC_MODEL = "<synthetic>"
"""`message.model` of assistant records Claude Code writes itself (interrupts, API errors)."""


class ClaudeCodeIngester(TraceIngester):
    """One state per assistant turn of a main session."""

    format = "claude_code"

    def _wants(self, file: Path) -> bool:
        if file.name.startswith("agent-") or "subagents" in file.parts:
            self.ignore("subagent_file")
            return False
        return True

    def _states_in_file(self, file: Path) -> Iterator[TraceState]:
        by_uuid: dict[str, dict[str, Any]] = {}
        turns: dict[str, list[dict[str, Any]]] = {}
        for record in self._json_lines(file):
            kind = record.get("type")
            if kind in ("user", "assistant"):
                if record.get("isSidechain"):
                    self.ignore("sidechain")
                    continue
                if not isinstance(record.get("message"), dict) or not record.get("uuid"):
                    self.skip(f"{file}: {kind} record without message or uuid")
                    continue
                if kind == "assistant" and _is_synthetic(record):
                    self.ignore("synthetic")
                elif kind == "assistant":
                    turns.setdefault(_message_id(record), []).append(record)
            elif kind in NON_MESSAGE_TYPES:
                self.ignore(str(kind))
            else:
                self.unknown(str(kind))
            # Every record with a uuid may sit on the parent chain (system notices do).
            if record.get("uuid"):
                by_uuid[record["uuid"]] = record

        tools = ToolSchemaCollector()
        for records in turns.values():
            for block in _blocks(records):
                if block.get("type") == "tool_use":
                    tools.observe(str(block.get("name")), block.get("input"))
        schemas = tools.schemas()

        for index, (message_id, records) in enumerate(turns.items()):
            first = records[0]
            session = first.get("sessionId") or file.stem
            message = first["message"]
            yield self._state(
                session,
                message_id,
                _conversation(_ancestors(first, by_uuid)),
                _Turn(records).message(with_reasoning=True),
                message.get("model"),
                {
                    "trace_id": session,
                    "file": str(file),
                    "turn": index,
                    "cwd": first.get("cwd"),
                    "git_branch": first.get("gitBranch"),
                    "claude_code_version": first.get("version"),
                    "stop_reason": records[-1]["message"].get("stop_reason"),
                    "usage": records[-1]["message"].get("usage"),
                    "tools": schemas,
                },
            )


def _message_id(record: dict[str, Any]) -> str:
    return str(record["message"].get("id") or record["uuid"])


def _is_synthetic(record: dict[str, Any]) -> bool:
    return record["message"].get("model") == SYNTHETIC_MODEL


def _blocks(records: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for record in records:
        content = record["message"].get("content")
        if isinstance(content, str):
            yield {"type": "text", "text": content}
        elif isinstance(content, list):
            yield from (block for block in content if isinstance(block, dict))


def _ancestors(record: dict[str, Any], by_uuid: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Records before `record` on its parent chain, oldest first."""
    chain: list[dict[str, Any]] = []
    seen: set[str] = set()
    parent = record.get("parentUuid")
    while parent and parent in by_uuid and parent not in seen:
        seen.add(parent)
        chain.append(by_uuid[parent])
        parent = by_uuid[parent].get("parentUuid")
    chain.reverse()
    return chain


class _Turn:
    """Content blocks of one model response, gathered from its records."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = list(records)

    def message(self, with_reasoning: bool) -> dict[str, Any]:
        texts, thoughts, calls = [], [], []
        for block in _blocks(self.records):
            kind = block.get("type")
            if kind == "text" and block.get("text"):
                texts.append(block["text"])
            elif kind == "thinking" and block.get("thinking"):
                thoughts.append(block["thinking"])
            elif kind == "tool_use":
                calls.append(tool_call(str(block.get("id")), str(block.get("name")), block.get("input") or {}))
        reasoning = "\n\n".join(thoughts) if with_reasoning else None
        return assistant_message("\n\n".join(texts), calls, reasoning)


def _conversation(chain: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages for a chain of records, thinking stripped.

    Blocks of one response may be interleaved with the results of its earlier tool calls;
    they are merged into the response's single assistant message, which precedes every
    tool message answering it.
    """
    items: list[dict[str, Any] | _Turn] = []
    turns: dict[str, _Turn] = {}
    for record in chain:
        kind = record.get("type")
        if kind == "assistant" and not _is_synthetic(record):
            message_id = _message_id(record)
            if message_id in turns:
                turns[message_id].records.append(record)
            else:
                turns[message_id] = _Turn([record])
                items.append(turns[message_id])
        elif kind == "user":
            items.extend(_user_messages(record["message"].get("content")))
    return with_system_prompt(
        [item.message(with_reasoning=False) if isinstance(item, _Turn) else item for item in items]
    )


def _user_messages(content: Any) -> list[dict[str, Any]]:
    """A user record as tool results (first, answering the previous turn) then plain text."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results, texts = [], []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_result":
            output = block.get("content")
            text = flatten_text(output) if not isinstance(output, dict) else json.dumps(output)
            results.append(tool_message(str(block.get("tool_use_id")), text))
        else:
            texts.append(block)
    text = flatten_text(texts)
    return results + ([{"role": "user", "content": text}] if text else [])
