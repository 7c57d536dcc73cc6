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
    NO_TOOL_CALL = "no_tool_call"
    """An assistant turn that called no tool before the episode was submitted (reported by
    clients that see the model's turns, e.g. the trainer; the service itself never sees one)."""
    GRADING_ERROR = "grading_error"
    """Preparing or grading the submission failed because of what the workspace holds
    (unreadable files, a directory where a test goes, a workspace over the size limit). The
    episode ends with reward 0: the agent's doing, never the infrastructure's."""


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

    setup_command: str | None = None
    """Shell command run in the workspace after `files` are written, before the agent starts
    (builds fixtures, e.g. a shell task's log files). Its effects reach grading only through
    the workspace, like the agent's own changes."""

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


class ListToolsAction(BaseModel):
    """Ask for the tool schemas (OpenEnv MCP action; needs no reset)."""

    type: Literal["list_tools"] = "list_tools"


class ToolCallAction(BaseModel):
    """Call one tool (OpenEnv MCP action, widened: `arguments` may be raw JSON text)."""

    type: Literal["call_tool"] = "call_tool"
    tool_name: str
    """Name of the tool; an unknown name yields `error_kind: tool_not_found`."""

    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """Arguments object, or the model's JSON text for it (repaired server-side; `json_decode` if hopeless)."""


class AssistantMessageAction(BaseModel):
    """The model's whole assistant message; the server extracts the first tool call from it."""

    type: Literal["assistant_message"] = "assistant_message"
    content: str
    """Raw text: `<tool_call>{...}</tool_call>`, `<function=NAME><parameter=K>V</parameter></function>` or fenced JSON, with prose around it."""


class EpisodeState(BaseModel):
    """What `state` reports about the current episode (beyond OpenEnv's episode_id/step_count)."""

    session_id: str | None = None
    task_id: str | None = None
    done: bool = False
    reward: float | None = None
    max_steps: int | None = None
    show_hints: bool = False
    sandbox_id: str | None = None
    """Id of the session's sandbox (the `coding-env.sandbox-id` container label), for operators."""


class ApiErrorCode(str, enum.Enum):
    """Why a request was refused (HTTP 4xx/5xx body, WebSocket error frame). Closed."""

    INVALID_JSON = "invalid_json"
    INVALID_REQUEST = "invalid_request"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BODY_TOO_LARGE = "body_too_large"
    SESSION_NOT_FOUND = "session_not_found"
    TASK_NOT_FOUND = "task_not_found"
    EPISODE_NOT_STARTED = "episode_not_started"
    EPISODE_DONE = "episode_done"
    CAPACITY_REACHED = "capacity_reached"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    INTERNAL_ERROR = "internal_error"


class ApiError(BaseModel):
    """Body of every non-2xx response of the service."""

    code: ApiErrorCode
    message: str
    detail: Any = None
    """Structured extra facts (validation errors, capacity figures)."""


class SessionCreated(BaseModel):
    """Answer of `POST /sessions`."""

    session_id: str


class TaskPage(BaseModel):
    """Answer of `GET /tasks`."""

    task_ids: list[str]
    total: int
    offset: int
    limit: int


class TrajectoryStep(BaseModel):
    """One recorded step of an episode."""

    index: int
    action: dict[str, Any]
    """The action as received (tool name and arguments, or the raw message)."""
    parsed_call: dict[str, Any] | None = None
    """The call the service executed after parsing and repair (`{"tool_name", "arguments"}`), or None if none."""
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
