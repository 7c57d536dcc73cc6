"""Ended episodes: the most recent kept in memory for the episode viewer and `GET /episodes`, and,
when a trajectory directory is set, every one appended as an `EpisodeRecord` JSON line for the
trainer to ingest."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from env_server.models import EpisodeRecord

EPISODES_FILE = "episodes.jsonl"


class EpisodeLog:
    """The last `keep` ended episodes by id, newest last, and `<directory>/episodes.jsonl` when a
    directory is given; safe across threads."""

    def __init__(self, directory: Path | None, keep: int) -> None:
        self.path: Path | None = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self.path = directory / EPISODES_FILE
        self._keep = keep
        self._recent: OrderedDict[str, EpisodeRecord] = OrderedDict()
        self._lock = threading.Lock()

    def append(self, record: EpisodeRecord) -> None:
        line = record.model_dump_json() + "\n" if self.path is not None else ""
        with self._lock:
            if self._keep > 0:
                self._recent[record.episode_id] = record
                self._recent.move_to_end(record.episode_id)
                while len(self._recent) > self._keep:
                    self._recent.popitem(last=False)
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as out:
                    out.write(line)

    def recent(self) -> list[EpisodeRecord]:
        """The kept episodes, newest first."""
        with self._lock:
            return list(reversed(self._recent.values()))

    def get(self, episode_id: str) -> EpisodeRecord | None:
        with self._lock:
            return self._recent.get(episode_id)
