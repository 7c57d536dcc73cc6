"""JSONL files of pydantic records (states, pairs): read lazily, bad lines reported, not fatal."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


def read_models(
    path: Path, model: type[Model], on_invalid: Callable[[int, str], None] | None = None
) -> Iterator[Model]:
    """Records of `path`, one per non-blank line; `on_invalid(line_number, why)` hears of bad ones."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield model.model_validate_json(line)
            except ValidationError as error:
                if on_invalid is not None:
                    on_invalid(number, str(error).splitlines()[0])


def write_models(path: Path, records: Iterable[BaseModel]) -> int:
    """Write records one per line (replacing `path`); returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record.model_dump(mode="json"), ensure_ascii=False) + "\n")
            count += 1
    return count
