"""Finished episodes, appended as `EpisodeRecord` JSON lines for the trainer to ingest."""

from __future__ import annotations

import threading
from pathlib import Path

from env_server.models import EpisodeRecord

EPISODES_FILE = "episodes.jsonl"


class EpisodeLog:
    """Appends one line per finished episode to `<directory>/episodes.jsonl`; safe across threads."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / EPISODES_FILE
        self._lock = threading.Lock()

    def append(self, record: EpisodeRecord) -> None:
        line = record.model_dump_json() + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(line)
