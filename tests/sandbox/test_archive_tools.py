"""The supervisor's archive operations in-process, with GNU tar and with the `tarfile` fallback
that images without GNU tar use: both must archive and restore the same tree (decision 011)."""

from __future__ import annotations

import io
import os
import socket
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.supervisor import supervisor

BOUND = 2**20


@pytest.fixture(params=["gnu-tar", "tarfile"])
def archiver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "gnu-tar":
        if supervisor.gnu_tar() is None:
            pytest.skip("GNU tar is not installed")
        monkeypatch.setattr(supervisor, "SMALL_ARCHIVE_BYTES", -1)  # every archive through tar, however small
    else:
        monkeypatch.setattr(supervisor, "gnu_tar", lambda: None)
    yield request.param


def _tree(root: Path) -> None:
    (root / "pkg" / "deep").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "pkg" / "deep" / "data.bin").write_bytes(bytes(range(256)) * 9)
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "link").symlink_to("/etc/passwd")
    os.mkfifo(root / "pipe")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(root / "sock"))
    os.link(root / "pkg" / "mod.py", root / "hardlink.py")


KINDS = {"dir": stat.S_ISDIR, "link": stat.S_ISLNK, "fifo": stat.S_ISFIFO, "socket": stat.S_ISSOCK, "file": stat.S_ISREG}


def _listing(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under `root`: its kind, permission bits and content (or link target)."""
    entries = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        kind = next((name for name, test in KINDS.items() if test(info.st_mode)), "other")
        content = os.readlink(path) if kind == "link" else path.read_bytes().hex() if kind == "file" else ""
        entries[str(path.relative_to(root))] = (kind, stat.S_IMODE(info.st_mode), content)
    return entries


def test_a_tree_round_trips_with_special_files_kept_and_sockets_left_out(archiver: str, tmp_path: Path) -> None:
    source, copy = tmp_path / "source", tmp_path / "copy"
    source.mkdir()
    _tree(source)
    _, archive = supervisor.archive_get(str(source), {"path": ".", "max_bytes": BOUND}, b"")
    supervisor.archive_put(str(tmp_path), {"dest": "copy"}, archive)
    expected = _listing(source)
    assert expected.pop("sock")[0] == "socket"
    assert _listing(copy) == expected
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert tar.getmember("./hardlink.py").islnk() or tar.getmember("./pkg/mod.py").islnk()


def test_a_single_file_is_archived_under_its_base_name(archiver: str, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello\n")
    _, archive = supervisor.archive_get(str(tmp_path), {"path": "notes.txt", "max_bytes": BOUND}, b"")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert tar.getnames() == ["notes.txt"]
        assert tar.extractfile("notes.txt").read() == b"hello\n"


def test_a_tree_over_the_bound_is_refused_before_it_is_read(archiver: str, tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(b"x" * 50_000)
    with pytest.raises(supervisor.TooLarge, match="over the 40000-byte bound"):
        supervisor.archive_get(str(tmp_path), {"path": ".", "max_bytes": 40_000}, b"")


def test_a_missing_member_is_the_oserror_the_host_maps(archiver: str, tmp_path: Path) -> None:
    (tmp_path / "dest").write_text("a file where a directory must go\n")
    with pytest.raises(OSError):
        supervisor.archive_put(str(tmp_path), {"dest": "dest/sub"}, b"")
    with pytest.raises(FileNotFoundError):
        supervisor.archive_get(str(tmp_path), {"path": "absent", "max_bytes": BOUND}, b"")


def test_a_small_sent_archive_unpacks_without_starting_tar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if supervisor.gnu_tar() is None:
        pytest.skip("GNU tar is not installed")
    source = tmp_path / "source"
    source.mkdir()
    (source / "main.py").write_text("print(1)\n")
    _, archive = supervisor.archive_get(str(source), {"path": ".", "max_bytes": BOUND}, b"")
    started: list[list[str]] = []
    real_start = supervisor.start_tar
    monkeypatch.setattr(supervisor, "start_tar", lambda argv, *rest: started.append(argv) or real_start(argv, *rest))
    supervisor.archive_put(str(tmp_path), {"dest": "small"}, archive)
    assert (tmp_path / "small" / "main.py").read_text() == "print(1)\n" and started == []
    monkeypatch.setattr(supervisor, "SMALL_ARCHIVE_BYTES", len(archive) - 1)
    supervisor.archive_put(str(tmp_path), {"dest": "large"}, archive)
    assert (tmp_path / "large" / "main.py").read_text() == "print(1)\n" and [argv[1] for argv in started] == ["-x"]
