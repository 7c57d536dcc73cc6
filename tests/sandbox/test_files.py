"""File and archive transfer through the supervisor."""

from __future__ import annotations

import io
import tarfile

import pytest

from sandbox import ArchiveTooLarge, FileTooLarge, Sandbox


def test_write_then_read_round_trips_bytes(sandbox: Sandbox) -> None:
    payload = bytes(range(256)) * 400
    sandbox.write_file("deep/dir/blob.bin", payload)
    sandbox.write_file("run.sh", "echo hi\n", mode=0o755)
    assert sandbox.read_file("deep/dir/blob.bin") == payload
    assert sandbox.exec("./run.sh").stdout == "hi\n"


def test_file_errors_keep_their_type(sandbox: Sandbox) -> None:
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("missing.txt")
    sandbox.exec("mkdir adir")
    with pytest.raises(IsADirectoryError):
        sandbox.read_file("adir")
    with pytest.raises(OSError, match="Read-only file system|Permission denied"):
        sandbox.write_file("/usr/evil", "x")


def test_archives_round_trip_a_tree(sandbox: Sandbox) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:") as tar:
        for name, text in {"pkg/__init__.py": b"", "pkg/mod.py": b"X = 1\n", "README": b"hello\n"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    sandbox.put_archive(buffer.getvalue(), "project")
    assert sandbox.exec("cd project && python3 -c 'import pkg.mod; print(pkg.mod.X)'").stdout == "1\n"

    with tarfile.open(fileobj=io.BytesIO(sandbox.get_archive("project")), mode="r:") as tar:
        names = {name.removeprefix("./") for name in tar.getnames()}
    assert {"pkg/mod.py", "README"} <= names
    with tarfile.open(fileobj=io.BytesIO(sandbox.get_archive("project/README")), mode="r:") as tar:
        assert tar.extractfile("README").read() == b"hello\n"


def _names(archive: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        return {name.removeprefix("./") for name in tar.getnames()}


def test_special_files_are_archived_without_reading_them(sandbox: Sandbox) -> None:
    sandbox.exec("mkfifo pipe; python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")'; ln -s /etc/passwd link; echo x > f")
    with tarfile.open(fileobj=io.BytesIO(sandbox.get_archive(".")), mode="r:") as tar:
        members = {member.name.removeprefix("./"): member for member in tar.getmembers()}
    assert members["pipe"].isfifo() and members["link"].issym() and members["f"].isfile()
    assert "sock" not in members
    for special in ("pipe", "sock", "/dev/zero"):
        with pytest.raises(OSError, match="regular file|No such device"):
            sandbox.read_file(special)


def test_unreadable_files_and_directories_are_a_typed_error(sandbox: Sandbox) -> None:
    sandbox.exec("mkdir -p open locked; echo s > open/secret; chmod 000 open/secret; echo t > locked/t; chmod 000 locked")
    with pytest.raises(PermissionError):
        sandbox.get_archive("open")
    with pytest.raises(PermissionError):
        sandbox.get_archive("locked")
    with pytest.raises(PermissionError):
        sandbox.read_file("open/secret")
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_a_deep_tree_is_archived(sandbox: Sandbox) -> None:
    deep = "/".join(["d"] * 1200)
    assert sandbox.exec(f"mkdir -p {deep} && echo leaf > {deep}/leaf").exit_code == 0
    assert f"{deep}/leaf" in _names(sandbox.get_archive("."))


def test_transfers_over_the_bound_are_refused_before_reading(sandbox: Sandbox) -> None:
    sandbox.exec("truncate -s 4G sparse; head -c 5000 /dev/zero > small")
    with pytest.raises(ArchiveTooLarge):
        sandbox.get_archive(".")  # the default bound: spec.max_transfer_mb
    with pytest.raises(FileTooLarge):
        sandbox.read_file("sparse")
    with pytest.raises(ArchiveTooLarge):
        sandbox.get_archive("small", max_bytes=4096)
    with pytest.raises(FileTooLarge):
        sandbox.read_file("small", max_bytes=4999)
    assert len(sandbox.read_file("small", max_bytes=5000)) == 5000
    sandbox.exec("rm sparse")
    assert {"small"} <= _names(sandbox.get_archive(".", max_bytes=64 * 1024))
