"""Service configuration, read from `CODING_ENV_*` environment variables.

Nested fields use `__`: `CODING_ENV_SANDBOX__MEMORY_MB=512` sets `sandbox.memory_mb`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from env_server.grading.grader import GradingConfig
from env_server.models import ErrorKind
from env_server.replicas import REPLICA_ID_PATTERN
from sandbox.spec import Backend, BackendSpec, DockerSpec, backend_spec


class HintSettings(BaseModel):
    """The optional LLM judge behind hints (off unless `llm_url` is set): the last, paid layer."""

    model_config = ConfigDict(extra="forbid")

    llm_url: str | None = None
    """Base URL of an OpenAI-compatible API (`.../v1`); None disables the judge."""

    llm_model: str = "gpt-4o-mini"
    """Model name sent to the judge endpoint."""

    llm_api_key: SecretStr | None = None
    """Bearer token for the judge endpoint, if it needs one."""

    llm_timeout_s: float = Field(default=10.0, gt=0)
    """Timeout of one judge request; on expiry the template hint is used."""

    judge_kinds: frozenset[ErrorKind] = frozenset(
        {ErrorKind.NONZERO_EXIT, ErrorKind.TEST_FAILURE, ErrorKind.REPEATED_FAILURE}
    )
    """Error kinds the judge is asked about. Default: those whose template and output say least
    about what to change; the service's own exact messages (`type_error`, ...) never need it."""

    judge_wait_s: float = Field(default=0.0, ge=0, le=60)
    """Longest a step waits for the judge (`CODING_ENV_HINTS__JUDGE_WAIT_S`). Past it the step
    answers with the template hint and the judge's hint replaces it in the trajectory on arrival."""

    judge_concurrency: int = Field(default=4, ge=1, le=64)
    """Judge requests in flight at once."""

    judge_max_pending: int = Field(default=64, ge=1)
    """Judge requests queued or in flight beyond which steps keep their template hint unjudged
    (a slow endpoint must not build an unbounded backlog)."""

    cache_dir: Path | None = None
    """Directory of the judge's disk cache (one JSON file per prompt hash); None: no cache."""

    max_chars: int = Field(default=400, ge=40)
    """Hints longer than this are cut (judge answers included)."""


class ServiceSettings(BaseSettings):
    """Everything `coding-env serve` can be told. Defaults suit one host serving one trainer."""

    model_config = SettingsConfigDict(env_prefix="CODING_ENV_", env_nested_delimiter="__", extra="ignore")

    host: str = "127.0.0.1"
    """Interface uvicorn binds to (`0.0.0.0` inside the compose container)."""

    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port (0: any free port)."""

    api_token: SecretStr | None = None
    """When set, every route but `/health` requires `Authorization: Bearer <token>`."""

    privileged_token: SecretStr | None = None
    """When set, `GET /references/{task_id}` (a task's reference solution, for a trainer's privileged
    SDPO teacher) answers a request with `X-Privileged-Token: <token>`; unset, that route answers 403.
    Keep it from whoever drives agents you evaluate: with it, a client can read every answer. Empty means
    unset (a deployment template's unset variable must not open the route to an empty header)."""

    @field_validator("privileged_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: object) -> object:
        return None if value == "" else value

    max_sessions: int = Field(default=64, ge=1)
    """Sessions (each owning at most one sandbox) alive at once; a new one beyond waits in the
    admission queue (`admission_timeout_s`), then gets 503 `capacity_reached`."""

    admission_timeout_s: float = Field(default=60.0, ge=0, le=3600)
    """Longest a new session waits, in a FIFO queue, for a free slot when `max_sessions` are open
    (`CODING_ENV_ADMISSION_TIMEOUT_S`); past it, 503 `capacity_reached`. 0: refuse at once."""

    default_task: str = "builtin/fizzbuzz"
    """Task a session is reset onto when it is stepped without a reset (OpenEnv's clients call
    tools first; `CODING_ENV_DEFAULT_TASK`). Checked at start-up: an unknown id stops the service."""

    sandbox_start_timeout_s: float = Field(default=120.0, gt=0, le=600)
    """Bound on waiting for a sandbox (`CODING_ENV_SANDBOX_START_TIMEOUT_S`): a cold start (container
    start and supervisor handshake) ends within it; a warm-pool checkout fails when the pool made no
    progress that long (no sandbox became ready or was handed out alive), so a line that moves is
    never cut short. Past it: reset answers 503 `sandbox_unavailable`, a submission whose
    grading sandbox does not come ends aborted (`sandbox_error`)."""

    idle_timeout_s: float = Field(default=600.0, gt=0)
    """A session untouched this long is closed and its sandbox freed (WebSocket sessions too)."""

    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest request body (and WebSocket frame) accepted; larger requests get 413 `body_too_large`."""

    sandbox_backend: Backend = "docker"
    """`docker` (hardened containers) or `local` (bubblewrap, for hosts without Docker)."""

    sandbox: BackendSpec = Field(default_factory=DockerSpec)
    """Image, limits and hardening of every sandbox, as the spec type of `sandbox_backend`:
    `DockerSpec` (adds image, cpus, runtime, labels) or `LocalSpec` (adds cpu_time_s, host_paths)."""

    pool_size: int = Field(default=4, ge=0)
    """Started sandboxes kept ready so reset does not wait for a container start."""

    grading_pool_size: int = Field(default=2, ge=0)
    """Fresh sandboxes kept ready for grading (each submission is graded in its own, decision 040),
    with pytest's bytecode compiled in advance outside the workspace: about 3x faster grading."""

    reap_orphans_on_start: bool = True
    """Remove sandboxes left behind by a predecessor that died without cleaning up: without a
    `replica_id`, those of dead processes on this host; with one, every sandbox labelled with that
    replica id (its predecessor's, on whichever host it ran)."""

    replica_id: str | None = Field(default=None, pattern=REPLICA_ID_PATTERN)
    """This process's id among replicas behind a proxy (`CODING_ENV_REPLICA_ID`; 1-32 letters, digits,
    dashes). Session ids then start with it (`<replica_id>.<hex>`) so the proxy routes each request to
    the session's owner (deploy/nginx, decision 110). One process holds an id at a time: a process
    started with an id takes over, and reaps, whatever sandboxes that id's predecessor left."""

    trajectory_dir: Path | None = None
    """When set, each ended episode (graded, failed, aborted, or left unfinished by a reset or a
    close after at least one step) is appended as one JSON line to `episodes.jsonl` here."""

    recent_episodes: int = Field(default=200, ge=0)
    """Ended episodes kept in memory for the episode viewer (`/viewer`) and `GET /episodes`; 0 keeps none."""

    hints: HintSettings = Field(default_factory=HintSettings)
    """Hint generation."""

    monitor_penalty: float = Field(default=0.0, ge=0.0, le=1.0)
    """Subtracted from a submission's reward per distinct monitor flag, floored at 0
    (`CODING_ENV_MONITOR_PENALTY`; 0: flags are only reported). Reaches the grader through `grading`."""

    executor_threads: int = Field(default=0, ge=0)
    """Threads running blocking sandbox calls; 0: `max_sessions + 8`, so every session can run at once."""

    log_level: str = "info"
    """uvicorn log level; at `debug` it also logs a line per HTTP request."""

    @property
    def grading(self) -> GradingConfig:
        """How this service grades submissions: the grader's defaults with `monitor_penalty`."""
        return GradingConfig(monitor_penalty=self.monitor_penalty)

    @model_validator(mode="before")
    @classmethod
    def _sandbox_spec_of_the_backend(cls, data: Any) -> Any:
        """`sandbox` becomes the spec type of `sandbox_backend`, so a field of the other backend
        is refused; a `DockerSpec` or `LocalSpec` given alone sets the backend it names."""
        if not isinstance(data, dict):
            return data
        spec = backend_spec(data.get("sandbox"), data.get("sandbox_backend"))
        return {**data, "sandbox": spec, "sandbox_backend": spec.backend}
