"""Every kind of task grades its reference solution 1.0, and its untouched and its emptied workspace 0."""

from __future__ import annotations

import pytest

from env_server.tasks import default_registry
from env_server.tasks.validation import validate
from sandbox import SandboxSpec, open_sandbox


@pytest.mark.docker
def test_reference_solutions_pass_and_untouched_or_emptied_workspaces_fail() -> None:
    registry = default_registry()
    ids = [
        "builtin/fix_median",  # the untouched code passes one call of three
        registry.ids("codeio")[0],
        "agent_bench/os-32",  # state check (permissions): passed vacuously once the directory was deleted
    ]
    with open_sandbox(SandboxSpec(), backend="docker") as sandbox:
        verdicts = list(validate((registry.get(task_id) for task_id in ids), sandbox))
    assert [v.task_id for v in verdicts if not v.valid] == [], [v.problems for v in verdicts if not v.valid]
    assert all(v.reference == 1.0 and v.baseline("untouched") == v.baseline("emptied") == 0.0 for v in verdicts)
