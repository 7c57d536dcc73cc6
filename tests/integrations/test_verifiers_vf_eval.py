"""The verifiers section of docs/integrations.md, run as written: its `coding-train serve-model`
command (with `tiny-random` for SmolLM2), its `vf-eval coding_env_verifiers ...` command and its
Python example, against the real service, each bringing back a graded trace.

`vf-eval` runs as verifiers' own entry point (`verifiers.v1.cli.eval.main:main`, what the script
calls), in a process that imported `coding_env_verifiers` first: in this environment mcp is 1.x
(decision 100) and verifiers' loader imports its own tasksets package, which needs mcp 2, unless
the id's namespaced module is already registered. Registered as the shipped module itself, so that
what the loader reads is the module `vf-eval` imports by the top-level name where mcp is 2. Loading
the id, parsing the flags, the interception server, the rollout and the scoring are all verifiers'."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integrations.conftest import framework

framework("verifiers.v1", "verifiers")

from tests.support.model_server import serving  # noqa: E402
from tests.support.service import RunningService  # noqa: E402
from trainer_client.integrations.episode_log import EpisodeLog  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOCS_SERVICE, DOCS_MODEL_URL, DOCS_MODEL = "http://127.0.0.1:8000", "http://127.0.0.1:8001/v1", "smollm2-135m-instruct"
TEST_MODEL = "tiny-random"
VF_EVAL = (
    "import sys, coding_env_verifiers as plugin; "
    "sys.modules.update({f'verifiers.v1.{kind}.coding_env_verifiers': plugin for kind in ('tasksets', 'harnesses')}); "
    "from verifiers.v1.cli.eval.main import main; main()"
)
RUN_TIMEOUT_S = 600


def verifiers_section() -> str:
    text = (ROOT / "docs" / "integrations.md").read_text()
    return text[text.index("## verifiers 0.4.0") : text.index("## SkyRL-gym")]


def docs_command(program: str) -> list[str]:
    """The section's one shell command that runs `program`, continuations joined, as argv."""
    lines = [
        line
        for block in re.findall(r"```bash\n(.*?)```", verifiers_section(), flags=re.DOTALL)
        for line in re.sub(r"\\\n\s*", " ", block).splitlines()
    ]
    [line] = [line for line in lines if line.startswith(program + " ")]
    return shlex.split(line.split("#")[0].removesuffix("&").strip())


def swapped(text: str, service_url: str, model_url: str) -> str:
    """The docs' URLs and model name replaced by the test's."""
    return text.replace(DOCS_SERVICE, service_url).replace(DOCS_MODEL_URL, model_url).replace(DOCS_MODEL, TEST_MODEL)


def run_python(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # The checkout on the path: `coding_env_verifiers` is importable even before an editable install is refreshed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    """The docs' `coding-train serve-model` with tiny-random, on a free port, 16 tokens a reply."""
    argv = docs_command("coding-train serve-model")
    argv = [str(BIN / argv[0]), *[TEST_MODEL if arg == DOCS_MODEL else arg for arg in argv[1:]]]
    argv[argv.index("--port") + 1] = "0"
    with serving([*argv, "--max-tokens", "16"], TEST_MODEL) as url:
        yield url


def assert_graded(trace: dict, max_model_turns: int) -> None:
    """A trace the service graded, played by the served model through verifiers' interception."""
    assert trace["ok"], trace["errors"]
    score = trace["rewards"]["coding_env_reward"]["score"]
    log = EpisodeLog.model_validate(trace["info"]["coding_env"])
    assert log.done and log.reward == score and 0.0 <= score <= 1.0
    assert log.tests_total and log.calls[-1].tool_name == "submit"
    assert 1 <= len(trace["calls"]) <= max_model_turns
    assert {call["model"] for call in trace["calls"]} == {TEST_MODEL}


def test_the_vf_eval_command_brings_back_a_graded_trace(service: RunningService, model_url: str, tmp_path: Path) -> None:
    argv = [swapped(arg, service.url, model_url) for arg in docs_command("vf-eval")]
    assert argv[1] == "coding_env_verifiers"
    result = run_python(["-c", VF_EVAL, *argv[1:], "--no-rich", "-o", str(tmp_path / "outputs")], tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    [traces] = (tmp_path / "outputs").glob("*/traces.jsonl")
    [line] = traces.read_text().splitlines()
    episode = json.loads(line)
    assert episode["ok"], episode["errors"]
    [trace] = episode["traces"]
    assert trace["task"]["data"]["task_id"] == "builtin/fizzbuzz"
    assert_graded(trace, int(argv[argv.index("--env.agent.harness.max-model-turns") + 1]))


def test_the_python_example_prints_a_graded_result(service: RunningService, model_url: str, tmp_path: Path) -> None:
    [code] = re.findall(r"```python\n(.*?)```", verifiers_section(), flags=re.DOTALL)
    result = run_python(["-c", swapped(code, service.url, model_url)], tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    [line] = result.stdout.splitlines()
    task_id, score, metrics = line.split(" ", 2)
    assert task_id == "builtin/fizzbuzz" and 0.0 <= float(score) <= 1.0
    assert "'tests_total': " in metrics and "'tool_calls': " in metrics
