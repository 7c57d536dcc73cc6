"""The supervisor's own command line, as `bootstrap_argv` writes it, parsed without argparse
(whose import cost every cold start): anything else is refused with its usage, before the
supervisor reads a byte of its channel. The bootstrap runs the host's compilation of the supervisor
where the sandbox's Python reads it, and compiles the source elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.resources import files
from importlib.util import MAGIC_NUMBER
from pathlib import Path

import pytest

from sandbox.channel import reply_mac
from sandbox.runtime import PROTOCOL_VERSION
from sandbox.supervisor import CODE, SOURCE, bootstrap_argv

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


@pytest.mark.parametrize("same_python", [True, False], ids=["host-code", "source"])
def test_the_bootstrap_runs_the_hosts_code_on_the_same_python_and_the_source_on_another(same_python: bool, tmp_path: Path) -> None:
    # On another Python (another magic number) the code sent is not even read as code: garbage there proves it.
    code = CODE if same_python else b"\0not code" * 100
    argv = bootstrap_argv(str(tmp_path), python=sys.executable)
    argv[argv.index(str(len(CODE)))] = str(len(code))
    if not same_python:
        argv[argv.index(MAGIC_NUMBER.hex())] = "00000000"
    key = b"k" * 16
    ping = b'{"id": 1, "op": "ping"}\n'
    result = subprocess.run(argv, input=SOURCE + code + key.hex().encode() + b"\n" + ping, capture_output=True, timeout=30)
    mac, _, body = result.stdout.partition(b" ")
    assert json.loads(body) == {"id": 1, "ok": True, "protocol": PROTOCOL_VERSION, "pid": json.loads(body)["pid"]}
    assert mac == reply_mac(key, body.rstrip(b"\n"))
