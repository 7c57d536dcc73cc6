"""The README's Python snippets other than the TRL one (tests/trainer/test_readme_snippet.py), run as
written against the test service: the plain-HTTP episode, OpenEnv's generic client, the sandbox on its own."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def snippet(marker: str) -> str:
    (found,) = [block for block in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if marker in block]
    return found


def run(code: str, base_url: str) -> dict:
    namespace: dict = {}
    exec(compile(code.replace("http://127.0.0.1:8000", base_url), "README.md", "exec"), namespace)
    return namespace


def test_the_http_snippet_plays_an_episode(base_url: str) -> None:
    namespace = run(snippet('http.post("/sessions")'), base_url)
    assert namespace["obs"]["task_id"] == "builtin/fizzbuzz"
    assert namespace["step"]("bash", command="true").get("code") == "session_not_found"  # the snippet closed its session


def test_the_openenv_snippet_steps_through_the_generic_client(base_url: str) -> None:
    # The test service serves the builtin suite only: the snippet's HumanEval task becomes a builtin one.
    namespace = run(snippet("GenericEnvClient").replace("humaneval/HumanEval/0", "builtin/fizzbuzz"), base_url)
    assert namespace["result"].observation is not None


def test_the_sandbox_snippet_runs_on_its_own(capsys) -> None:
    run(snippet("open_sandbox("), "")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "0 1" and "b'x = 1\\n'" in printed  # exit code and stdout, then the file read back
