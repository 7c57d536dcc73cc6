"""Small real projects as sdists, built locally: feature-deletion and bug-injection generation without PyPI
(their tests, and the tiny runs of the benchmarks that generate)."""

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


RANGES_SOURCE = '''"""Ranges."""


def clamp(x, low, high):
    """x limited to [low, high]."""
    if x < low:
        return low
    if x > high:
        return high
    return x


def window(values, start, size=2):
    return [values[index] for index in range(start, start + size)]


def is_empty(values):
    return len(values) == 0 and True
'''

# Two tests per behaviour, so that a bug breaks at least two; `test_other.py` breaks for none of clamp's bugs.
RANGES = {
    "ranges/__init__.py": RANGES_SOURCE,
    "tests/test_clamp.py": (
        "from ranges import clamp\n\n\ndef test_below():\n    assert clamp(-5, 0, 10) == 0\n\n\n"
        "def test_above():\n    assert clamp(50, 0, 10) == 10\n\n\ndef test_inside():\n    assert clamp(5, 0, 10) == 5\n\n\n"
        "def test_edges():\n    assert clamp(0, 0, 10) == 0 and clamp(10, 0, 10) == 10\n"
    ),
    "tests/test_window.py": (
        "from ranges import window\n\n\ndef test_window():\n    assert window([1, 2, 3, 4], 1) == [2, 3]\n\n\n"
        "def test_window_size():\n    assert window([1, 2, 3, 4], 0, 3) == [1, 2, 3]\n"
    ),
    "tests/test_other.py": "from ranges import is_empty\n\n\ndef test_empty():\n    assert is_empty([])\n\n\ndef test_full():\n    assert not is_empty([1])\n",
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
