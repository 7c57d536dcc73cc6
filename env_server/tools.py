"""The coding tools, declared once: typed signatures and docstrings become the JSON schemas that
reset, `list_tools` and MCP `tools/list` publish, and the argument validation of every call.

A tool is a function `(workspace, **arguments) -> CallOutcome`; `@tool` registers it. The tools that only
run a command are coroutine functions: the service awaits their exec on its event loop, with no thread
between a step and its command (`Tool.call`); the others block, and run on a worker thread.
Parameter descriptions live in `Annotated[..., Field(description=...)]`. Keyword-only parameters
are not the agent's: the environment passes them (`submit` gets the episode's monitor flags).
"""

from __future__ import annotations

import asyncio
import inspect
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Awaitable, Callable, TypeVar

from pydantic import BaseModel, ConfigDict, Field, create_model

from env_server.error_kinds import classify_exec, classify_os_error
from env_server.grading.grader import GradeResult, GradingConfig, grade
from env_server.models import ErrorKind, MonitorFlag, TaskSpec
from sandbox import ExecResult, Sandbox

SEARCH_MAX_LINES = 200
"""`search` stops after this many matching lines (the agent should narrow the pattern)."""


@dataclass
class Workspace:
    """What a tool acts on: the session's sandbox, its task, and what grading needs."""

    sandbox: Sandbox
    task: TaskSpec
    fresh_sandbox: Callable[[], Sandbox]
    """Opens the clean sandbox the hidden tests run in (a warm-pool checkout)."""
    retire: Callable[[Sandbox], None]
    """Disposes of that sandbox once its checks ran (the service's closes it in the background)."""
    grading: GradingConfig = field(default_factory=GradingConfig)
    """How `submit` grades (the service sets the monitor penalty)."""


@dataclass(frozen=True)
class EpisodeEnd:
    """Why a failure ended the episode (a graded submission needs no such reason)."""

    reason: str
    aborted: bool
    """True: the infrastructure failed (reward None, nothing to learn from); False: the agent's doing (reward 0)."""


@dataclass
class CallOutcome:
    """What one call produced inside the service (the internal outcome; `CallResult` is its wire
    form), before its hint: the tool's answer, the grade when the call graded the workspace, and the
    failure that ended the episode if one did."""

    output: str
    exit_code: int | None = None
    error_kind: ErrorKind | None = None
    truncated: bool = False
    grade: GradeResult | None = None
    """The verdict on the workspace, when this step graded it (`submit`, or the step limit)."""
    end: EpisodeEnd | None = None
    """Set when a failure ended the episode; with `grade` too when the workspace could not be graded."""
    step_limit_reached: bool = False
    """The step used the task's last step, so the workspace was graded after it."""

    @property
    def done(self) -> bool:
        return self.grade is not None or self.end is not None

    @property
    def reward(self) -> float | None:
        """The grade's reward; 0 for an episode the agent ended by failing; None otherwise."""
        if self.grade is not None:
            return self.grade.reward
        return 0.0 if self.end is not None and not self.end.aborted else None


@dataclass(frozen=True)
class Tool:
    """One registered tool: its name, description, argument model and implementation."""

    name: str
    description: str
    arguments: type[BaseModel]
    run: Callable[..., CallOutcome | Awaitable[CallOutcome]]

    async def call(self, workspace: Workspace, **arguments: Any) -> CallOutcome:
        """Run the tool: a coroutine tool on the caller's event loop, a blocking one on a worker thread."""
        if inspect.iscoroutinefunction(self.run):
            return await self.run(workspace, **arguments)
        return await asyncio.to_thread(self.run, workspace, **arguments)

    def openai_schema(self) -> dict[str, Any]:
        """OpenAI function-calling format (what chat templates and TRL expect)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters()}}

    def mcp_schema(self) -> dict[str, Any]:
        """MCP `tools/list` entry."""
        return {"name": self.name, "description": self.description, "inputSchema": self.parameters()}

    def parameters(self) -> dict[str, Any]:
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema


TOOLS: dict[str, Tool] = {}
F = TypeVar("F", bound=Callable[..., Any])


def tool(fn: F) -> F:
    """Register `fn` as a tool; its parameters after `workspace` become the argument schema
    (keyword-only ones excepted: the environment passes those)."""
    params = [p for p in list(inspect.signature(fn, eval_str=True).parameters.values())[1:] if p.kind is not p.KEYWORD_ONLY]
    fields: dict[str, Any] = {
        p.name: (p.annotation, ... if p.default is inspect.Parameter.empty else p.default) for p in params
    }
    arguments = create_model(f"{fn.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    TOOLS[fn.__name__] = Tool(fn.__name__, inspect.cleandoc(fn.__doc__ or ""), arguments, fn)
    return fn


def _exec_outcome(result: ExecResult, *, tests_expected: bool = False) -> CallOutcome:
    parts = [result.stdout.rstrip("\n"), result.stderr.rstrip("\n")]
    text = "\n".join(p for p in parts if p)
    kind = classify_exec(result, tests_expected=tests_expected)
    if kind is ErrorKind.OOM:
        text += "\n[killed: out of memory]"
    elif kind is ErrorKind.TIMEOUT:
        text += "\n[killed: timed out]"
    elif result.exit_code not in (0, None):
        text += f"\n[exit code {result.exit_code}]"
    return CallOutcome(text.lstrip("\n"), result.exit_code, kind, result.truncated)


def _python_syntax_error(path: str, content: str) -> str | None:
    """The SyntaxError a `.py` file would raise on import, checked without running it."""
    if not path.endswith(".py"):
        return None
    try:
        compile(content, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
    except (ValueError, RecursionError, MemoryError):
        return None
    return None


def _file_error(path: str, exc: OSError) -> CallOutcome:
    return CallOutcome(f"{path}: {exc.strerror or type(exc).__name__}", error_kind=classify_os_error(exc))


def _capped(text: str, cap: int) -> CallOutcome:
    """A file's text as the policy sees it: over `cap` characters, head and tail are kept, as for
    command output (a multi-megabyte file would otherwise flood the context and the response)."""
    if len(text) <= cap:
        return CallOutcome(text)
    half = cap // 2
    return CallOutcome(f"{text[:half]}\n[... {len(text) - 2 * half} characters truncated ...]\n{text[-half:]}", truncated=True)


def _write(ws: Workspace, path: str, content: str, verb: str) -> CallOutcome:
    """Write a file and report it, flagging Python that does not compile (the file is kept)."""
    try:
        ws.sandbox.write_file(path, content)
    except OSError as exc:
        return _file_error(path, exc)
    error = _python_syntax_error(path, content)
    if error:
        return CallOutcome(f"{verb} {path}, but it does not compile: {error}", error_kind=ErrorKind.SYNTAX_ERROR)
    return CallOutcome(f"{verb} {path} ({content.count(chr(10)) + 1} lines)")


@tool
async def bash(
    ws: Workspace,
    command: Annotated[str, Field(description="Shell command, run with `bash -c` in the workspace.")],
    timeout_s: Annotated[
        float | None, Field(gt=0, description="Seconds before the command is killed (capped by the task's limit).")
    ] = None,
) -> CallOutcome:
    """Run a shell command in the workspace and return its output (stdout, then stderr)."""
    limit = ws.task.limits.step_timeout_s
    return _exec_outcome(await ws.sandbox.exec_async(command, timeout_s=min(timeout_s or limit, limit)))


@tool
def read_file(
    ws: Workspace,
    path: Annotated[str, Field(description="File path, relative to the workspace.")],
    start_line: Annotated[int | None, Field(ge=1, description="First line to return (1-based).")] = None,
    end_line: Annotated[int | None, Field(ge=1, description="Last line to return (inclusive).")] = None,
) -> CallOutcome:
    """Return the text of a file, optionally only lines start_line..end_line."""
    try:
        text = ws.sandbox.read_file(path).decode("utf-8", errors="replace")
    except OSError as exc:
        return _file_error(path, exc)
    cap = ws.sandbox.spec.output_cap_bytes
    if start_line is None and end_line is None:
        return _capped(text, cap)
    lines = text.splitlines(keepends=True)
    return _capped("".join(lines[(start_line or 1) - 1 : end_line]), cap)


@tool
def write_file(
    ws: Workspace,
    path: Annotated[str, Field(description="File path, relative to the workspace; parent folders are created.")],
    content: Annotated[str, Field(description="Complete new content of the file.")],
) -> CallOutcome:
    """Create or overwrite a file with the given content."""
    return _write(ws, path, content, "Wrote")


@tool
def edit_file(
    ws: Workspace,
    path: Annotated[str, Field(description="File path, relative to the workspace.")],
    old_str: Annotated[str, Field(min_length=1, description="Exact text to replace; must occur exactly once.")],
    new_str: Annotated[str, Field(description="Replacement text.")],
) -> CallOutcome:
    """Replace the single occurrence of old_str in a file with new_str."""
    try:
        text = ws.sandbox.read_file(path).decode("utf-8", errors="replace")
    except OSError as exc:
        return _file_error(path, exc)
    count = text.count(old_str)
    if count != 1:
        where = "does not occur" if count == 0 else f"occurs {count} times"
        return CallOutcome(f"old_str {where} in {path}; it must match exactly once.", error_kind=ErrorKind.RUNTIME_ERROR)
    return _write(ws, path, text.replace(old_str, new_str, 1), "Edited")


@tool
async def list_dir(
    ws: Workspace,
    path: Annotated[str, Field(description="Folder, relative to the workspace.")] = ".",
) -> CallOutcome:
    """List the entries of a folder (folders end with /)."""
    return _exec_outcome(await ws.sandbox.exec_async(f"ls -1Ap -- {shlex.quote(path)}"))


@tool
async def search(
    ws: Workspace,
    pattern: Annotated[str, Field(min_length=1, description="Extended regular expression (grep -E).")],
    path: Annotated[str, Field(description="File or folder to search, relative to the workspace.")] = ".",
) -> CallOutcome:
    """Search files for a regular expression; returns matching lines as path:line:text."""
    result = await ws.sandbox.exec_async(f"grep -rnIE -- {shlex.quote(pattern)} {shlex.quote(path)}")
    if result.exit_code == 1 and not result.stderr:
        return CallOutcome("No matches.", exit_code=1)
    outcome = _exec_outcome(result)
    lines = outcome.output.splitlines()
    if outcome.error_kind is None and len(lines) > SEARCH_MAX_LINES:
        outcome.output = "\n".join(lines[:SEARCH_MAX_LINES]) + f"\n[{len(lines) - SEARCH_MAX_LINES} more matches: narrow the pattern]"
    return outcome


NO_TESTS_COLLECTED = 5
"""pytest's exit code when it collected no test: the task shows none (every HumanEval task, say)."""


@tool
async def run_tests(ws: Workspace) -> CallOutcome:
    """Run the task's visible tests and return their output."""
    result = await ws.sandbox.exec_async(ws.task.test_command, timeout_s=ws.task.limits.step_timeout_s)
    if result.exit_code == NO_TESTS_COLLECTED and not ws.task.visible_tests and "no tests ran" in result.stdout:
        # Not a failure of the policy's (no error kind, so no hint site): the task has nothing to run.
        return CallOutcome("This task has no visible tests. Check your code by running it with bash, then submit.", result.exit_code)
    return _exec_outcome(result, tests_expected=True)


@tool
def submit(ws: Workspace, *, monitor_flags: Sequence[MonitorFlag] = ()) -> CallOutcome:
    """Finish the episode: grade the workspace with the hidden tests and return the reward."""
    result = grade(ws.sandbox, ws.task, fresh_sandbox=ws.fresh_sandbox, retire=ws.retire, monitor_flags=monitor_flags, config=ws.grading)
    if result.error_kind is not None:  # the workspace could not be graded: the agent's doing, reward 0
        summary = f"Submitted, but grading failed: {result.error}. Reward {result.reward:.3f}."
        return CallOutcome(summary, error_kind=result.error_kind, grade=result, end=EpisodeEnd(result.error or summary, aborted=False))
    summary = f"Submitted: {result.tests_passed}/{result.tests_total} hidden tests passed, reward {result.reward:.3f}."
    return CallOutcome(summary, grade=result)


TOOL_SCHEMAS: dict[str, dict[str, Any]] = {name: t.openai_schema() for name, t in TOOLS.items()}
"""Every tool's OpenAI function schema, by name, in the service's order (what reset publishes)."""
