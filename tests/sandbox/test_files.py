"""File and archive transfer through the supervisor."""

from __future__ import annotations

import io
import tarfile

import pytest

from sandbox import Sandbox


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
