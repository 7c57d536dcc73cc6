"""Wire types shared by the service and its clients.

Plain pydantic only: the trainer client imports this module without pulling in the server's
dependencies (FastAPI, Docker, openenv). The server layers openenv's base classes on top of
these field sets (see `env_server/environment.py`).
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TASK_SPEC_VERSION = 1
TRAJECTORY_SCHEMA_VERSION = 1


class ErrorKind(str, enum.Enum):
    """What went wrong in one tool call. Closed: clients may switch on it exhaustively."""

    TOOL_NOT_FOUND = "tool_not_found"
    JSON_DECODE = "json_decode"
    TYPE_ERROR = "type_error"
    RUNTIME_ERROR = "runtime_error"
    NONZERO_EXIT = "nonzero_exit"
    COMMAND_NOT_FOUND = "command_not_found"
    PERMISSION_DENIED = "permission_denied"
    FILE_NOT_FOUND = "file_not_found"
    SYNTAX_ERROR = "syntax_error"
    TIMEOUT = "timeout"
    OOM = "oom"
    TEST_FAILURE = "test_failure"
    REPEATED_FAILURE = "repeated_failure"
    SANDBOX_ERROR = "sandbox_error"


class TaskLimits(BaseModel):
    """Per-task budgets."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=30, ge=1)
    """Tool calls allowed before the episode is graded automatically."""

    step_timeout_s: float = Field(default=30.0, gt=0)
    """Default timeout of one tool call (bash may ask for less, never more)."""

    grade_timeout_s: float = Field(default=120.0, gt=0)
    """Timeout of the hidden-test run at grading time."""


class TaskSpec(BaseModel):
    """A coding task, versioned. Everything the sandbox and the grader need, nothing else."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = TASK_SPEC_VERSION
    """Version of this format."""

    id: str = Field(min_length=1, max_length=256)
    """Stable id, `suite/name` (e.g. `humaneval/HumanEval/0`)."""

    prompt: str
    """Task statement shown to the agent at reset."""

    files: dict[str, str] = Field(default_factory=dict)
    """Workspace files (relative path -> text) written before the agent starts."""

    visible_tests: dict[str, str] = Field(default_factory=dict)
    """Tests the agent may read and run with `run_tests` (relative path -> text)."""

    test_command: str = "python3 -m pytest -q -p no:cacheprovider"
    """Command `run_tests` executes in the workspace."""

    hidden_tests: dict[str, str] = Field(default_factory=dict)
    """Tests that grade the submission; they never enter the sandbox before grading."""

    grade_command: str = "python3 -m pytest -q -p no:cacheprovider"
    """Command run at grading time, with the hidden tests in place; pytest-style output is parsed."""

    reward_mode: Literal["fraction", "binary"] = "fraction"
    """`fraction`: passed/total; `binary`: 1.0 only if every hidden test passes."""

    limits: TaskLimits = Field(default_factory=TaskLimits)
    """Step and time budgets."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    """Suite-specific facts (source, license, difficulty); never shown to the agent."""


class ToolResult(BaseModel):
    """The typed outcome of one tool call, as the policy's environment sees it."""

    tool_name: str
    """Tool that was called (as requested, even when unknown)."""

    output: str = ""
    """Text the policy sees: stdout and stderr, or the tool's answer, or the error message."""

    exit_code: int | None = None
    """Exit status for command-like tools; None for file tools."""

    error_kind: ErrorKind | None = None
    """Typed classification of the failure, or None on success."""

    hint: str | None = None
    """Short corrective hint when `error_kind` is set; shown in `output` only if reset asked for `show_hints`."""

    truncated: bool = False
    """Output exceeded the cap and its middle was dropped."""

    duration_ms: float = 0.0
    """Wall-clock time of the tool call inside the service."""


class ResetInfo(BaseModel):
    """What reset tells the agent about its task."""

    task_id: str
    prompt: str
    tools: list[dict[str, Any]]
    """OpenAI-style function schemas of the available tools."""
    max_steps: int


class ResetRequestBody(BaseModel):
    """Body of `POST /reset` and `POST /sessions/{id}/reset`."""

    model_config = ConfigDict(extra="allow")

    task_id: str | None = None
    """Id of a registered task; ignored when `task` is given."""

    task: TaskSpec | None = None
    """Inline task spec."""

    seed: int | None = None
    """Picks a task when neither `task_id` nor `task` is given."""

    episode_id: str | None = None
    show_hints: bool = False
    """Append hints to the tool output the policy sees."""


class TrajectoryStep(BaseModel):
    """One recorded step of an episode."""

    index: int
    action: dict[str, Any]
    """The action as received (tool name and arguments, or the raw message)."""
    observation: ToolResult
    reward: float | None = None
    done: bool = False
    started_at: float
    """Unix time the step began."""
    monitor_flags: list[str] = Field(default_factory=list)


class EpisodeRecord(BaseModel):
    """One finished episode: the JSONL line the service writes and the trainer ingests."""

    schema_version: Literal[1] = TRAJECTORY_SCHEMA_VERSION
    session_id: str
    episode_id: str
    task_id: str
    prompt: str
    tools: list[dict[str, Any]] = Field(default_factory=list)
    steps: list[TrajectoryStep] = Field(default_factory=list)
    reward: float | None = None
    tests_passed: int | None = None
    tests_total: int | None = None
    monitor_flags: list[str] = Field(default_factory=list)
    started_at: float
    ended_at: float | None = None
