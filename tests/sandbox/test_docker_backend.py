"""Docker-only behaviour: hardening flags, labels, a killed caller, reaping orphans."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import docker.errors
import pytest

from sandbox.docker_backend import (
    CREATED_AT_LABEL,
    OWNER_LABEL,
    SANDBOX_ID_LABEL,
    SERVICE_LABEL,
    SUPERVISOR_CAPABILITIES,
    default_client,
    memory_limit_mb,
    reap_orphans,
)
from sandbox import Sandbox, open_sandbox
from tests.sandbox.support import DOCKER_SPEC as SPEC
from tests.sandbox.support import kill_caller_mid_command, needs_docker

pytestmark = needs_docker


@pytest.fixture
def docker_sandbox() -> Iterator[Sandbox]:
    with open_sandbox(SPEC) as sb:
        yield sb


def _gone(container_id: str) -> bool:
    """Wait for Docker's own removal event, then report whether the container is gone."""
    api = default_client().api
    try:
        api.wait(container_id, timeout=60, condition="removed")
        api.inspect_container(container_id)
    except docker.errors.NotFound:
        return True
    return False


def test_container_is_created_hardened(docker_sandbox: Sandbox) -> None:
    attrs = default_client().api.inspect_container(docker_sandbox.deployment.container_id)
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    # Only the supervisor (root) keeps these; commands drop to spec.user with none (decision 006).
    assert host["CapDrop"] == ["ALL"] and host["CapAdd"] == SUPERVISOR_CAPABILITIES
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Privileged"] is False and host["Init"] is True
    assert host["PidsLimit"] == SPEC.pids
    assert host["Memory"] == host["MemorySwap"] == memory_limit_mb(SPEC) * 2**20
    assert host["ShmSize"] == SPEC.shm_mb * 2**20 and host["LogConfig"]["Type"] == "none"
    assert host["NanoCpus"] == int(SPEC.cpus * 1e9)
    assert host["Ulimits"] == [{"Name": "nofile", "Soft": SPEC.nofile, "Hard": SPEC.nofile}]
    assert not attrs["Mounts"], "nothing from the host (e.g. the Docker socket) is mounted"
    assert attrs["Config"]["User"] == "0:0" and attrs["Config"]["Cmd"][-2:] == ["--run-as", SPEC.user]
    labels = attrs["Config"]["Labels"]
    assert labels[SERVICE_LABEL] == "sandbox" and labels[SANDBOX_ID_LABEL] == docker_sandbox.id


def test_the_images_python_loads_compiled_modules_and_a_command_writes_none(docker_sandbox: Sandbox) -> None:
    # The image ships bytecode for its own Python (decision 137); a command reads it, leaves none
    # of its own behind, and cannot replace the image's.
    docker_sandbox.write_file("helper.py", "X = 1\n")
    docker_sandbox.write_file("check.py", "import json, os, _pytest.python, helper\nprint(all(os.path.isfile(m.__cached__) for m in (json, _pytest.python)))\n")
    assert docker_sandbox.exec("python3 check.py", timeout_s=30).stdout == "True\n"
    assert docker_sandbox.exec("find . -name '*.pyc' -o -name __pycache__").stdout == ""
    recompiled = docker_sandbox.exec("python3 -m compileall -f -q \"$(python3 -c 'import json, os; print(os.path.dirname(json.__file__))')\"", timeout_s=30)
    assert recompiled.exit_code != 0 and "Read-only file system" in recompiled.stdout + recompiled.stderr


def test_commands_run_in_the_images_static_bash_as_bash(docker_sandbox: Sandbox) -> None:
    # Decision 139: the image's bash-static starts without loading libraries; named `bash`, it reads as
    # /usr/bin/bash to the command, its messages and its user lookups alike.
    dynamic_bash_version = docker_sandbox.exec("/usr/bin/bash -c 'echo $BASH_VERSION'").stdout
    result = docker_sandbox.exec('readlink /proc/$$/exe; echo "$0 $BASH $BASH_VERSION"; echo ~root; nosuch')
    assert result.stdout == f"/usr/bin/bash-static\nbash /usr/bin/bash {dynamic_bash_version}/root\n"
    assert result.stderr == "bash: line 1: nosuch: command not found\n" and result.exit_code == 127


def test_close_removes_the_container() -> None:
    sb = open_sandbox(SPEC)
    container_id = sb.deployment.container_id
    sb.close()
    assert _gone(container_id)


def test_a_killed_caller_leaves_no_container() -> None:
    assert _gone(kill_caller_mid_command("docker", "deployment.container_id"))


def test_reap_removes_containers_of_dead_owners_only(docker_sandbox: Sandbox) -> None:
    api = default_client().api
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True).stdout.strip()
    host = socket.gethostname()
    # A dead pid, and a live pid whose start time differs (pid reuse; a restarted container's pid 1).
    orphan_owners = [f"{host}:{dead_pid}:1", f"{host}:{os.getpid()}:1"]
    orphans = [
        api.create_container(
            SPEC.image,
            command=["sleep", "1000"],
            labels={SERVICE_LABEL: "sandbox", OWNER_LABEL: owner, CREATED_AT_LABEL: "0"},
            host_config=api.create_host_config(network_mode="none", auto_remove=True),
        )["Id"]
        for owner in orphan_owners
    ]
    for orphan in orphans:
        api.start(orphan)
    try:
        removed = reap_orphans()
        assert all(orphan in removed and _gone(orphan) for orphan in orphans)
        assert docker_sandbox.deployment.container_id not in removed and docker_sandbox.is_alive()
    finally:
        for orphan in orphans:
            try:
                api.remove_container(orphan, force=True)
            except docker.errors.NotFound:
                pass
