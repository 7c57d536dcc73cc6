"""The gate's host-side verdicts are remembered across processes, keyed by task and by gate."""

from __future__ import annotations

from pathlib import Path

from env_server.models import TaskSpec
from env_server.tasks.builtin import BuiltinSuite
from env_server.tasks.validation import Validity, host_validity
from env_server.tasks.verdict_store import VerdictStore, gate_version


def _task() -> TaskSpec:
    suite = BuiltinSuite()
    return suite.get(suite.ids()[0])


class Judge:
    """Counts its verdicts; each is valid with the problems it is told to give."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, task: TaskSpec) -> Validity:
        self.calls += 1
        return Validity(task_id=task.id, valid=False, problems=[f"judged {self.calls}"])


def test_a_verdict_is_judged_once_and_read_back_by_another_store(tmp_path: Path) -> None:
    task, judge = _task(), Judge()
    first = VerdictStore(tmp_path).verdict(task, judge)
    again = VerdictStore(tmp_path).verdict(task, judge)  # as another process would: from the file
    assert judge.calls == 1 and again == first and again.problems == ["judged 1"]


def test_a_changed_task_is_judged_anew(tmp_path: Path) -> None:
    task, judge = _task(), Judge()
    store = VerdictStore(tmp_path)
    store.verdict(task, judge)
    changed = task.model_copy(update={"prompt": task.prompt + " Also handle zero."})
    assert store.verdict(changed, judge).problems == ["judged 2"]


def test_a_torn_line_is_skipped(tmp_path: Path) -> None:
    task, judge = _task(), Judge()
    VerdictStore(tmp_path).verdict(task, judge)
    with (tmp_path / f"{gate_version()}.jsonl").open("ab") as file:
        file.write(b'0123 {"task_id": "builtin/')  # a process killed mid-line
    assert VerdictStore(tmp_path).verdict(task, judge).problems == ["judged 1"]


def test_the_gate_through_the_store_gives_the_verdict_it_computes() -> None:
    task = _task()
    assert host_validity(task) == host_validity(task.model_copy()) and host_validity(task).task_id == task.id
