"""`pip install 'coding-env[verifiers]'`, the one-step install docs/integrations.md gives, checked
without a network, in this environment (which holds verifiers 0.4.0 beside the service's mcp 1.x,
decision 100):

- pip's own resolver, offline, finds the project's requirements, the `[verifiers]` extra and every
  requirement of verifiers 0.4.0 but its mcp pin satisfied together by what is installed here: so
  the documented install has a solution apart from mcp, whose pin is still the one decision 100
  handles. It fails when a pin of the project or of the extra conflicts with one of verifiers', or
  when verifiers gains a requirement the Makefile's install line does not bring.
- `coding_env_verifiers` loads, and builds its environment, without what that install does not
  bring (torch, TRL, the service's requirements: the wheel carries its code, not them).
- The wheel carries `coding_env_verifiers` and the model server.

Not checked here (by hand, docs/integrations.md): mcp 2.0.0's own requirements, and how long pip
takes against an index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
MCP_PIN = "==2.0.0"
"""verifiers 0.4.0's mcp requirement: what decision 100 installs around."""

if not os.environ.get("CI"):
    pytest.importorskip("verifiers", reason="needs verifiers 0.4.0 (the Makefile installs it)")


def verifiers_requirements() -> list[Requirement]:
    """verifiers' own requirements, from its installed metadata."""
    return [Requirement(line) for line in metadata.requires("verifiers") or []]


def installed_closure(name: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """The distributions `name[extras]` requires, transitively, as the installed metadata says."""
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [(canonicalize_name(name), extras)]
    while pending:
        item = pending.pop()
        if item in seen:
            continue
        seen.add(item)
        try:
            lines = metadata.requires(item[0]) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: the resolver test reports it
        for requirement in map(Requirement, lines):
            active = [{"extra": extra} for extra in item[1] | {""}]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in active):
                pending.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return {dist for dist, _ in seen}


def test_pip_resolves_the_extra_with_the_project_and_verifiers_offline(tmp_path: Path) -> None:
    extra = [Requirement(line) for line in PROJECT["optional-dependencies"]["verifiers"]]
    [pin] = [r for r in extra if r.name == "verifiers"]
    assert pin.specifier.contains(metadata.version("verifiers"))
    own = verifiers_requirements()
    [mcp] = [r for r in own if r.name == "mcp"]
    assert str(mcp.specifier) == MCP_PIN, "verifiers' mcp pin changed: re-check decision 100 and the Makefile"
    requirements = [*PROJECT["dependencies"], *(str(r) for r in extra if r is not pin), *(str(r) for r in own if r is not mcp)]
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--no-index", "--quiet", "--report", str(report)]
    # No configuration file either: a find-links folder or an index named there must not take part.
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    resolved = subprocess.run([*command, *requirements], capture_output=True, text=True, timeout=300, env=env, check=False)
    assert resolved.returncode == 0, resolved.stderr
    assert json.loads(report.read_text())["install"] == []  # all of it satisfied by what is installed


NOT_INSTALLED = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

BLOCKED = set(sys.argv[1:])
sys.meta_path.insert(0, NotInstalled())
import coding_env_verifiers

coding_env_verifiers.load_environment(["builtin/fizzbuzz"], "http://127.0.0.1:8000")
"""
"""Imports `coding_env_verifiers` and builds its environment as if the modules named on the command
line were not installed: a guarded optional import falls back, a needed one fails."""


def test_the_module_needs_nothing_the_extra_does_not_bring() -> None:
    brought = installed_closure("coding-env", frozenset({"verifiers"}))
    assert {"verifiers", "websockets", "openai"} <= brought
    # What this environment holds for the service and the trainer that a [verifiers] one lacks.
    lacking = installed_closure("coding-env", frozenset({"server", "train", "tasks"})) - brought
    assert {"torch", "trl", "openenv", "docker", "fastapi"} <= lacking
    blocked = [
        module
        for module, owners in metadata.packages_distributions().items()
        if {canonicalize_name(owner) for owner in owners} <= lacking
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", NOT_INSTALLED, *blocked]
    loaded = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert loaded.returncode == 0, loaded.stderr[-3000:]


def test_the_wheel_carries_the_verifiers_module_and_the_model_server(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("env_server", "sandbox", "trainer_client", "coding_env_verifiers"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "wheel"), str(source)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = (tmp_path / "wheel").glob("*.whl")
    assert {"coding_env_verifiers/__init__.py", "trainer_client/model_server.py"} <= set(zipfile.ZipFile(wheel).namelist())
