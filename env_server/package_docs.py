"""The service's documentation as OpenEnv's `/metadata` carries it: the README's text, and a
documentation URL a client can follow from wherever it reads the metadata.

OpenEnv's web UI and Hub show `readme_content` as the environment's page, so it is the README as
the running code was built with: read from the source tree when the service runs from a checkout
(an editable install's recorded metadata would be as old as its `pip install`), else from the
installed distribution, whose long description is the README (`readme = "README.md"` in
pyproject.toml; the service image installs the wheel and keeps no source tree).

pyproject.toml names no repository, so a link to `docs/*.md` could only be relative, which no
client can resolve. The documentation the service itself serves is its interactive API reference
(FastAPI's `/docs`, from the same OpenAPI document the contract tests check): the environment
names that path, and the route that answers, which knows the base URL the client used, makes it
absolute (`with_absolute_links`).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from urllib.parse import urljoin

from openenv.core.env_server.types import EnvironmentMetadata

DISTRIBUTION = "coding-env"
"""The distribution whose long description is the README."""

DOCUMENTATION_PATH = "docs"
"""The interactive API reference, relative to the service's root (so a `root_path` prefix stays)."""


def readme_text() -> str | None:
    """The README of the running code (None only when neither a checkout nor the distribution has it).

    Read on every call, not cached: `/metadata` is rare, and a checkout's README may change
    while a development server runs."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "README.md").is_file():
        return (root / "README.md").read_text(encoding="utf-8")
    try:
        description = metadata.metadata(DISTRIBUTION).json.get("description")
    except metadata.PackageNotFoundError:
        return None
    return description if isinstance(description, str) else None


def with_absolute_links(described: EnvironmentMetadata, base_url: str) -> EnvironmentMetadata:
    """`described` with its documentation URL resolved against `base_url` (the request's, ending in `/`)."""
    if described.documentation_url is None:
        return described
    return described.model_copy(update={"documentation_url": urljoin(base_url, described.documentation_url)})
