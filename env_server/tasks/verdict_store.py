"""The validity gate's host-side verdicts, remembered across processes.

A host-side verdict (`validation.host_validity`) is a pure function of the task and of the gate's
code, yet computing it for every task of the generated suites cost each process that lists or
serves them about 6 s on a 2-core machine (1,900 codeio and warmup tasks): every `coding-env tasks`
command, every service's first reset onto such a suite, every test process. The store keeps the
verdicts in one JSON-lines file per version of the gate's code (a digest of the sources it runs),
each line keyed by a digest of the task, so a changed task or a changed gate is simply a miss and
nothing is ever invalidated by hand.

Lines are appended with one `write` on a file opened for appending, so processes that share the
store never interleave halves of lines; a line that does not parse (a process killed mid-write) is
skipped.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path

from pydantic import ValidationError

import env_server.grading
import env_server.tasks
from env_server.models import TaskSpec
from env_server.tasks.validation import Validity

DIGEST_BYTES = 16


@cache
def gate_version() -> str:
    """Digest of the sources the gate's verdict can depend on: the task models, the task package
    (generators, baselines, the gate) and the grading package (call checks, typed values)."""
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    models = Path(env_server.__file__).parent / "models.py"
    packages = (Path(env_server.tasks.__file__).parent, Path(env_server.grading.__file__).parent)
    for source in [models, *sorted(path for package in packages for path in package.rglob("*.py"))]:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


def task_digest(task: TaskSpec) -> str:
    """Digest of everything the task says (its id included: a verdict names its task)."""
    return hashlib.blake2b(task.model_dump_json().encode(), digest_size=DIGEST_BYTES).hexdigest()


class VerdictStore:
    """Verdicts by task digest, read from `directory` once and appended to as they are computed."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / f"{gate_version()}.jsonl"
        self._lock = threading.Lock()
        self._verdicts: dict[str, Validity] | None = None

    def verdict(self, task: TaskSpec, compute: Callable[[TaskSpec], Validity]) -> Validity:
        """The stored verdict on `task`, or `compute(task)`, stored."""
        key = task_digest(task)
        with self._lock:
            known = self._loaded().get(key)
        if known is not None:
            return known
        verdict = compute(task)
        with self._lock:
            self._loaded()[key] = verdict
        self._append(key, verdict)
        return verdict

    def _loaded(self) -> dict[str, Validity]:
        if self._verdicts is None:
            self._verdicts = {}
            try:
                lines = self._path.read_bytes().splitlines()
            except OSError:
                lines = []
            for line in lines:
                key, _, body = line.partition(b" ")
                try:
                    self._verdicts[key.decode()] = Validity.model_validate_json(body)
                except (ValidationError, UnicodeDecodeError):
                    continue  # half a line from a process killed while writing
        return self._verdicts

    def _append(self, key: str, verdict: Validity) -> None:
        line = key.encode() + b" " + verdict.model_dump_json().encode() + b"\n"
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(descriptor, line)
            finally:
                os.close(descriptor)
        except OSError:
            pass  # a read-only home: the verdict is still kept for this process
