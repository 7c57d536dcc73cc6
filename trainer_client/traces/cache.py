"""Teacher answers on disk, so that a rerun or a resumed run pays nothing for them."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from trainer_client.traces.messages import canonical_json


class ReplyCache:
    """One JSON file per answer, named by a hash of the teacher and the exact request.

    Files are written to a temporary name and renamed into place, so a run killed mid-write
    leaves either the whole answer or none of it.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @staticmethod
    def key(teacher_name: str, body: dict[str, Any]) -> str:
        """Stable over runs and machines: canonical JSON of the teacher name and request body."""
        return hashlib.sha256(canonical_json({"teacher": teacher_name, "request": body}).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                json.dump(entry, file, ensure_ascii=False)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
