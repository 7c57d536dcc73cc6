"""The two console scripts, as installed, with every subcommand their packages mount."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("script", "subcommands"),
    [("coding-env", ["serve", "build-image", "sandbox", "tasks"]), ("coding-train", ["train", "ingest", "replay", "demos", "sft", "eval", "plot", "serve-model"])],
)
def test_every_subcommand_is_mounted(script: str, subcommands: list[str]) -> None:
    for subcommand in subcommands:
        result = run(script, subcommand, "--help")
        assert result.returncode == 0, result.stderr


def test_unknown_subcommand_is_a_usage_error() -> None:
    result = run("coding-env", "no-such-command")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


@pytest.mark.docker
def test_build_image_if_missing_and_reap_run_against_the_engine() -> None:
    built = run("coding-env", "build-image", "--if-missing")
    assert built.returncode == 0, built.stderr
    assert "coding-env-sandbox" in built.stdout
    reaped = run("coding-env", "sandbox", "reap")
    assert reaped.returncode == 0, reaped.stderr


def test_tasks_list_names_builtin_tasks() -> None:
    listed = run("coding-env", "tasks", "list")
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith("builtin/") for line in listed.stdout.splitlines())
