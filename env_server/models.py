"""Wire types shared by the service and its clients.

Plain pydantic only: the trainer client imports this module without pulling in the server's
dependencies (FastAPI, Docker, openenv). The server layers openenv's base classes on top of
these field sets (`env_server/openenv_models.py`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from env_server.grading.in_sandbox import typed_values

TASK_SPEC_VERSION = 1
TRAJECTORY_SCHEMA_VERSION = 1
PROTOCOL_VERSION = 2
"""The newest wire protocol: an observation's `metadata` holds only what has no typed field
(`failing_tests`, `grading_ms`, `auto_reset`). Protocol 1 also repeats typed fields there under the
keys clients read before those fields existed (docs/api.md, "Protocol versions")."""
DEFAULT_PROTOCOL_VERSION = 1
"""What an episode whose reset names no `protocol` gets, for this release only (decision 121): the
next release makes it `PROTOCOL_VERSION`."""
DEFAULT_MAX_CALLS_PER_STEP = 8
"""Tool calls of one action that run, unless reset asks for another cap (`max_calls_per_step`)."""
MAX_CALLS_PER_STEP_LIMIT = 64
"""The highest cap reset accepts."""


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
    TOO_MANY_CALLS = "too_many_calls"
    """The call came after the per-step cap (`max_calls_per_step`) in a message holding several
    calls: it was not run and did not count against `max_steps`."""
    SUBMISSION_FAILED = "submission_failed"
    """A `submit` the hidden tests did not fully pass (reward below 1). Never sent by the service,
    which reports the reward, not an error; clients that judge the policy's turns (the trainer,
    `coding-train eval`) report it on the submitting turn."""


class MonitorFlag(enum.StrEnum):
    """Evidence of a shortcut instead of a solution, raised by the reward-hacking monitor on a
    tool call (`env_server.grading.monitor`) or by the grader on a submission (`env_server.grading.grader`).
    Closed: the one vocabulary of the monitor, the grader, the trajectory and the wire."""

    BYTECODE_READ = "bytecode_read"
    """A call reads compiled code or tool caches (`.pyc`, `__pycache__`, `.class`, `.mypy_cache`, ...)."""
    DECOMPILER_USE = "decompiler_use"
    """A call runs a disassembler, decompiler or archive tool (`dis`, `javap`, `unzip`, `strings`, ...)."""
    SITE_PACKAGES_PROBE = "site_packages_probe"
    """A call looks for an installed copy of the task's library (site-packages, pip, metadata)."""
    HIDDEN_TEST_PROBE = "hidden_test_probe"
    """A call names a hidden test file or the grader's report."""
    VISIBLE_TEST_EDIT = "visible_test_edit"
    """A call writes to one of the task's visible tests."""
    TEST_CONFIG_EDIT = "test_config_edit"
    """A call writes test configuration or interpreter hooks (`conftest.py`, `sitecustomize.py`, ...),
    or the grader dropped such a file from the submission."""
    VCS_HISTORY_PROBE = "vcs_history_probe"
    """A call reads version-control history (`git log`, `git show`, `.git/`)."""
    GRADER_TAMPER = "grader_tamper"
    """Set by the grader: submitted code reaches into pytest, its report or the process (reward 0)."""
    GRADING_STRAY_PROCESS = "grading_stray_process"
    """Set by the grader: a process of the test run outlived it, or the guard did not report (reward 0)."""
    GRADING_UNKNOWN_TEST = "grading_unknown_test"
    """Set by the grader: the report holds a test the hidden files do not define (it is ignored)."""


class TaskLimits(BaseModel):
    """Per-task budgets. Bounded, so an inline task spec cannot hold a session or a grader hostage."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=30, ge=1, le=1000)
    """Tool calls allowed before the episode is graded automatically."""

    step_timeout_s: float = Field(default=30.0, gt=0, le=600)
    """Default timeout of one tool call (bash may ask for less, never more)."""

    grade_timeout_s: float = Field(default=120.0, gt=0, le=1800)
    """Timeout of the hidden-test run (or of the whole call table) at grading time."""

    call_timeout_s: float = Field(default=5.0, gt=0, le=60)
    """Timeout of one call of a call-table task (`TaskSpec.hidden_calls`); a call past it fails."""


_IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"


class CallCheck(BaseModel):
    """One hidden check of a call-table task: `module.function(*args, **kwargs)` must return
    `expected`, or raise `raises`.

    Call-table grading (`TaskSpec.hidden_calls`) keeps the verdict out of the solution's reach:
    only `module`, `function` and the arguments enter the grading sandbox, where a trusted,
    stdlib-only harness imports the solution in a fresh process per few calls, runs each call
    under `TaskLimits.call_timeout_s` and prints the result in the strict typed encoding of
    `env_server.grading.in_sandbox.typed_values` (exact types only; a subclass, a custom object or a NaN is
    unencodable and fails). The host compares it with `expected`, which never enters the
    sandbox: same type everywhere, same value, floats within `rel_tol`/`abs_tol`. So forging
    the harness's output needs the right answers. Values here are *encoded*; build checks from
    plain Python values with `CallCheck.build`.
    """

    model_config = ConfigDict(extra="forbid")

    module: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", max_length=200)
    """Dotted module name, imported with the workspace root on `sys.path` (e.g. `solution`)."""

    function: str = Field(pattern=_IDENTIFIER, max_length=200)
    """Name of the callable in `module`."""

    args: list[Any] = Field(default_factory=list)
    """Positional arguments, each encoded (`typed_values.encode_strict`)."""

    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments, values encoded."""

    expected: Any = None
    """The encoded result the call must return; unused when `raises` or `judge` is set."""

    raises: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$", max_length=200)
    """The exception class the call must raise, exactly (not a subclass): a builtin's name
    (`ValueError`) or `module.QualName`."""

    expected_args: list[Any] | None = None
    """The encoded positional arguments as they must be after the call (catches a function that
    mutates its input); None: not checked."""

    json_result: bool = False
    """Pass the result through `json.dumps`/`json.loads` before encoding it (tuples become lists,
    keys strings), for tasks whose expected outputs are JSON data."""

    judge: str | None = Field(default=None, max_length=200)
    """Name of a trusted host-side judge (`env_server.grading.call_checks.JUDGES`) that decides from the
    decoded arguments and result, for calls whose right answer is not unique."""

    rel_tol: float = Field(default=1e-9, ge=0, le=1)
    """Relative tolerance of float comparisons (`math.isclose`)."""

    abs_tol: float = Field(default=0.0, ge=0, le=1)
    """Absolute tolerance of float comparisons (`math.isclose`)."""

    @model_validator(mode="after")
    def _well_formed(self) -> Self:
        try:
            checked = [*self.args, *self.kwargs.values(), *(self.expected_args or [])]
            for value in [*checked, *([] if self.raises or self.judge else [self.expected])]:
                typed_values.decode(value)
        except (typed_values.Unencodable, ValueError, TypeError) as error:
            raise ValueError(f"call check values must be typed encodings (CallCheck.build makes them): {error}") from None
        for name in self.kwargs:
            if not re.fullmatch(_IDENTIFIER, name):
                raise ValueError(f"keyword argument name is not an identifier: {name!r}")
        return self

    @classmethod
    def build(
        cls,
        module: str,
        function: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        expected: Any = None,
        raises: type[BaseException] | str | None = None,
        expected_args: Sequence[Any] | None = None,
        json_result: bool = False,
        judge: str | None = None,
        rel_tol: float = 1e-9,
        abs_tol: float = 0.0,
    ) -> CallCheck:
        """A check from plain Python values (raises `typed_values.Unencodable` for values
        outside the strict types). `raises` may be the exception class itself."""
        if isinstance(raises, type):
            raises = raises.__name__ if raises.__module__ == "builtins" else f"{raises.__module__}.{raises.__qualname__}"
        return cls(
            module=module,
            function=function,
            args=[typed_values.encode_strict(value) for value in args],
            kwargs={name: typed_values.encode_strict(value) for name, value in (kwargs or {}).items()},
            expected=None if raises or judge else typed_values.encode_strict(expected),
            raises=raises,
            expected_args=None if expected_args is None else [typed_values.encode_strict(value) for value in expected_args],
            json_result=json_result,
            judge=judge,
            rel_tol=rel_tol,
            abs_tol=abs_tol,
        )


def workspace_path(path: str) -> str:
    """`path` normalised, if it is relative and stays inside the workspace; ValueError otherwise."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or "\\" in path or "\x00" in path or not pure.parts:
        raise ValueError(f"paths must be relative and inside the workspace: {path!r}")
    return pure.as_posix()


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
    """Tests that grade the submission with pytest; they never enter the sandbox before grading."""

    hidden_calls: list[CallCheck] = Field(default_factory=list, max_length=10_000)
    """Checks that grade the submission by call table (see `CallCheck`); a task has these or
    `hidden_tests`, not both. Preferred wherever the task is a function's behaviour."""

    hidden_files: dict[str, str] = Field(default_factory=dict)
    """Data files the hidden checks read (relative path -> text), written into the grading
    workspace over whatever the agent left there; they never enter the agent's sandbox."""

    grade_command: str = "python3 -m pytest -q -p no:cacheprovider"
    """Command run at grading time, with the hidden tests in place; pytest-style output is parsed."""

    reward_mode: Literal["fraction", "binary"] = "binary"
    """`binary` (the default): 1.0 only if every hidden test (or call) passes, else 0.
    `fraction` (opt-in): passed/total. Partial credit pays a constant or an echo that happens to
    match some hidden outputs, so a task opts in only where the validity gate shows that no trivial
    baseline earns any of it (docs/decisions/054-all-or-nothing-reward.md)."""

    limits: TaskLimits = Field(default_factory=TaskLimits)
    """Step and time budgets."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    """Suite-specific facts (source, license, difficulty); never shown to the agent."""

    def reward_for(self, passed: int, total: int) -> float:
        """The reward of a submission that passed `passed` of `total` hidden checks."""
        if total == 0:
            return 0.0
        if self.reward_mode == "binary":
            return 1.0 if passed == total else 0.0
        return passed / total

    @field_validator("files", "visible_tests", "hidden_tests", "hidden_files")
    @classmethod
    def _paths_inside_workspace(cls, files: dict[str, str]) -> dict[str, str]:
        return {workspace_path(path): text for path, text in files.items()}

    @model_validator(mode="after")
    def _one_grading_mode(self) -> Self:
        if self.hidden_tests and self.hidden_calls:
            raise ValueError("a task grades with hidden_tests or hidden_calls, not both")
        return self


class CallFields(BaseModel):
    """The fields a call's result says (not a result by itself): shared by `CallResult`, and by
    `StepObservation`, whose top level reads as one call for clients that know one call per step."""

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

    underlying_error_kind: ErrorKind | None = None
    """When `error_kind` is `repeated_failure`: the kind that repeated."""


class CallResult(CallFields):
    """The wire result of one call: one of the tool calls a step found in its action, in the order
    they were found."""

    arguments: dict[str, Any] | None = None
    """The arguments executed, after parsing and repair; None when the call could not be resolved
    (unknown tool, arguments that are not JSON or do not fit the schema, no call in the message)."""

    ran: bool = True
    """False when the call was not run at all: it came after the per-step cap (`error_kind:
    too_many_calls`) or after a call that ended the episode (`error_kind: null`). A call that
    failed to parse or validate did run (and failed). Every call that ran counts against `max_steps`."""

    monitor_flags: list[MonitorFlag] = Field(default_factory=list)
    """What the reward-hacking monitor flagged in this call."""


class StepObservation(CallFields):
    """The wire result of one step, the typed fields of its observation, as the policy's
    environment sees it (the service records it in the trajectory as is). A step runs every call
    its action holds (one for `call_tool`, each call found in an `assistant_message`): `calls` has
    one result per call. The fields shared with `CallResult` describe the step as one call would:
    `output` is every call's output (a single call's unchanged); `tool_name`, `exit_code`,
    `error_kind`, `hint` and `underlying_error_kind` are the first failed call's, or the last run
    call's when none failed; `truncated` is any call's; `duration_ms` the whole step's. The fields
    after them say how the step bears on the episode: monitor flags, the grade when the step graded
    the workspace, and how the episode ended."""

    step_monitor_flags: list[MonitorFlag] = Field(default_factory=list)
    """What the reward-hacking monitor flagged in this step's calls (sorted, each flag once)."""

    episode_monitor_flags: list[MonitorFlag] | None = None
    """On the step that ends the episode: every flag of the episode, the grader's own included
    (sorted; the monitor penalty counts these). None on the steps before."""

    tests_passed: int | None = None
    """When the step graded the workspace: hidden tests (or calls) that passed; None otherwise."""

    tests_total: int | None = None
    """When the step graded the workspace: hidden tests (or calls) that count; None otherwise."""

    step_limit_reached: bool = False
    """This step used the last of the task's `max_steps`, so the workspace was graded after it."""

    end_reason: str | None = None
    """Set when a failure ended the episode (the workspace could not be graded, the sandbox died,
    the infrastructure failed): why. None when the episode goes on or ended by grading."""

    aborted: bool = False
    """With `end_reason`: true when the failure is the infrastructure's (reward null: nothing to
    learn from), false when it is the agent's (reward 0)."""

    calls: list[CallResult] = Field(default_factory=list)
    """One result per call found in the action, in order, run or not (an action in which no call
    could be found has one: the failure)."""

    calls_found: int = 0
    """How many calls the action held (the length of `calls`)."""

    calls_run: int = 0
    """How many of them ran, and so counted against `max_steps`."""


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

    tool_call_format: str | None = None
    """The tool-call family the episode's `assistant_message` actions are parsed as (one of
    `env_server.tool_call_parser.TOOL_CALL_FAMILIES`); None: detected per message."""

    max_calls_per_step: int = Field(default=DEFAULT_MAX_CALLS_PER_STEP, ge=1, le=MAX_CALLS_PER_STEP_LIMIT)
    """Calls of one action that run; the ones after are answered `too_many_calls`, not run."""

    protocol: int = Field(default=DEFAULT_PROTOCOL_VERSION, ge=1, le=PROTOCOL_VERSION)
    """The wire protocol of the episode's observations (`PROTOCOL_VERSION` and before): 1 repeats
    typed fields in `metadata` under their old keys, 2 does not."""

    tools: list[str] | None = Field(default=None, min_length=1)
    """The episode's tools, by name (from `GET /tools`; `submit` is always one of them); None: every tool.
    A smaller set is a shorter prompt for a small model; a call to a tool outside it is `tool_not_found`."""


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
    """The model's whole assistant message; the server extracts every tool call in it and runs
    them in order within the step (up to the episode's `max_calls_per_step`)."""

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
    tool_call_format: str | None = None
    """The tool-call family pinned at reset, or None (detected per message)."""
    max_calls_per_step: int | None = None
    """Calls of one action that run (set at reset)."""
    tools: list[str] | None = None
    """The episode's tools (set at reset)."""
    sandbox_id: str | None = None
    """Id of the session's sandbox (the `coding-env.sandbox-id` container label), for operators."""


class ApiErrorCode(str, enum.Enum):
    """Why a request was refused (HTTP 4xx/5xx body, WebSocket error frame). Closed."""

    INVALID_JSON = "invalid_json"
    INVALID_REQUEST = "invalid_request"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    """A privileged route (`GET /references/...`) without the privileged token, or on a service that has none."""
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BODY_TOO_LARGE = "body_too_large"
    SESSION_NOT_FOUND = "session_not_found"
    TASK_NOT_FOUND = "task_not_found"
    NO_REFERENCE = "no_reference"
    """The task carries no reference solution (`GET /references/...`)."""
    EPISODE_NOT_STARTED = "episode_not_started"
    EPISODE_DONE = "episode_done"
    CAPACITY_REACHED = "capacity_reached"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    INTERNAL_ERROR = "internal_error"
    SESSION_LOST = "session_lost"
    """Answered by the proxy in front of replicas (deploy/nginx), never by a replica: the replica that
    owns the session is unreachable, so the episode is lost; open a new session."""
    REPLICA_UNAVAILABLE = "replica_unavailable"
    """Answered by the proxy in front of replicas: no replica answered a request any of them could serve."""


class ApiError(BaseModel):
    """Body of every non-2xx response of the service."""

    code: ApiErrorCode
    message: str
    detail: Any = None
    """Structured extra facts (validation errors, capacity figures)."""


class SessionCreated(BaseModel):
    """Answer of `POST /sessions`."""

    session_id: str


MAX_FORKS_PER_CALL = 256
"""Most copies one fork request may ask for (the session cap bounds it further)."""


class ForkRequestBody(BaseModel):
    """Body of `POST /sessions/{id}/fork` and `data` of a WebSocket `fork` frame."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(ge=1, le=MAX_FORKS_PER_CALL)
    """How many independent copies of the session's episode to make; each is a new session."""


class SessionsForked(BaseModel):
    """Answer of a fork: the new sessions, each continuing the source's episode from the same point."""

    session_ids: list[str]


class TaskPage(BaseModel):
    """Answer of `GET /tasks`."""

    task_ids: list[str]
    total: int
    offset: int
    limit: int


class TaskReference(BaseModel):
    """Answer of `GET /references/{task_id}`: what solves a task, for a trainer's privileged teacher
    (decision 129). Never an agent's: the route needs the service's privileged token."""

    task_id: str
    diff: str
    """A unified diff from the task's workspace to a solved one (`a/PATH` -> `b/PATH`; a new file in full)."""
    command: str | None = None
    """A shell command that solves the task in its workspace, where the reference is one (shell tasks)."""


class TrajectoryStep(BaseModel):
    """One recorded step of an episode."""

    index: int
    action: dict[str, Any]
    """The action as received (tool name and arguments, or the raw message)."""
    parsed_call: dict[str, Any] | None = None
    """The step's first call as executed after parsing and repair (`{"tool_name", "arguments"}`), or
    None if it could not be resolved; every call's is in `observation.calls`."""
    observation: StepObservation
    reward: float | None = None
    done: bool = False
    started_at: float
    """Unix time the step began."""
    monitor_flags: list[MonitorFlag] = Field(default_factory=list)
    """What the monitor flagged in this step's calls (each call's own: `observation.calls`)."""


class EpisodeEnding(enum.StrEnum):
    """How an episode ended: the first four by a step, the last two by the client leaving it."""

    SUBMITTED = "submitted"
    """The agent submitted; the workspace was graded."""
    STEP_LIMIT = "step_limit"
    """The agent used the task's last step; the workspace was graded after it."""
    FAILED = "failed"
    """A failure on the agent's account ended it (its sandbox died, grading could not run): reward 0."""
    ABORTED = "aborted"
    """The infrastructure failed: no reward to learn from."""
    ABANDONED = "abandoned"
    """The session was reset onto another episode before this one ended: never graded."""
    CLOSED = "closed"
    """The session closed before the episode ended: never graded."""


class EpisodeRecord(BaseModel):
    """One episode, finished or left unfinished: the JSONL line the service writes and the trainer ingests."""

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
    monitor_flags: list[MonitorFlag] = Field(default_factory=list)
    """Every flag of the episode, the grader's own included."""
    started_at: float
    ended_at: float | None = None
    ending: EpisodeEnding | None = None
    """How it ended; None while it goes on. Only `submitted` and `step_limit` episodes were graded."""


class EpisodeSummary(BaseModel):
    """One ended episode in a line: what `GET /episodes` lists and the viewer's index shows."""

    episode_id: str
    session_id: str
    task_id: str
    ending: EpisodeEnding | None
    reward: float | None
    tests_passed: int | None
    tests_total: int | None
    steps: int
    error_kinds: dict[str, int]
    """How often each error kind answered a call of the episode."""
    monitor_flags: list[MonitorFlag]
    started_at: float
    ended_at: float | None

    @classmethod
    def of(cls, record: EpisodeRecord) -> EpisodeSummary:
        kinds: dict[str, int] = {}
        for step in record.steps:
            for call in step.observation.calls:
                if call.error_kind is not None:
                    kinds[call.error_kind.value] = kinds.get(call.error_kind.value, 0) + 1
        return cls(
            **record.model_dump(include={"episode_id", "session_id", "task_id", "ending", "reward", "tests_passed",
                                         "tests_total", "monitor_flags", "started_at", "ended_at"}),
            steps=len(record.steps),
            error_kinds=kinds,
        )


class EpisodePage(BaseModel):
    """Answer of `GET /episodes`: the service's recently ended episodes, newest first."""

    episodes: list[EpisodeSummary]
    total: int
    """Episodes kept (`recent_episodes`), of which `episodes` is the page asked for."""
    offset: int
    limit: int
