"""The project as an OpenEnv 0.10 package (decision 103): `openenv validate` on the repository, the
manifest against the code it names, the typed client (`CodingEnv`) through the real service, and
`/metadata` with the README and a documentation link that works."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import docker
import httpx
import pytest
import yaml
from openenv.core.env_server.mcp_types import ListToolsObservation
from openenv.validation import Level, Verdict, run_validation

from env_server.openenv_models import (
    AssistantMessageStep,
    CallToolStep,
    CodingObservation,
    CodingResetObservation,
    CodingState,
    ListToolsStep,
)
from env_server.settings import ServiceSettings
from env_server.tasks import builtin
from env_server.tools import TOOLS
from tests.sandbox.support import BACKENDS, docker_ready
from trainer_client.openenv_client import CodingEnv
from trainer_client.service_container import ContainerFailed

ROOT = Path(__file__).parents[2]
MANIFEST = yaml.safe_load((ROOT / "openenv.yaml").read_text())
SOLUTION = builtin.BuiltinSuite().get("builtin/fizzbuzz").metadata["solution"]["solution.py"]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's files as a clean checkout has them (tracked ones, and new ones git does not
    ignore), in a directory of their own. The working tree also holds what builds leave there
    (`make wheels`' venv, whose symlinks the validator refuses to digest) and files other processes
    may be writing (the validator digests the tree before and after, and fails on a difference)."""
    listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(listing, cwd=ROOT, capture_output=True, check=True)
    copy = tmp_path_factory.mktemp("checkout")
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).exists():  # a tracked file deleted in the working tree is not in a checkout of it
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name, follow_symlinks=False)
    return copy


def test_openenv_validate_passes_on_the_repository(checkout: Path) -> None:
    """`openenv validate .` as a user runs it: exit 0; every check it can run here passes, and the
    rest are skipped (no runtime declaration: decision 103), never failed."""
    completed = subprocess.run(
        [str(Path(sys.executable).with_name("openenv")), "validate", ".", "--json"],
        cwd=checkout, capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    report = json.loads(completed.stdout)
    statuses = {result["check_id"]: result["status"] for result in report["results"]}
    assert statuses.pop("static.manifest") == "pass"
    assert set(statuses.values()) == {"skip"}, statuses
    assert report["verdict"] == "warn"  # a skipped check makes a run WARN, which exits 0


def test_the_static_level_passes_outright(checkout: Path) -> None:
    report = run_validation(checkout, max_level=Level.STATIC)
    assert report.verdict is Verdict.PASS, report.results


def test_the_manifest_names_the_services_factory_port_and_tools() -> None:
    module, _, factory = MANIFEST["app"].partition(":")
    assert callable(getattr(importlib.import_module(module), factory))
    assert MANIFEST["port"] == ServiceSettings.model_fields["port"].default
    assert MANIFEST["name"] == "coding-env"
    assert MANIFEST["validation"]["capabilities"]["declared_tools"] == list(TOOLS)


@pytest.mark.parametrize("sandbox_backend", BACKENDS)
def test_the_typed_client_plays_an_episode(base_url: str) -> None:
    with CodingEnv(base_url=base_url).sync() as env:
        reset = env.reset(task_id="builtin/fizzbuzz")
        assert isinstance(reset.observation, CodingResetObservation)
        assert reset.observation.task_id == "builtin/fizzbuzz" and reset.done is False

        step = env.step(CallToolStep(tool_name="write_file", arguments={"path": "solution.py", "content": SOLUTION}))
        assert isinstance(step.observation, CodingObservation)
        assert step.observation.tool_name == "write_file" and step.observation.error_kind is None

        listed = env.step(ListToolsStep())
        assert isinstance(listed.observation, ListToolsObservation)
        assert [tool.name for tool in listed.observation.tools] == list(TOOLS)

        state = env.state()
        assert isinstance(state, CodingState)
        assert (state.task_id, state.step_count) == ("builtin/fizzbuzz", 1)

        final = env.step(AssistantMessageStep(content='<tool_call>{"name": "submit", "arguments": {}}</tool_call>'))
        assert isinstance(final.observation, CodingObservation)
        assert (final.done, final.reward) == (True, 1.0)
        assert (final.observation.done, final.observation.reward) == (True, 1.0)
        assert final.observation.tests_passed == final.observation.tests_total > 0


@pytest.mark.parametrize("sandbox_backend", BACKENDS)
def test_metadata_carries_the_readme_and_an_absolute_documentation_link(base_url: str) -> None:
    metadata = httpx.get(f"{base_url}/metadata", timeout=30).json()
    assert metadata["readme_content"] == (ROOT / "README.md").read_text(encoding="utf-8")
    assert metadata["documentation_url"] == f"{base_url}/docs"
    assert httpx.get(metadata["documentation_url"], timeout=30).status_code == 200


@pytest.fixture
def service_image() -> str:
    """A built service image: Compose's, or the one tests/service/test_compose.py builds."""
    images = docker.from_env().images
    for tag in ("coding-env-service:latest", "coding-env-service:compose-test"):
        if images.list(name=tag):
            return tag
    pytest.skip("no service image (`docker compose build`, or tests/service/test_compose.py, builds one)")


@pytest.mark.slow
@pytest.mark.skipif(not docker_ready(), reason="no Docker engine or no sandbox image")
def test_from_docker_image_starts_the_service_and_stops_it_on_close(service_image: str) -> None:
    env = CodingEnv.from_docker_image(service_image, env_vars={"CODING_ENV_POOL_SIZE": "1"}).sync()
    try:
        base_url = env.base_url
        reset = env.reset(task_id="builtin/fizzbuzz")
        assert isinstance(reset.observation, CodingResetObservation)
        step = env.step(CallToolStep(tool_name="bash", arguments={"command": "echo from-the-container"}))
        assert step.observation.output.strip() == "from-the-container"
    finally:
        env.close()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{base_url}/health", timeout=5, trust_env=False)


@pytest.mark.skipif(not docker_ready(), reason="no Docker engine or no sandbox image")
def test_from_docker_image_reports_a_service_that_does_not_start(service_image: str) -> None:
    """Its settings refused at start-up: the error says why (the container's log), and the
    container is removed."""
    with pytest.raises(ContainerFailed, match="max_sessions"):
        CodingEnv.from_docker_image(service_image, env_vars={"CODING_ENV_MAX_SESSIONS": "many"}).sync()
    containers = docker.from_env().containers.list(all=True, filters={"ancestor": service_image})
    assert not [c for c in containers if "CODING_ENV_MAX_SESSIONS=many" in c.attrs["Config"]["Env"]]
