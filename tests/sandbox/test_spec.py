"""SandboxSpec as a configuration surface: hardened defaults, validation, the issue's field names."""

from __future__ import annotations

import pydantic
import pytest

from sandbox import DockerSpec, SandboxSpec


def test_defaults_are_the_hardened_configuration() -> None:
    spec = DockerSpec()
    assert spec.network is False and spec.runtime == "runc" and not spec.user.startswith("0")


def test_environment_is_accepted_as_the_name_of_env() -> None:
    assert SandboxSpec(environment={"A": "1"}).env == {"A": "1"} == SandboxSpec(env={"A": "1"}).env


def test_unknown_fields_and_bad_limits_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        SandboxSpec(memory=512)
    with pytest.raises(pydantic.ValidationError):
        SandboxSpec(memory_mb=0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("user", "0:0", "never run as root"), ("user", "1000:0", "never run as root"), ("user", "agent", "numeric"), ("user", "1000", "numeric"),
     ("workdir", "/tmp", "of its own"), ("workdir", "work", "absolute")],
)  # fmt: skip
def test_identities_and_mounts_that_would_undo_the_isolation_are_refused(field: str, value: str, message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        SandboxSpec(**{field: value})


def test_the_docker_memory_limit_leaves_memory_mb_to_processes_with_every_tmpfs_full() -> None:
    from sandbox.docker_backend import memory_limit_mb

    spec = DockerSpec(memory_mb=256, workspace_mb=256, tmp_mb=128, shm_mb=64)
    assert memory_limit_mb(spec) == 256 + 256 + 128 + 64
