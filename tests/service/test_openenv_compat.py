"""OpenEnv's own clients and validator against the running service, unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from env_server.tasks import builtin

SOLUTION = builtin.BuiltinSuite().get("builtin/fizzbuzz").metadata["solution"]["solution.py"]


def test_generic_env_client_plays_an_episode_over_websocket(base_url: str) -> None:
    with GenericEnvClient(base_url=base_url).sync() as env:
        reset = env.reset(task_id="builtin/fizzbuzz")
        assert reset.observation["task_id"] == "builtin/fizzbuzz"
        step = env.step({"type": "call_tool", "tool_name": "write_file", "arguments": {"path": "solution.py", "content": SOLUTION}})
        assert step.observation["error_kind"] is None
        assert env.state()["step_count"] == 1
        final = env.step({"type": "call_tool", "tool_name": "submit", "arguments": {}})
        assert final.done is True
        assert final.reward == 1.0


def test_mcp_tool_client_lists_and_calls_tools(base_url: str) -> None:
    with MCPToolClient(base_url=base_url).sync() as env:
        env.reset(task_id="builtin/fizzbuzz")
        assert {t.name for t in env.list_tools()} >= {"bash", "submit"}
        result = env.call_tool("bash", command="echo from-mcp")
        assert result["output"].strip() == "from-mcp"
        step = env.step(CallToolAction(tool_name="bash", arguments={"command": "exit 3"}))
        assert step.observation.tool_name == "bash"


def test_openenv_validate_url_passes(base_url: str) -> None:
    completed = subprocess.run(
        [str(Path(sys.executable).with_name("openenv")), "validate", "--url", base_url, "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    report = json.loads(completed.stdout)
    assert report["passed"] is True, report
