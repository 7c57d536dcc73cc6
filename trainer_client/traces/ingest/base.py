"""The interface every trace format implements: files in, a lazy stream of `TraceState` out."""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from trainer_client.records import TraceState

log = logging.getLogger(__name__)


class IngestCounts(BaseModel):
    """What one ingestion saw; printed by `ingest` and kept for reports."""

    files: int = 0
    """Trace files read."""

    records: int = 0
    """Records (lines, events, messages) read from those files."""

    states: int = 0
    """States yielded."""

    skipped: int = 0
    """Malformed or invalid records dropped (bad JSON, wrong shape)."""

    ignored: dict[str, int] = Field(default_factory=dict)
    """Well-formed records that carry no decision, by kind (e.g. `summary`, `sidechain`)."""

    unknown_types: dict[str, int] = Field(default_factory=dict)
    """Records of a type this ingester does not know, by type; tolerated, not fatal."""


class TraceIngester(ABC):
    """Reads one trace format. Each file is parsed whole, then its states are yielded one by one.

    A trace is small next to the states it expands into (each state repeats its history), so
    holding one trace is cheap while the stream over many traces stays lazy.
    """

    format: ClassVar[str]
    """Name on the command line (`ingest --format NAME`) and in `TraceState.source`."""

    file_suffixes: ClassVar[tuple[str, ...]] = (".jsonl",)
    """Files picked up when the path given is a directory."""

    def __init__(self) -> None:
        self.counts = IngestCounts()

    def iter_states(self, path: Path) -> Iterator[TraceState]:
        """States of every trace under `path` (a file, or a directory searched recursively)."""
        for file in self._files(path):
            self.counts.files += 1
            for state in self._states_in_file(file):
                self.counts.states += 1
                yield state

    def _files(self, path: Path) -> Iterator[Path]:
        if not path.exists():
            raise FileNotFoundError(f"no trace file or directory at {path}")
        if path.is_file():
            yield path
            return
        for file in sorted(path.rglob("*")):
            if file.is_file() and file.suffix in self.file_suffixes and self._wants(file):
                yield file

    def _wants(self, file: Path) -> bool:
        """Whether a file found in a directory is a trace of this format."""
        return True

    @abstractmethod
    def _states_in_file(self, file: Path) -> Iterator[TraceState]:
        """States of one trace file."""

    def _json_lines(self, file: Path) -> Iterator[dict[str, Any]]:
        """JSON objects of a JSONL file; a malformed line is counted and skipped, never fatal."""
        with file.open(encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                self.counts.records += 1
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    self.skip(f"{file}:{number}: {error}")
                    continue
                if not isinstance(record, dict):
                    self.skip(f"{file}:{number}: not a JSON object")
                    continue
                yield record

    def _state(
        self,
        trace_id: str,
        turn: object,
        messages: list[dict[str, Any]],
        action: dict[str, Any],
        model: str | None,
        meta: dict[str, Any],
    ) -> TraceState:
        """A state of this format, keyed `format:trace:turn` (replay's cache and resume key on it)."""
        return TraceState(
            state_id=f"{self.format}:{trace_id}:{turn}",
            messages=messages,
            student_action=action,
            source=self.format,
            source_model=model,
            meta=meta,
        )

    def skip(self, why: str) -> None:
        self.counts.skipped += 1
        log.debug("skipped record: %s", why)

    def ignore(self, kind: str) -> None:
        self.counts.ignored[kind] = self.counts.ignored.get(kind, 0) + 1

    def unknown(self, record_type: str) -> None:
        self.counts.unknown_types[record_type] = self.counts.unknown_types.get(record_type, 0) + 1
