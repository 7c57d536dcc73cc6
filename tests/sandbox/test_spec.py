"""SandboxSpec as a configuration surface: hardened defaults, validation, the issue's field names."""

from __future__ import annotations

import pydantic
import pytest

from sandbox import SandboxSpec


def test_defaults_are_the_hardened_configuration() -> None:
    spec = SandboxSpec()
    assert spec.network is False and spec.runtime == "runc" and not spec.user.startswith("0")


def test_environment_is_accepted_as_the_name_of_env() -> None:
    assert SandboxSpec(environment={"A": "1"}).env == {"A": "1"} == SandboxSpec(env={"A": "1"}).env


def test_unknown_fields_and_bad_limits_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        SandboxSpec(memory=512)
    with pytest.raises(pydantic.ValidationError):
        SandboxSpec(memory_mb=0)
