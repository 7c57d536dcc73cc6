"""A small real project as an sdist, built locally: feature-deletion generation without PyPI (its tests,
and the tiny runs of the benchmarks that generate)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

MINISTATS = {
    "ministats/__init__.py": '''"""Small statistics helpers."""


def mean(values):
    """Arithmetic mean."""
    total = sum(values)
    count = len(values)
    return total / count


def span(values):
    """Largest minus smallest."""
    largest = max(values)
    smallest = min(values)
    return largest - smallest


def clamp(x, low, high):
    """x limited to [low, high]."""
    if x < low:
        return low
    return min(x, high)
''',
    "tests/test_mean.py": "from ministats import mean\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n",
    "tests/test_span.py": "from ministats import span\n\n\ndef test_span():\n    assert span([4, 1, 9]) == 8\n",
    "tests/test_clamp.py": "from ministats import clamp\n\n\ndef test_clamp():\n    assert clamp(5, 0, 3) == 3 and clamp(-1, 0, 3) == 0\n",
}


def local_sdist(directory: Path, name: str = "ministats-0.1", files: dict[str, str] = MINISTATS) -> Path:
    """A real sdist archive of `files`."""
    path = directory / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for relative, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}/{relative}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path
