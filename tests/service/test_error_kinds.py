"""Each error kind, provoked through the real service and a real sandbox."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from env_server.models import ErrorKind
from tests.service.conftest import HttpSession

SINGLE_STEP_CASES = [
    (ErrorKind.TOOL_NOT_FOUND, "no_such_tool", {}),
    (ErrorKind.JSON_DECODE, "bash", "this is not json at all"),
    (ErrorKind.TYPE_ERROR, "bash", {"cmd": "ls"}),
    (ErrorKind.RUNTIME_ERROR, "edit_file", {"path": "solution.py", "old_str": "not in the file", "new_str": "x"}),
    (ErrorKind.NONZERO_EXIT, "bash", {"command": "echo failing >&2; exit 3"}),
    (ErrorKind.COMMAND_NOT_FOUND, "bash", {"command": "no-such-program --help"}),
    (ErrorKind.PERMISSION_DENIED, "write_file", {"path": "/etc/hacked", "content": "x"}),
    (ErrorKind.PERMISSION_DENIED, "bash", {"command": "touch /usr/bin/hacked"}),
    (ErrorKind.FILE_NOT_FOUND, "read_file", {"path": "missing.py"}),
    (ErrorKind.FILE_NOT_FOUND, "bash", {"command": "cat missing.txt"}),
    (ErrorKind.SYNTAX_ERROR, "write_file", {"path": "broken.py", "content": "def f(:\n    return 1\n"}),
    (ErrorKind.SYNTAX_ERROR, "bash", {"command": "python3 -c 'def f(:'"}),
    (ErrorKind.TIMEOUT, "bash", {"command": "sleep 30", "timeout_s": 0.5}),
    (ErrorKind.TEST_FAILURE, "run_tests", {}),
]


@pytest.mark.parametrize(("kind", "tool", "arguments"), SINGLE_STEP_CASES, ids=lambda v: getattr(v, "value", None))
def test_each_kind_is_reported_with_a_hint(session: HttpSession, kind: ErrorKind, tool: str, arguments: dict | str) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    observation = session.step(tool, arguments)["observation"]
    assert observation["error_kind"] == kind.value, observation["output"]
    assert observation["hint"]
    assert "Hint:" not in observation["output"]  # hints reach the policy only with show_hints


def test_success_has_no_kind_and_no_hint(session: HttpSession) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    observation = session.step("bash", {"command": "true"})["observation"]
    assert observation["error_kind"] is None and observation["hint"] is None


def test_run_tests_on_a_task_without_visible_tests_says_so_plainly(session: HttpSession) -> None:
    session.reset(task={"id": "inline/no-visible-tests", "prompt": "Write add(a, b) in solution.py.",
                        "files": {"solution.py": "def add(a, b):\n    pass\n"},
                        "hidden_tests": {"test_hidden.py": "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"}})
    observation = session.step("run_tests")["observation"]
    assert observation["error_kind"] is None and observation["hint"] is None
    assert "no visible tests" in observation["output"]


def test_third_identical_failure_is_repeated_failure(session: HttpSession) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    kinds = [session.step("bash", {"command": "nosuchcmd"})["observation"]["error_kind"] for _ in range(3)]
    assert kinds == ["command_not_found", "command_not_found", "repeated_failure"]
    last = session.step("bash", {"command": "nosuchcmd"})
    assert last["observation"]["error_kind"] == "repeated_failure"
    assert last["observation"]["metadata"]["underlying_error_kind"] == "command_not_found"
    assert session.step("bash", {"command": "true"})["observation"]["error_kind"] is None


def test_out_of_memory(make_service: Callable[..., str]) -> None:
    # The container's limit is memory_mb plus the tmpfs sizes (decision 008): small tmpfs, so
    # 400 MB exceeds it by far.
    url = make_service(sandbox={"memory_mb": 64, "workspace_mb": 16, "tmp_mb": 16, "shm_mb": 16}, pool_size=1)
    with httpx.Client(base_url=url, timeout=120) as client:
        session = HttpSession(client)
        session.reset(task_id="builtin/fizzbuzz")
        observation = session.step("bash", {"command": "python3 -c 'x = bytes(400 * 1024 * 1024); y = x + b\"1\"'"})["observation"]
        assert observation["error_kind"] == "oom"
        assert "out of memory" in observation["output"]

