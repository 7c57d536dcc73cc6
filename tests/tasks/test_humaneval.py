"""HumanEval: every canonical solution passes its hidden test and every bare prompt fails it."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from env_server.grading import grade, prepare_workspace
from env_server.tasks.humaneval import HIDDEN_TEST_PATH, HumanEvalSuite
from sandbox import Sandbox

# Runs inside the sandbox: each task's hidden test module executed against a given solution,
# in one interpreter, so all 2 x 164 checks take seconds instead of 328 pytest start-ups.
_BATCH_CHECK = r"""
import json, sys, types, signal
results = {}
signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError()))
for task_id, case in json.load(open(sys.argv[1])).items():
    solution = types.ModuleType("solution")
    sys.modules["solution"] = solution
    try:
        signal.alarm(10)
        exec(case["solution"], solution.__dict__)
        test = {}
        exec(case["test"], test)
        test["test_check"]()
        results[task_id] = True
    except BaseException:
        results[task_id] = False
    finally:
        signal.alarm(0)
print(json.dumps(results))
"""


def _batch(sandbox: Sandbox, cases: dict[str, dict[str, str]]) -> dict[str, bool]:
    payload = json.dumps(cases).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in (("cases.json", payload), ("check.py", _BATCH_CHECK.encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    sandbox.put_archive(buffer.getvalue(), "/tmp")
    result = sandbox.exec("python3 /tmp/check.py /tmp/cases.json", timeout_s=300)
    assert result.exit_code == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_suite_has_164_tasks_with_prompt_only_workspaces() -> None:
    suite = HumanEvalSuite()
    assert len(suite.ids()) == 164
    task = suite.get("humaneval/HumanEval/0")
    assert list(task.files) == ["solution.py"] and "def has_close_elements" in task.files["solution.py"]
    assert "check(" not in task.files["solution.py"] and task.hidden_tests and not task.visible_tests


@pytest.mark.docker
def test_canonical_solutions_pass_and_bare_prompts_fail(workspace: Sandbox) -> None:
    suite = HumanEvalSuite()
    tasks = [suite.get(task_id) for task_id in suite.ids()]
    canonical = _batch(workspace, {t.id: {"solution": t.metadata["solution"]["solution.py"], "test": t.hidden_tests[HIDDEN_TEST_PATH]} for t in tasks})
    bare = _batch(workspace, {t.id: {"solution": t.files["solution.py"], "test": t.hidden_tests[HIDDEN_TEST_PATH]} for t in tasks})
    assert [task_id for task_id, ok in canonical.items() if not ok] == []
    assert [task_id for task_id, ok in bare.items() if ok] == []


@pytest.mark.docker
@pytest.mark.parametrize("task_id", ["humaneval/HumanEval/0", "humaneval/HumanEval/163"])
def test_grade_through_the_full_path(workspace: Sandbox, task_id: str) -> None:
    task = HumanEvalSuite().get(task_id)
    prepare_workspace(workspace, task)
    bare = grade(workspace, task)
    assert (bare.reward, bare.tests_passed, bare.tests_total) == (0.0, 0, 1)
    assert bare.failing_tests == ["test_humaneval_hidden::test_check"]
    workspace.write_file("solution.py", task.metadata["solution"]["solution.py"])
    solved = grade(workspace, task)
    assert (solved.reward, solved.tests_passed, solved.tests_total, solved.failing_tests) == (1.0, 1, 1, [])
