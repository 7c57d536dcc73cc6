"""`observation_reply` writes OpenEnv's reply shape itself (decision 142): it must say what OpenEnv's own
`serialize_observation` says, for every kind of observation the service sends, so that an OpenEnv release that
changes the shape fails here."""

from __future__ import annotations

import json

import pytest
from openenv.core.env_server.mcp_types import ListToolsObservation
from openenv.core.env_server.serialization import serialize_observation
from openenv.core.env_server.types import Observation

from env_server.models import CallResult, ErrorKind, MonitorFlag
from env_server.openenv_models import CodingObservation, CodingResetObservation
from env_server.service import observation_reply
from env_server.tools import TOOLS

CALL = CallResult(tool_name="bash", output="é 😀\n", exit_code=1, error_kind=ErrorKind.NONZERO_EXIT, hint="Read the error.",
                  duration_ms=1.25, arguments={"command": "false"}, monitor_flags=[MonitorFlag.VCS_HISTORY_PROBE])
OBSERVATIONS = {
    "step": CodingObservation(tool_name="bash", output=CALL.output, exit_code=1, error_kind=ErrorKind.NONZERO_EXIT, calls=[CALL],
                              calls_found=1, calls_run=1, done=True, reward=0.5, metadata={"failing_tests": ["t::a"], "grading_ms": 12.5}),
    "step without metadata": CodingObservation(tool_name="bash", calls=[CALL], calls_found=1, calls_run=1),
    "reset": CodingResetObservation(prompt="Fix it.", task_id="builtin/fizzbuzz", max_steps=30, tools=[TOOLS["bash"].mcp_schema()]),
    "list_tools": ListToolsObservation(tools=[]),
}


@pytest.mark.parametrize("observation", OBSERVATIONS.values(), ids=OBSERVATIONS.keys())
def test_the_reply_is_what_openenv_serializes(observation: Observation) -> None:
    expected = json.loads(json.dumps(serialize_observation(observation)))
    assert json.loads(observation_reply(observation)) == expected
    assert json.loads(observation_reply(observation, frame=True)) == {"type": "observation", "data": expected}


def test_text_that_utf8_cannot_hold_is_written_as_its_escape() -> None:
    observation = CodingObservation(tool_name="bash", calls=[CallResult(tool_name="bash", arguments={"command": "echo \ud800"})])
    assert json.loads(observation_reply(observation, frame=True))["data"]["observation"]["calls"][0]["arguments"] == {"command": "echo \ud800"}
