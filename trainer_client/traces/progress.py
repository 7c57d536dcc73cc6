"""The durable state of a replay run: its pairs file and an append-only progress log.

The progress log (`<out>.progress.jsonl`) holds two kinds of lines:
`{"kind": "call", ...}` for every request that cost money, and `{"kind": "state", ...}` for
every state finished. A state is finished after its pair (if any) is in the pairs file. A
run killed at any point resumes by skipping finished states, counting the money already
spent against the budget, and asking the reply cache for answers paid but not yet used.
A line cut short by the kill is dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from trainer_client.records import PreferencePair


def progress_path(out: Path) -> Path:
    return out.with_name(out.name + ".progress.jsonl")


def report_path(out: Path) -> Path:
    return out.with_name(out.name + ".report.json")


class RunProgress:
    """Appends pairs and progress lines, flushed line by line so a kill loses at most one."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.log = progress_path(out)
        self.finished: set[str] = set()
        """State ids finished by earlier runs."""
        self.spent_usd = 0.0
        """Money earlier runs spent."""
        self._pairs: IO[str] | None = None
        self._progress: IO[str] | None = None

    def __enter__(self) -> RunProgress:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        for line in _complete_lines(self.log):
            if line.get("kind") == "call":
                self.spent_usd += float(line.get("cost_usd", 0.0))
            elif line.get("kind") == "state":
                self.finished.add(str(line.get("state_id")))
        # A pair written just before a kill whose state line never made it is still finished.
        self.finished.update(str(line.get("state_id")) for line in _complete_lines(self.out))
        self._pairs = self.out.open("a", encoding="utf-8")
        self._progress = self.log.open("a", encoding="utf-8")
        return self

    def __exit__(self, *exc_info: object) -> None:
        for file in (self._pairs, self._progress):
            if file is not None:
                file.close()

    def call_paid(self, state_id: str, teacher: str, cost_usd: float) -> None:
        self._append(self._progress, {"kind": "call", "state_id": state_id, "teacher": teacher, "cost_usd": cost_usd})

    def state_finished(self, state_id: str, status: str, pair: PreferencePair | None) -> None:
        if pair is not None:
            self._append(self._pairs, pair.model_dump(mode="json"))
        self._append(self._progress, {"kind": "state", "state_id": state_id, "status": status})

    @staticmethod
    def _append(file: IO[str] | None, line: dict[str, Any]) -> None:
        assert file is not None, "RunProgress used outside its with-block"
        file.write(json.dumps(line, ensure_ascii=False) + "\n")
        file.flush()


def _complete_lines(path: Path) -> list[dict[str, Any]]:
    """JSON lines of `path`, after cutting off a trailing partial line left by a kill."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    lines = []
    for raw in data.decode("utf-8", errors="replace").splitlines():
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict):
            lines.append(line)
    return lines
