"""One registry in front of every task suite.

A suite is a plugin: an object with `ids()` and `get(task_id)` (the `TaskSuite` protocol),
registered under its name with a zero-argument factory. Factories run on first use, so
listing the suites never reads third-party data, and a service that only serves builtin
tasks never loads HumanEval.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from env_server.models import TaskSpec
from env_server.tasks.splits import Split, split_of

if TYPE_CHECKING:
    from env_server.tasks.validation import Validity

CACHE_DIR_ENV = "CODING_ENV_TASK_CACHE_DIR"


class TaskSuite(Protocol):
    """A loaded suite: ids are `suite/...`, stable across processes for the same data."""

    def ids(self) -> list[str]: ...

    def get(self, task_id: str) -> TaskSpec: ...


class StaticSuite:
    """A suite whose tasks are all built up front (small suites, or ones cheap to build).

    Every task passes the validity gate's host-side part (`validation.host_validity`: no trivial
    baseline earns reward on its call table) or is not served: it is kept in `rejected`, with why.
    Generators redraw or repair what the gate rejects, so this only catches what they let through.
    """

    def __init__(self, tasks: list[TaskSpec], *, gated: bool = True, verdicts: Mapping[str, Validity] | None = None) -> None:
        """`gated=False` only for suites whose tasks must not be solvable (canaries: their hidden
        outputs are secrets that only the gate's most-common-output oracle could know). `verdicts`:
        the gate's host-side verdicts a generator already computed for these very tasks (by id); the
        others are computed here."""
        # Imported here: the gate's module imports the grader, which listing suite names never needs.
        from env_server.tasks.validation import Validity, host_validity

        self.gated = gated
        """Whether the gate applies (`coding-env tasks validate` skips a suite that opted out)."""
        known = verdicts or {}
        checked = {
            task.id: (known.get(task.id) or host_validity(task)) if gated else Validity(task_id=task.id, valid=True)
            for task in tasks
        }
        self._tasks = {task.id: task for task in tasks if checked[task.id].valid}
        self.rejected: dict[str, Validity] = {task_id: verdict for task_id, verdict in checked.items() if not verdict.valid}
        """Tasks the gate refused, by id (`coding-env tasks validate` reports them)."""

    def ids(self) -> list[str]:
        return list(self._tasks)

    def get(self, task_id: str) -> TaskSpec:
        if task_id in self.rejected:
            raise KeyError(f"task {task_id!r} is not served: {'; '.join(self.rejected[task_id].problems)}")
        try:
            return self._tasks[task_id]
        except KeyError:
            raise KeyError(f"unknown task {task_id!r}") from None


class TaskRegistry:
    """Suites by name, each loaded lazily the first time one of its tasks is asked for."""

    def __init__(self) -> None:
        self._factories: dict[str, Callable[[], TaskSuite]] = {}
        self._loaded: dict[str, TaskSuite] = {}

    def register(self, suite: str, factory: Callable[[], TaskSuite]) -> None:
        """Add a suite; `factory` is called once, on first use."""
        if "/" in suite:
            raise ValueError(f"suite name may not contain '/': {suite!r}")
        if suite in self._factories:
            raise ValueError(f"suite {suite!r} is already registered")
        self._factories[suite] = factory

    def suites(self) -> list[str]:
        return sorted(self._factories)

    def suite(self, name: str) -> TaskSuite:
        """The loaded suite; KeyError if no suite has this name.

        `feature-deletion` names the `feature_deletion` suite: generators are spelled with
        hyphens on the command line, suites with underscores in task ids."""
        name = name.replace("-", "_")
        if name not in self._loaded:
            if name not in self._factories:
                raise KeyError(f"unknown task suite {name!r}; known: {', '.join(self.suites())}")
            self._loaded[name] = self._factories[name]()
        return self._loaded[name]

    def ids(self, suite: str | None = None, split: Split | None = None) -> list[str]:
        """Task ids of one suite, or of all suites in suite order; with `split`, only the ids in
        that fixed train / held-out split (`env_server.tasks.splits`)."""
        names = [suite] if suite is not None else self.suites()
        ids = [task_id for name in names for task_id in self.suite(name).ids()]
        return ids if split is None else [task_id for task_id in ids if split_of(task_id) == split]

    def get(self, task_id: str) -> TaskSpec:
        """The task with this id; KeyError if no suite knows it."""
        suite_name = task_id.split("/", 1)[0]
        if suite_name not in self._factories:
            raise KeyError(f"unknown task {task_id!r}: no suite {suite_name!r}")
        return self.suite(suite_name).get(task_id)


def default_cache_dir() -> Path:
    """Where generated suites live: `$CODING_ENV_TASK_CACHE_DIR` or `~/.cache/coding-env/tasks`."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "coding-env" / "tasks"


def default_registry(cache_dir: Path | None = None) -> TaskRegistry:
    """Builtin, HumanEval, program I/O, shell, canary, warmup, and the feature-deletion and bug-injection tasks found in `cache_dir`."""
    # Imported here so that importing the registry type stays cheap for the wire layer.
    from env_server.tasks import agent_bench, bug_injection, builtin, canary, codeio, feature_deletion, humaneval, warmup

    cache = cache_dir if cache_dir is not None else default_cache_dir()
    registry = TaskRegistry()
    registry.register(builtin.SUITE, builtin.BuiltinSuite)
    registry.register(humaneval.SUITE, humaneval.HumanEvalSuite)
    registry.register(codeio.SUITE, lambda: codeio.CodeIOSuite(cache))
    registry.register(agent_bench.SUITE, agent_bench.AgentBenchSuite)
    registry.register(feature_deletion.SUITE, lambda: feature_deletion.FeatureDeletionSuite(cache))
    registry.register(bug_injection.SUITE, lambda: bug_injection.BugInjectionSuite(cache))
    registry.register(canary.SUITE, canary.CanarySuite)
    registry.register(warmup.SUITE, warmup.WarmupSuite)
    return registry
