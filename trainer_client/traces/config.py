"""Replay configuration: the teachers and the rules that turn their answers into pairs.

Loaded from the YAML file given to `replay --teachers`::

    teachers:
      - name: gpt
        base_url: https://api.openai.com/v1
        model: gpt-4.1
        api_key_env: OPENAI_API_KEY
        input_usd_per_mtok: 2.0
        output_usd_per_mtok: 8.0
    min_agreement: 2
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

_FAMILY_PREFIXES: tuple[tuple[str, str], ...] = (
    ("claude", "anthropic"),
    ("gpt", "openai"),
    ("o1", "openai"),
    ("o3", "openai"),
    ("o4", "openai"),
    ("codex", "openai"),
    ("gemini", "google"),
    ("gemma", "google"),
    ("qwen", "qwen"),
    ("qwq", "qwen"),
    ("llama", "meta"),
    ("deepseek", "deepseek"),
    ("mistral", "mistral"),
    ("codestral", "mistral"),
    ("devstral", "mistral"),
    ("glm", "zhipu"),
    ("kimi", "moonshot"),
    ("grok", "xai"),
)


def model_family(model: str | None) -> str | None:
    """Vendor family of a model name (`anthropic/claude-3-7-sonnet` -> `anthropic`), or None."""
    if not model:
        return None
    name = model.lower().rsplit("/", 1)[-1]
    for prefix, family in _FAMILY_PREFIXES:
        if name.startswith(prefix):
            return family
    return None


class ReplayConfigError(ValueError):
    """The teachers file is missing, malformed, or names an API key that is not set."""


class TeacherConfig(BaseModel):
    """One teacher: a model behind an OpenAI-compatible chat completions API."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """Label in pairs, reports and the cache key; unique within the file."""

    base_url: str
    """API root; requests go to `{base_url}/chat/completions`."""

    model: str
    """Model name sent in the request."""

    api_key_env: str | None = None
    """Environment variable holding the API key (the key itself never goes in the file)."""

    input_usd_per_mtok: float = Field(ge=0)
    """Price of one million prompt tokens, USD."""

    output_usd_per_mtok: float = Field(ge=0)
    """Price of one million completion tokens, USD."""

    family: str | None = None
    """Vendor family; inferred from `model` when absent. Traces of this family skip this teacher."""

    max_tokens: int = Field(default=1024, ge=1)
    """Completion cap sent with each request; also bounds the cost reserved before a call."""

    temperature: float = Field(default=0.0, ge=0)
    """Sampling temperature; 0 makes answers (and so the cache) reproducible."""

    @model_validator(mode="after")
    def _infer_family(self) -> TeacherConfig:
        if self.family is None:
            self.family = model_family(self.model)
        return self

    def api_key(self) -> str | None:
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ReplayConfigError(f"teacher {self.name!r}: environment variable {self.api_key_env} is not set")
        return key

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_usd_per_mtok + completion_tokens * self.output_usd_per_mtok) / 1e6


class ReplayConfig(BaseModel):
    """Teachers plus the replay's rules and limits."""

    model_config = ConfigDict(extra="forbid")

    teachers: list[TeacherConfig] = Field(min_length=1)
    """The teachers, in order of preference (the first agreeing teacher's answer is `chosen`)."""

    min_agreement: int = Field(default=2, ge=1)
    """k of k-of-N: how many teachers must give the same action for it to be the consensus."""

    text_similarity: float = Field(default=0.8, gt=0, le=1)
    """difflib ratio at or above which two text answers count as the same action."""

    entropy_gate: float | None = Field(default=None, ge=0)
    """Query only states whose student's mean token entropy (nats) is at least this; states
    without log-probs are always queried. None: query every state."""

    concurrency: int = Field(default=8, ge=1)
    """Teacher requests in flight at once, over all teachers."""

    timeout_s: float = Field(default=120.0, gt=0)
    """Limit of one HTTP request."""

    max_retries: int = Field(default=4, ge=0)
    """Retries after a 429, a 5xx, a timeout or a connection error."""

    backoff_s: float = Field(default=1.0, gt=0)
    """Base of the exponential backoff; each wait is drawn uniformly below base * 2**attempt."""

    backoff_max_s: float = Field(default=60.0, gt=0)
    """Cap of one backoff wait (a server's Retry-After is honoured up to this)."""

    cache_dir: Path = Path("~/.cache/coding-env/teacher-replies")
    """Where teacher answers are kept; a rerun asks only what is not there."""

    @model_validator(mode="after")
    def _check(self) -> ReplayConfig:
        names = [teacher.name for teacher in self.teachers]
        if len(set(names)) != len(names):
            raise ValueError(f"teacher names must be unique: {names}")
        self.cache_dir = self.cache_dir.expanduser()
        return self

    @classmethod
    def load(cls, path: Path) -> ReplayConfig:
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
            return cls.model_validate(document)
        except OSError as error:
            raise ReplayConfigError(f"cannot read teachers file {path}: {error}") from error
        except (yaml.YAMLError, ValidationError) as error:
            raise ReplayConfigError(f"invalid teachers file {path}: {error}") from error
