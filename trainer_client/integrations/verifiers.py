"""The service as a `verifiers` (v1, 0.4.0) environment: a taskset of service task ids, and the
harness that plays one of them through a service session.

verifiers v1 splits an environment into a `Taskset` (the rows), a `Task` (scoring) and a
`Harness` (the program that runs the model; every model call goes through the rollout's
interception endpoint, which records the turn on the trace). The service owns the sandbox, the
tools and the grade, so the harness runs its loop in-process (the v1 contract allows it): reset a
session on the task, offer the service's tool schemas to the model, run each call the model makes
through the session, and stop when the episode is done. Native tool calls go as `call_tool`
steps; a reply with none goes whole as an `assistant_message`, so the service's parser finds
calls written in any model family's text format.

Reward: the grade the service returned (`submit`, or its step limit). A policy that stops without
submitting is submitted for, so every finished rollout is graded. An episode the infrastructure
aborted (reward null) fails the trace instead of scoring it 0. Each call's error kind and hint
are on `trace.info["coding_env"]` (an `EpisodeLog`, updated after every step), and their counts are metrics (`error_kind/<kind>`).

The session is closed when the harness returns, raises, or is cancelled (the framework dropping
the rollout): the client is an async context manager around the whole loop.

verifiers loads tasksets and harnesses by plugin id: it looks for `verifiers.v1.tasksets.<id>`
(resp. `verifiers.v1.harnesses.<id>`), then for a top-level module `<id>`. The top-level module of
the id `coding_env_verifiers` ships in the wheel (`coding_env_verifiers/`, what `vf-eval` imports);
this module registers itself under the two namespaced names when imported. Those are what lets the
id load beside `mcp<2` (the service's `openenv` needs it; verifiers pins 2.0.0 and its own tasksets
package imports mcp 2 APIs): the loader finds them in `sys.modules` and imports nothing else
(decision 100). It does not take the top-level name, which would hide the shipped module.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from openai import AsyncOpenAI
from pydantic import Field

from trainer_client.client import AsyncCodingEnvClient, ClientSettings, StepResult
from trainer_client.integrations.episode_log import EpisodeLog

PLUGIN_ID = "coding_env_verifiers"
"""The verifiers taskset id (and bundled harness id) this module answers to."""

INFO_KEY = "coding_env"
"""Where the harness leaves the episode's `EpisodeLog` on `trace.info`."""

for _name in (f"verifiers.v1.tasksets.{PLUGIN_ID}", f"verifiers.v1.harnesses.{PLUGIN_ID}"):
    sys.modules.setdefault(_name, sys.modules[__name__])


class CodingEnvTaskData(vf.TaskData):
    """One service task, as a verifiers task row."""

    task_id: str
    """The service's task id (the reset body's `task_id`), e.g. `builtin/fizzbuzz`."""


class CodingEnvTasksetConfig(vf.TasksetConfig):
    """Which service tasks the taskset yields."""

    task_ids: list[str] = Field(default_factory=list)
    """Service task ids, one task each, in order (`GET /tasks` lists them)."""


class CodingEnvHarnessConfig(vf.HarnessConfig):
    """Where the service is and how long an episode may talk."""

    id: str = PLUGIN_ID
    service: ClientSettings = ClientSettings()
    """The service's URL, token, transport and hint setting."""
    max_model_turns: int = Field(default=32, ge=1)
    """Model replies per episode; the service's own `max_steps` bounds the tool calls."""


class CodingEnvTask(vf.Task[CodingEnvTaskData]):
    """Scores a trace from the grade the harness recorded."""

    @vf.reward
    async def coding_env_reward(self, trace: vf.Trace) -> float:
        """The service's grade; raises when there is none (the infrastructure aborted the episode)."""
        episode = _episode(trace)
        if episode.reward is None:
            raise vf.TaskError(f"the service ended the episode without a grade: {episode.end_reason or 'no end reason'}")
        return episode.reward

    @vf.metric
    async def coding_env_errors(self, trace: vf.Trace) -> dict[str, float]:
        """Calls per error kind (`error_kind/<kind>`), plus the tool calls and hidden tests counted."""
        episode = _episode(trace)
        return {
            "tool_calls": float(len(episode.calls)),
            "tests_passed": float(episode.tests_passed or 0),
            "tests_total": float(episode.tests_total or 0),
            **{name: float(n) for name, n in episode.error_counts().items()},
        }


class CodingEnvTaskset(vf.Taskset[CodingEnvTask, CodingEnvTasksetConfig]):
    """One task per configured service task id."""

    def load(self) -> Iterator[CodingEnvTask]:
        for task_id in self.config.task_ids:
            # verifiers wants a prompt on every row; the statement itself comes from the service's
            # reset, and is what the harness shows the model.
            data = CodingEnvTaskData(id=task_id, name=task_id, task_id=task_id, prompt=f"coding-env task {task_id}")
            yield CodingEnvTask(data, self.config.task)


class CodingEnvHarness(vf.Harness[CodingEnvHarnessConfig]):
    """Plays one task through one service session, in-process."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False  # the model's code runs in the service's sandbox, not in this runtime
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
    ) -> vf.ProgramResult:
        if not isinstance(data, CodingEnvTaskData):
            raise vf.HarnessError(f"the {PLUGIN_ID} harness plays {PLUGIN_ID} tasks, not {type(data).__name__}")
        model = AsyncOpenAI(base_url=endpoint, api_key=secret)
        try:
            async with AsyncCodingEnvClient(self.config.service) as env:
                reset = await env.reset(data.task_id)
                episode = EpisodeLog(task_id=reset.task_id)
                messages: list[dict[str, Any]] = [{"role": "user", "content": reset.prompt}]
                if data.system_prompt:
                    messages.insert(0, {"role": "system", "content": data.system_prompt})
                for _ in range(self.config.max_model_turns):
                    completion = await model.chat.completions.create(model=ctx.model, messages=messages, tools=reset.tools)
                    reply = completion.choices[0].message
                    messages.append(reply.model_dump(exclude_none=True))
                    messages.extend(await _play(env, episode, reply))
                    trace.info[INFO_KEY] = episode.model_dump(mode="json")
                    if episode.done:
                        break
                if not episode.done:
                    episode.submitted_by_integration = True
                    episode.record(await env.step("submit"))
                    trace.info[INFO_KEY] = episode.model_dump(mode="json")
        finally:
            await model.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


async def _play(env: AsyncCodingEnvClient, episode: EpisodeLog, reply: Any) -> list[dict[str, Any]]:
    """Run the reply's calls through the session; returns the messages answering it. Native calls
    are answered one tool message each; a reply without any goes whole to the service's parser
    and is answered by one user message."""
    if not reply.tool_calls:
        result = await env.step_message(reply.content or "")
        episode.record(result)
        return [{"role": "user", "content": result.observation.output}]
    answers = []
    for call in reply.tool_calls:
        if episode.done:
            break
        result: StepResult = await env.step(call.function.name, call.function.arguments)
        episode.record(result)
        answers.append({"role": "tool", "tool_call_id": call.id, "content": result.observation.output})
    return answers


def _episode(trace: vf.Trace) -> EpisodeLog:
    recorded = trace.info.get(INFO_KEY)
    if recorded is None:
        raise vf.TaskError("the trace carries no coding-env episode (the harness did not reset a session)")
    return EpisodeLog.model_validate(recorded)


__all__ = ["CodingEnvHarness", "CodingEnvTaskset", "CodingEnvTask", "CodingEnvTaskData", "CodingEnvTasksetConfig", "CodingEnvHarnessConfig"]
