"""`Sandbox.copy_workspace_to`: one sandbox's workspace into several others, on both backends,
through the targets' channels and through their inboxes (decision 012)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import ArchiveTooLarge, Sandbox, open_sandbox
from tests.sandbox.support import SPEC


@pytest.fixture
def inbox_root() -> Iterator[Path]:
    """A directory for inboxes that a local sandbox's unprivileged host uid can reach (pytest's
    own temporary directories are private to root)."""
    root = Path(tempfile.mkdtemp(prefix="inboxes-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


@pytest.fixture(params=["channel", "inbox"])
def delivery(request: pytest.FixtureRequest, inbox_root: Path) -> str | None:
    """The inbox root of the copy's sandboxes (None: the archive goes through the channels)."""
    return str(inbox_root) if request.param == "inbox" else None


@pytest.fixture
def source(backend: str, delivery: str | None) -> Iterator[Sandbox]:
    with open_sandbox(SPEC.model_copy(update={"inbox_root": delivery}), backend=backend) as opened:
        yield opened


@pytest.fixture
def targets(backend: str, delivery: str | None) -> Iterator[list[Sandbox]]:
    opened = [open_sandbox(SPEC.model_copy(update={"inbox_root": delivery}), backend=backend) for _ in range(2)]
    yield opened
    for target in opened:
        target.close()


TREE = "mkdir -p pkg/empty && printf 'x = 1\\n' > pkg/mod.py && printf '#!/bin/sh\\necho ran\\n' > run.sh && chmod 750 run.sh && ln -s pkg/mod.py link"


def test_the_workspace_arrives_whole_in_every_target(source: Sandbox, targets: list[Sandbox]) -> None:
    source.exec(f"{TREE} && echo only-here > /tmp/scratch")
    source.write_file("blob.bin", bytes(range(256)) * 4000)
    source.copy_workspace_to(targets)
    for target in targets:
        listing = target.exec("find . | sort; stat -c %a run.sh; readlink link; ./run.sh; ls /tmp").stdout.split()
        assert listing == [".", "./blob.bin", "./link", "./pkg", "./pkg/empty", "./pkg/mod.py", "./run.sh", "750", "pkg/mod.py", "ran"]
        assert target.read_file("blob.bin") == bytes(range(256)) * 4000
    # The copies are separate: a write in one reaches neither the source nor the other target.
    targets[0].write_file("pkg/mod.py", "x = 2\n")
    assert source.read_file("pkg/mod.py") == targets[1].read_file("pkg/mod.py") == b"x = 1\n"


def test_a_workspace_over_the_bound_is_refused_before_any_target_is_touched(source: Sandbox, targets: list[Sandbox]) -> None:
    source.write_file("big.bin", b"x" * 200_000)
    with pytest.raises(ArchiveTooLarge):
        source.copy_workspace_to(targets, max_bytes=100_000)
    assert all(target.exec("ls -A | wc -l").stdout == "0\n" for target in targets)


def test_an_unreadable_file_fails_the_copy_with_its_errno(source: Sandbox, targets: list[Sandbox]) -> None:
    source.exec("echo secret > locked && chmod 000 locked")
    with pytest.raises(PermissionError):
        source.copy_workspace_to(targets)


def test_a_dead_target_fails_the_copy_after_the_others_finished(source: Sandbox, targets: list[Sandbox]) -> None:
    source.write_file("a.txt", "a\n")
    targets[0].close()
    with pytest.raises(Exception, match="closed"):
        source.copy_workspace_to(targets)
    assert targets[1].read_file("a.txt") == b"a\n"


def test_inboxes_are_empty_after_a_copy_and_closed_ones_are_gone(backend: str, inbox_root: Path) -> None:
    spec = SPEC.model_copy(update={"inbox_root": str(inbox_root)})
    with open_sandbox(spec, backend=backend) as source, open_sandbox(spec, backend=backend) as target:
        source.write_file("a.txt", "a\n")
        source.copy_workspace_to([target])
        assert target.read_file("a.txt") == b"a\n"
        assert sorted(os.listdir(inbox_root)) == sorted([source.id, target.id])
        assert all(not os.listdir(inbox_root / name) for name in os.listdir(inbox_root))
    assert os.listdir(inbox_root) == []


def test_the_agent_cannot_write_into_its_inbox(backend: str, inbox_root: Path) -> None:
    with open_sandbox(SPEC.model_copy(update={"inbox_root": str(inbox_root)}), backend=backend) as sandbox:
        attempt = sandbox.exec("touch /run/inbox/planted; ln -s /etc/passwd /run/inbox/link; ls -A /run/inbox")
        assert attempt.stdout == ""
        assert "Permission denied" in attempt.stderr or "Read-only file system" in attempt.stderr
        assert os.listdir(inbox_root / sandbox.id) == []
