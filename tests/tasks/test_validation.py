"""Every kind of task grades its reference solution 1.0, and its untouched and its emptied workspace 0."""

from __future__ import annotations

import pytest

from env_server.tasks import default_registry
from env_server.tasks.validation import validate


@pytest.mark.docker
def test_reference_solutions_pass_and_untouched_or_emptied_workspaces_fail() -> None:
    registry = default_registry()
    ids = [
        "builtin/fix_median",  # fraction reward: the untouched code used to pass one test of three
        registry.ids("codeio")[0],
        "agent_bench/os-32",  # state check (permissions): passed vacuously once the directory was deleted
    ]
    outcomes = list(validate(registry, ids))
    assert [o.task_id for o in outcomes if not o.ok] == [], [o.detail for o in outcomes if not o.ok]
