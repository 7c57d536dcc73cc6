"""`Sandbox.put_sealed_archive`: files the sandbox's commands cannot change (decision 058).

On Docker (runc and, where registered, gVisor) the supervisor extracts them as its own
identity (root without CAP_DAC_OVERRIDE or CAP_FOWNER) while commands run as uid 1000; the
bubblewrap backend has one uid and says sealing is unavailable.
"""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator

import pytest

from sandbox import Sandbox, SandboxError, SealingUnavailable, open_sandbox
from tests.sandbox.support import DOCKER_SPEC, GVISOR_SPEC, LOCAL_SPEC, needs_bwrap, needs_docker
from tests.sandbox.test_gvisor import runsc_registered

RUNTIMES = [
    pytest.param("runc", marks=needs_docker),
    pytest.param("runsc", marks=[*needs_docker, pytest.mark.skipif(not runsc_registered(), reason="no runsc runtime registered with Docker")]),
]

FILES = {"a.txt": b"alpha\n", "pkg/b.py": b"B = 1\n", "pkg/deep/c.py": b"C = 2\n"}


def archive(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o666  # the sealed modes win over the archive's
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buffer.getvalue()


def fresh_dest() -> str:
    return f"/dev/shm/sealed-{uuid.uuid4().hex}"


@pytest.fixture(params=RUNTIMES)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    with open_sandbox(GVISOR_SPEC if request.param == "runsc" else DOCKER_SPEC, backend="docker") as sb:
        yield sb


def test_sealed_files_are_read_only_to_every_command(sandbox: Sandbox) -> None:
    dest = fresh_dest()
    sandbox.put_sealed_archive(archive(FILES), dest)
    assert sandbox.exec(f"cat {dest}/a.txt {dest}/pkg/deep/c.py").stdout == "alpha\nC = 2\n"
    listing = sandbox.exec(
        f"cd {dest} && python3 -c 'import os, sys; [print(p, oct(os.lstat(p).st_mode & 0o7777), os.lstat(p).st_uid) for p in sys.argv[1:]]' . a.txt pkg pkg/deep pkg/deep/c.py"
    )
    assert listing.stdout.split("\n")[:-1] == [". 0o555 0", "a.txt 0o444 0", "pkg 0o555 0", "pkg/deep 0o555 0", "pkg/deep/c.py 0o444 0"]
    attempts = {
        "write": f"echo x > {dest}/a.txt",
        "append": f"echo x >> {dest}/pkg/b.py",
        "truncate": f"truncate -s 0 {dest}/a.txt",
        "remove": f"rm -f {dest}/a.txt",
        "remove the tree": f"rm -rf {dest}",
        "rename inside": f"mv {dest}/pkg/b.py {dest}/pkg/z.py",
        "rename out": f"mv {dest}/pkg/deep/c.py /tmp/c.py",
        "rename the directory": f"mv {dest} /dev/shm/elsewhere",
        "rename a subdirectory": f"mv {dest}/pkg {dest}/pkh",
        "chmod a file": f"chmod 666 {dest}/a.txt",
        "chmod a directory": f"chmod 777 {dest}/pkg",
        "add a file": f"touch {dest}/pkg/new.py",
        "add a directory": f"mkdir {dest}/pkg/new",
        "replace by python": f"python3 -c \"import os; open('/tmp/t', 'w').write('x'); os.replace('/tmp/t', '{dest}/a.txt')\"",
    }
    for what, command in attempts.items():
        result = sandbox.exec(command)
        assert result.exit_code != 0, f"{what} succeeded: {result}"
    for path, data in FILES.items():
        assert sandbox.read_file(f"{dest}/{path}") == data
    # (Python, not ls: gVisor's statx refuses ls's flags.)
    assert sandbox.exec(f"python3 -c 'import os; print(*sorted(os.listdir(\"{dest}/pkg\")))'").stdout.split() == ["b.py", "deep"]


@pytest.mark.parametrize(
    ("files", "links"),
    [
        ({"../escaped.txt": b"x"}, None),
        ({"ok.txt": b"x", "pkg/../../escaped.txt": b"x"}, None),
        ({"/tmp/escaped.txt": b"x"}, None),
        ({"ok.txt": b"x"}, {"link": "/tmp"}),
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "symlink"],
)
def test_a_link_or_an_escaping_member_is_refused_before_anything_is_written(
    sandbox: Sandbox, files: dict[str, bytes], links: dict[str, str] | None
) -> None:
    dest = fresh_dest()
    with pytest.raises(SandboxError, match="sealed archive member"):
        sandbox.put_sealed_archive(archive(files, links), dest)
    assert sandbox.exec(f"test -e {dest} || test -e /tmp/escaped.txt || test -e /dev/shm/escaped.txt").exit_code != 0


def test_an_existing_destination_is_never_written_into(sandbox: Sandbox) -> None:
    planted = fresh_dest()
    # The agent's uid may make names in /dev/shm: a link to its own directory, or a directory.
    assert sandbox.exec(f"mkdir /tmp/mine && ln -s /tmp/mine {planted} && mkdir {planted}-dir").exit_code == 0
    for dest in (planted, f"{planted}-dir"):
        with pytest.raises(FileExistsError):
            sandbox.put_sealed_archive(archive(FILES), dest)
    assert sandbox.exec(f"python3 -c 'import os; print(os.listdir(\"/tmp/mine\"), os.listdir(\"{planted}-dir\"))'").stdout == "[] []\n"


@pytest.mark.parametrize("dest", ["/tmp/sealed", "/dev/shm", "/dev/shm/a/b", "/dev/shm/../tmp/x", "relative"])
def test_only_a_new_directory_right_under_dev_shm(sandbox: Sandbox, dest: str) -> None:
    with pytest.raises(SandboxError, match="right under"):
        sandbox.put_sealed_archive(archive(FILES), dest)


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_bwrap)])
def test_the_local_backend_says_sealing_is_unavailable(_: None) -> None:
    with open_sandbox(LOCAL_SPEC, backend="local") as sb:
        with pytest.raises(SealingUnavailable, match="own uid"):
            sb.put_sealed_archive(archive(FILES), fresh_dest())
        assert sb.is_alive()


# In the command's own user and mount namespaces (gVisor lets uid 1000 make them; Docker's
# seccomp profile does not under runc), a mount over the sealed directory would show the run
# other files than the host reads back; neither runtime lets it mount.
OVERMOUNT = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000 | 0x00020000) == 0:  # CLONE_NEWUSER | CLONE_NEWNS
    for path, line in (("/proc/self/uid_map", "0 1000 1"), ("/proc/self/gid_map", "0 1000 1")):
        try:
            open(path, "w").write(line)
        except OSError:
            pass
mounted = [libc.mount(b"none", sys.argv[1].encode(), b"tmpfs", 0, None), libc.mount(b"/tmp", sys.argv[1].encode(), None, 4096, None)]
print(mounted, sorted(os.listdir(sys.argv[1])))
"""


def test_no_namespace_trick_mounts_over_a_sealed_directory(sandbox: Sandbox) -> None:
    dest = fresh_dest()
    sandbox.put_sealed_archive(archive(FILES), dest)
    sandbox.write_file("overmount.py", OVERMOUNT)
    assert sandbox.exec(f"python3 overmount.py {dest}").stdout == "[-1, -1] ['a.txt', 'pkg']\n"
