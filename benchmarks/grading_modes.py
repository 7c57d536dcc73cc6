"""Grading latency, call table vs pytest mode: the same checks of the same tasks, graded both ways in one run.

    python benchmarks/grading_modes.py [--tiny]

Every grade is of the task's reference solution and must earn 1.0 (else the grader timed a failure).
`--tiny` (CI's run): fizzbuzz and one HumanEval task, each graded once each way.
"""

from __future__ import annotations

import argparse
import statistics
import time

from env_server.grading.grader import GRADE_COMMAND, grade, prepare_workspace
from env_server.models import TaskSpec
from env_server.tasks.builtin import TASKS
from env_server.tasks.humaneval import HumanEvalSuite, read_problems
from samples import checked_exec, checked_grade
from sandbox import SandboxSpec, open_sandbox

FIZZ_PYTEST = TaskSpec(
    id="bench/fizzbuzz-pytest", prompt="p", files=TASKS[0].files,
    hidden_tests={"test_hidden_fizzbuzz.py": (
        "import pytest\n\nfrom solution import fizzbuzz\n\n\n"
        "@pytest.mark.parametrize('n, expected', [(5, 'Buzz'), (15, 'FizzBuzz'), (30, 'FizzBuzz'), (9, 'Fizz'), (7, '7'), (0, 'FizzBuzz')])\n"
        "def test_fizzbuzz(n, expected):\n    assert fizzbuzz(n) == expected\n")},
    grade_command=GRADE_COMMAND, metadata=TASKS[0].metadata)
he = HumanEvalSuite()


def he_pytest(task_id: str) -> TaskSpec:
    """The task graded the old way: its `check` in a pytest module that star-imports the solution."""
    p = next(p for p in read_problems() if f"humaneval/{p['task_id']}" == task_id)
    test = (f"from solution import *  # noqa: F403\nimport solution as _submission\n\n{p['test']}\n\n\n"
            f"def test_check():\n    check(_submission.{p['entry_point']})\n")
    t = he.get(task_id)
    return TaskSpec(id=task_id + "-pytest", prompt="p", files=t.files, hidden_tests={"test_humaneval_hidden.py": test},
                    grade_command=GRADE_COMMAND, reward_mode="binary", metadata=t.metadata)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="fizzbuzz and one HumanEval task, graded once each way: every path and check")
    args = parser.parse_args()
    humaneval = ("humaneval/HumanEval/0",) if args.tiny else ("humaneval/HumanEval/0", "humaneval/HumanEval/53", "humaneval/HumanEval/100")
    repeats = 1 if args.tiny else 2
    pairs = [("builtin/fizzbuzz", TASKS[0], FIZZ_PYTEST)] + [(i, he.get(i), he_pytest(i)) for i in humaneval]
    spec = SandboxSpec()
    base = []
    for _ in range(1 if args.tiny else 3):
        t = time.perf_counter(); open_sandbox(spec).close(); base.append((time.perf_counter() - t) * 1000)
    print(f"cold open+close p50 {statistics.median(base):.0f} ms")
    calls, pyt = [], []
    with open_sandbox(spec) as agent:
        for name, call_task, py_task in pairs:
            for _ in range(repeats):
                for task, out in ((call_task, calls), (py_task, pyt)):
                    checked_exec(agent, "find . /tmp -mindepth 1 -delete")
                    prepare_workspace(agent, task)
                    for path, text in task.metadata["solution"].items():
                        agent.write_file(path, text)
                    out.append(checked_grade(grade(agent, task), task.id).grading_ms)
            print(name, f"{len(call_task.hidden_calls)} calls")
    print(f"call table p50 {statistics.median(calls):.0f} ms (n={len(calls)}), pytest mode p50 {statistics.median(pyt):.0f} ms (n={len(pyt)}), base p50 {statistics.median(base):.0f}")


if __name__ == "__main__":
    main()
