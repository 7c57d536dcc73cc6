"""The supervisor's own command line, as `bootstrap_argv` writes it, parsed without argparse
(whose import cost every cold start): anything else is refused with its usage, before the
supervisor reads a byte of its channel."""

from __future__ import annotations

import subprocess
import sys
from importlib.resources import files

import pytest

SUPERVISOR = str(files("sandbox.supervisor").joinpath("supervisor.py"))


@pytest.mark.parametrize(
    "argv",
    [[], ["--workdir"], ["--run-as", "1000:1000"], ["--workdir", "/tmp", "--bogus", "x"], ["/tmp"]],
    ids=["nothing", "no-value", "no-workdir", "unknown-option", "positional"],
)
def test_a_command_line_bootstrap_argv_does_not_write_is_refused(argv: list[str]) -> None:
    result = subprocess.run([sys.executable, "-I", "-S", "-B", SUPERVISOR, *argv], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert result.returncode == 1
    assert b"usage: supervisor --workdir DIR [--run-as UID:GID]" in result.stderr
