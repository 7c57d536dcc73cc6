"""`coding-train serve-model` run as a test's model server: started, its URL read from the line it
prints once listening, stopped when the test is done."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def serving(argv: list[str], model: str) -> Iterator[str]:
    """Runs the `serve-model` command `argv` (its `--port 0` picks a free port); yields the URL it prints."""
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output = []
        for line in server.stdout:  # the model loads, then the port is bound and the line printed
            output.append(line)
            if line.startswith(f"serving {model} at "):
                yield line.split(" at ")[1].split()[0]
                break
        else:
            pytest.fail(f"serve-model exited before serving:\n{''.join(output)}")
    finally:
        server.terminate()
        server.wait(timeout=60)
