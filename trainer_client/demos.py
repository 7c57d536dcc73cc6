"""Expert demonstrations for the SFT warm start, played through the service.

For each task an expert script (built from the task's reference solution) inspects the workspace,
writes the solution, runs the visible tests and submits, through the same environment class and
tool methods TRL's `environment_factory` rollouts use. A seeded share of episodes first makes a
realistic mistake (a syntax error in the first write, a mistyped command, reading a file that
does not exist) and recovers on the next turn, so the demos also show what to do after an error.

Each demo is written as a chat (`messages` + `tools`) that renders, with the policy's chat
template, to exactly the tokens a TRL rollout of the same episode holds; only episodes the service
graded 1.0 are kept. The reference solutions are read from the task registry on this machine (the
service never hands them out), so this command runs where the suites are installed.
"""

from __future__ import annotations

import json
import random
import shlex
import threading
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from env_server.models import TaskSpec
from trainer_client.client import ClientSettings
from trainer_client.environment import TrlEnvironment, environment_class
from trainer_client.records import PreferencePair
from trainer_client.task_rows import prompt_after_reset, task_row
from trainer_client.trl_rollout import dispatch, environment_methods, tool_message

Mistake = Literal["syntax_error", "command_typo", "missing_file"]
FINAL_REPLY = "I submitted the solution."
"""The expert's last turn: after `submit` answers, a reply without a tool call ends TRL's tool loop."""


@dataclass(frozen=True)
class ToolStep:
    """One expert turn: a single tool call."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)


def _break_syntax(source: str) -> str:
    """The same file with one typical slip: the colon of the first block header dropped."""
    lines = source.splitlines(keepends=True)
    for index, line in enumerate(lines):
        stripped = line.rstrip()
        if stripped.endswith(":") and stripped.lstrip().startswith(("def ", "class ", "if ", "for ", "while ")):
            lines[index] = stripped[:-1] + line[len(stripped) :]
            return "".join(lines)
    return source + "\nprint((\n"


def applicable_mistakes(task: TaskSpec) -> list[Mistake]:
    """The mistakes the expert can make on this task before recovering."""
    solution = task.metadata.get("solution") or {}
    kinds: list[Mistake] = ["missing_file"]
    if any(path.endswith(".py") and _break_syntax(text) != text for path, text in solution.items()):
        kinds.append("syntax_error")
    return [*kinds, "command_typo"]


def expert_steps(task: TaskSpec, mistake: Mistake | None = None, tools: Collection[str] | None = None) -> list[ToolStep]:
    """The scripted episode: inspect, (mistake and recovery), write, run the tests, submit; with
    `tools` (the episode's tool names), a step whose tool is not offered is done with `bash`."""
    return [_with_tools(step, task, tools) for step in _script(task, mistake)]


def _with_tools(step: ToolStep, task: TaskSpec, tools: Collection[str] | None) -> ToolStep:
    if tools is None or step.tool in tools:
        return step
    if step.tool == "list_dir":
        return ToolStep("bash", {"command": "ls"})
    if step.tool == "read_file":
        return ToolStep("bash", {"command": f"cat {shlex.quote(step.arguments['path'])}"})
    if step.tool == "run_tests":
        return ToolStep("bash", {"command": task.test_command})
    raise ValueError(f"the expert needs the tool {step.tool!r}, which the episode does not offer ({', '.join(tools)})")


def _script(task: TaskSpec, mistake: Mistake | None) -> list[ToolStep]:
    solution: dict[str, str] = task.metadata.get("solution") or {}
    command: str | None = task.metadata.get("solution_command")
    if not solution and not command:
        raise ValueError(f"task {task.id} has no reference solution")
    steps = [ToolStep("list_dir")]
    if mistake == "missing_file":
        target = next(iter(solution), "solution.py")
        steps.append(ToolStep("read_file", {"path": f"src/{target}"}))  # a plausible but wrong location
    steps += [ToolStep("read_file", {"path": path}) for path in solution if path in task.files]
    writes = [ToolStep("write_file", {"path": path, "content": text}) for path, text in solution.items()]
    if mistake == "syntax_error":
        broken = next(path for path, text in solution.items() if path.endswith(".py") and _break_syntax(text) != text)
        steps += [ToolStep("write_file", {"path": broken, "content": _break_syntax(solution[broken])}), _check_step(task, solution)]
    steps += writes
    if command:
        steps.append(ToolStep("bash", {"command": command}))
    if mistake == "command_typo":
        steps.append(ToolStep("bash", {"command": "pytset -q" if task.visible_tests else "pyhton3 --version"}))
    steps.append(_check_step(task, solution))
    steps.append(ToolStep("submit"))
    return steps


def _check_step(task: TaskSpec, solution: dict[str, str]) -> ToolStep:
    """How the expert checks its work: the visible tests, or else importing the modules it wrote."""
    if task.visible_tests:
        return ToolStep("run_tests")
    modules = [path[: -len(".py")].replace("/", ".") for path in solution if path.endswith(".py")]
    return ToolStep("bash", {"command": f"python3 -c 'import {', '.join(modules)}'" if modules else "ls"})


class Demo(BaseModel):
    """One expert episode as SFT data (one JSONL line)."""

    task_id: str
    mistake: Mistake | None
    messages: list[dict[str, Any]]
    """The conversation TRL would hold: the reset prompt, then assistant turns and tool results."""
    tools: str
    """JSON of the tool schemas the prompt is rendered with (SFTTrainer's `tools` column)."""
    reward: float
    error_kinds: list[str]
    """Error kinds the service reported during the episode (the mistake's, when there was one)."""


def tool_schemas(environment: TrlEnvironment) -> list[dict[str, Any]]:
    """The JSON schemas `apply_chat_template` derives from the environment's tool methods."""
    from transformers.utils import get_json_schema

    return [get_json_schema(method) for method in environment_methods(environment)]


def prompt_tool_schemas(service_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The schemas a rollout's prompt carries for the service's tools (`CodingEnvClient.list_tools`, or a
    saved copy of them), with no service: the environment is built from them and never called."""
    return tool_schemas(environment_class(service_tools)(ClientSettings(base_url="http://127.0.0.1:9")))


def play_demo(environment: TrlEnvironment, task: TaskSpec, mistake: Mistake | None) -> Demo:
    """Play the expert script through the service and record it as TRL would."""
    row = task_row(task.id)
    messages = prompt_after_reset(row, environment.reset(**row))
    tools = {method.__name__: method for method in environment_methods(environment)}
    for step in expert_steps(task, mistake, tools):
        call = {"type": "function", "function": {"name": step.tool, "arguments": step.arguments}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        name, result, _ = dispatch(tools, call)
        messages.append(tool_message(name, result))
    messages.append({"role": "assistant", "content": FINAL_REPLY})
    return Demo(
        task_id=task.id,
        mistake=mistake,
        messages=messages,
        tools=json.dumps(tool_schemas(environment)),
        reward=environment.get_reward(),
        error_kinds=[record.error_kind.value for record in environment.tool_calls if record.error_kind is not None],
    )


def choose_mistake(task: TaskSpec, rate: float, seed: int) -> Mistake | None:
    """A seeded draw per task: no mistake with probability `1 - rate`, else one that fits the task."""
    rng = random.Random(f"{seed}:{task.id}")
    return rng.choice(applicable_mistakes(task)) if rng.random() < rate else None


def play_demos(
    tasks: list[TaskSpec],
    new_environment: Callable[[], TrlEnvironment],
    *,
    mistake_rate: float = 0.3,
    seed: int = 0,
    concurrency: int = 4,
) -> Iterator[Demo]:
    """Demos in task order as they finish, `concurrency` sessions at a time (one environment per worker)."""
    local = threading.local()
    environments: list[TrlEnvironment] = []

    def play(task: TaskSpec) -> Demo:
        if not hasattr(local, "environment"):
            local.environment = new_environment()
            environments.append(local.environment)
        return play_demo(local.environment, task, choose_mistake(task, mistake_rate, seed))

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        try:
            yield from pool.map(play, tasks)
        finally:
            for environment in environments:
                environment._close()


def write_demos(demos: Iterator[Demo], out: Path) -> tuple[int, int]:
    """Write the demos graded 1.0 as JSONL; returns (kept, played)."""
    kept = played = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        for demo in demos:
            played += 1
            if demo.reward >= 1.0:
                kept += 1
                handle.write(demo.model_dump_json() + "\n")
                handle.flush()  # a long run can be used (or stopped) while it is still going
    return kept, played


def mistake_pair(task: TaskSpec, demo: Demo) -> PreferencePair | None:
    """A DPO pair from a demo that made a mistake: at the state before it, the clean expert's action
    is preferred over the mistaken one (None for a clean demo)."""
    if demo.mistake is None:
        return None
    # The tools the expert called: the script made with them is the one the demo was played with (a
    # tool it did without, such as `read_file` done with `bash cat`, was not offered).
    called = {call["function"]["name"] for message in demo.messages for call in message.get("tool_calls") or ()}
    clean, flawed = expert_steps(task, tools=called), expert_steps(task, demo.mistake, called)
    turn = next(i for i, (a, b) in enumerate(zip(clean, flawed)) if a != b)
    at = 1 + 2 * turn  # the prompt, then an assistant turn and its tool result per step
    chosen_call = {"type": "function", "function": {"name": clean[turn].tool, "arguments": clean[turn].arguments}}
    return PreferencePair(
        state_id=f"{task.id}#{turn}",
        messages=demo.messages[:at],
        chosen={"role": "assistant", "content": "", "tool_calls": [chosen_call]},
        rejected=demo.messages[at],
        tools=json.loads(demo.tools),
        teachers=["reference-solution"],
    )


def read_demos(path: Path) -> list[Demo]:
    with open(path, encoding="utf-8") as handle:
        return [Demo.model_validate_json(line) for line in handle if line.strip()]
