"""The service as the verifiers environment `coding_env_verifiers`: the id `vf-eval` (and prime-rl)
load, and `load_environment` for Python.

verifiers 0.4.0 loads an environment by taskset id: it imports `verifiers.v1.tasksets.<id>` if that
exists, else a top-level module `<id>`, and takes the `Taskset` (and, when the run names no other,
the `Harness`) that the module exports in `__all__`. This package is that module, shipped in the
wheel so that `pip install 'coding-env[verifiers]'` is all `vf-eval coding_env_verifiers ...` needs;
the taskset and harness themselves are `trainer_client.integrations.verifiers` (docs/integrations.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import verifiers.v1 as vf

from trainer_client.client import ClientSettings
from trainer_client.integrations.verifiers import (
    PLUGIN_ID,
    CodingEnvHarness,
    CodingEnvHarnessConfig,
    CodingEnvTaskset,
    CodingEnvTasksetConfig,
)


def load_environment(
    task_ids: Sequence[str],
    service: ClientSettings | str = "http://127.0.0.1:8000",
    *,
    max_model_turns: int = 32,
) -> vf.Env:
    """The verifiers `Env` that plays `task_ids` through the service, as `vf-eval` builds it from
    `--env.taskset.task-ids`, `--env.agent.harness.*` and `--env.agent.runtime.type subprocess`.

    Args:
        task_ids: Service task ids, one task each (`GET /tasks` lists them), e.g. `builtin/fizzbuzz`.
        service: The service's URL, or its full client settings (token, transport, tools, hints).
        max_model_turns: Model replies per episode before the harness submits for the policy.
    """
    settings = ClientSettings(base_url=service) if isinstance(service, str) else service
    config = vf.SingleAgentEnvConfig(
        taskset=CodingEnvTasksetConfig(id=PLUGIN_ID, task_ids=list(task_ids)),
        agent=vf.AgentConfig(
            harness=CodingEnvHarnessConfig(service=settings, max_model_turns=max_model_turns),
            # The harness only talks HTTP (the code runs in the service's sandbox): no container for it.
            runtime=vf.SubprocessConfig(),
        ),
    )
    return vf.load_environment(config)


__all__ = ["CodingEnvHarness", "CodingEnvTaskset", "load_environment"]
