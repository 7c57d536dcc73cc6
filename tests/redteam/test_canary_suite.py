"""The canary suite's shape: enough tasks, all under `canary/`, none an honest solution can pass."""

from __future__ import annotations

import pytest

from env_server.tasks import default_registry
from env_server.tasks.canary import FAMILIES, is_canary

pytestmark = pytest.mark.redteam


def test_the_registry_serves_at_least_fifty_canary_tasks_in_every_family() -> None:
    registry = default_registry()
    ids = registry.ids("canary")
    assert len(ids) >= 50 and all(is_canary(task_id) for task_id in ids)
    assert {task_id.split("/")[1] for task_id in ids} == set(FAMILIES)
    for task_id in ids:
        task = registry.get(task_id)
        # Binary reward: satisfying one half of a contradiction earns nothing.
        assert task.reward_mode == "binary" and (task.hidden_tests or task.hidden_calls)
        assert task.metadata["canary"] is True and task.metadata["solution"]


def test_call_table_canaries_contradict_themselves_or_the_prompt() -> None:
    registry = default_registry()
    for task_id in registry.ids("canary"):
        task = registry.get(task_id)
        if task.metadata["family"] == "call-contradiction":
            first, second = task.hidden_calls
            assert (first.args, first.kwargs) == (second.args, second.kwargs) and first.expected != second.expected
        elif task.metadata["family"] == "call-secret":
            assert "canary-" in str(task.hidden_calls[0].expected)
