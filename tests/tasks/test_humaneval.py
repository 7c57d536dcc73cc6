"""HumanEval: every canonical solution passes its call table and every bare prompt fails it."""

from __future__ import annotations

import io
import json
import tarfile
from importlib import resources

import pytest

from env_server.grading.call_checks import judge_calls
from env_server.grading.grader import grade, prepare_workspace
from env_server.tasks.humaneval import HumanEvalSuite
from sandbox import Sandbox

# Runs inside the sandbox: each task's calls against a given solution, in one interpreter, so
# all 2 x 164 tables take seconds instead of 328 gradings. It prints the harness's result lines
# per task (to a file: stdout is capped); the verdict is the grader's own (`judge_calls`) on the host.
_BATCH_CALLS = r"""
import importlib.util, json, signal, sys, types
spec = importlib.util.spec_from_file_location("codec", "/tmp/typed_values.py")
codec = importlib.util.module_from_spec(spec)
spec.loader.exec_module(codec)
signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError()))
results = {}
for task_id, case in json.load(open(sys.argv[1])).items():
    solution = types.ModuleType("solution")
    lines = []
    try:
        signal.alarm(10)
        exec(case["solution"], solution.__dict__)
        for index, call in enumerate(case["calls"]):
            args = [codec.decode(value) for value in call["args"]]
            try:
                lines.append({"i": index, "returned": codec.encode(getattr(solution, call["function"])(*args))})
            except Exception as error:
                lines.append({"i": index, "raised": type(error).__name__})
    except BaseException:
        pass
    finally:
        signal.alarm(0)
    results[task_id] = "\n".join(json.dumps(line) for line in lines)
json.dump(results, open("/tmp/results.json", "w"))
"""


def _batch(sandbox: Sandbox, cases: dict[str, dict]) -> dict[str, str]:
    files = {
        "cases.json": json.dumps(cases).encode(),
        "calls.py": _BATCH_CALLS.encode(),
        "typed_values.py": (resources.files("env_server.grading.in_sandbox") / "typed_values.py").read_bytes(),
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    sandbox.put_archive(buffer.getvalue(), "/tmp")
    result = sandbox.exec("python3 /tmp/calls.py /tmp/cases.json", timeout_s=300)
    assert result.exit_code == 0, result.stderr[-2000:]
    return json.loads(sandbox.read_file("/tmp/results.json"))


def test_suite_has_164_tasks_with_prompt_only_workspaces() -> None:
    suite = HumanEvalSuite()
    assert len(suite.ids()) == 164
    task = suite.get("humaneval/HumanEval/0")
    assert list(task.files) == ["solution.py"] and "def has_close_elements" in task.files["solution.py"]
    assert "check(" not in task.files["solution.py"] and task.hidden_calls and not task.hidden_tests
    assert all(suite.get(task_id).hidden_calls for task_id in suite.ids())
    # The expected values stay on the host: nothing that enters the sandbox holds them.
    assert "expected" not in json.dumps(task.hidden_calls[0].model_dump(include={"module", "function", "args", "kwargs"}))


@pytest.mark.docker
def test_canonical_solutions_pass_and_bare_prompts_fail(workspace: Sandbox) -> None:
    suite = HumanEvalSuite()
    tasks = {task_id: suite.get(task_id) for task_id in suite.ids()}
    calls = {task_id: [check.model_dump(include={"function", "args"}) for check in task.hidden_calls] for task_id, task in tasks.items()}
    for name, source in (("canonical", lambda task: task.metadata["solution"]["solution.py"]), ("bare", lambda task: task.files["solution.py"])):
        raw = _batch(workspace, {task_id: {"solution": source(task), "calls": calls[task_id]} for task_id, task in tasks.items()})
        verdicts = {task_id: all(verdict.passed for verdict in judge_calls(task, raw[task_id])) for task_id, task in tasks.items()}
        if name == "canonical":
            assert [task_id for task_id, passed in verdicts.items() if not passed] == []
        else:
            assert [task_id for task_id, passed in verdicts.items() if passed] == []


@pytest.mark.docker
@pytest.mark.parametrize("task_id", ["humaneval/HumanEval/0", "humaneval/HumanEval/32", "humaneval/HumanEval/163"])
def test_grade_through_the_full_path(workspace: Sandbox, task_id: str) -> None:
    task = HumanEvalSuite().get(task_id)
    prepare_workspace(workspace, task)
    bare = grade(workspace, task)
    assert (bare.reward, bare.tests_passed, bare.tests_total) == (0.0, 0, len(task.hidden_calls))
    assert bare.failing_tests[0].startswith("call 0: ")
    workspace.write_file("solution.py", task.metadata["solution"]["solution.py"])
    solved = grade(workspace, task)
    assert (solved.reward, solved.tests_passed, solved.failing_tests) == (1.0, len(task.hidden_calls), []), solved.output[-300:]
