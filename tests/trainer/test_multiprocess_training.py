"""Two training processes (torchrun, gloo on CPU) run the CPU smoke config's three channels against the
real service, as a user launches them: `torchrun --nproc_per_node 2 $(which coding-train) train ...`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from env_server.models import ErrorKind
from tests.trainer.conftest import SERVICE_TOKEN
from tests.trainer.test_shipped_configs import CPU_SMOKE, CPU_SMOKE_PAIRS, REPO, logged_steps

pytestmark = pytest.mark.docker

HANG_GUARD_S = 900
"""A rank left waiting in a collective hangs forever: end the run and fail instead."""


def test_two_processes_train_all_three_channels_to_the_end(service_url: str, tmp_path: Path) -> None:
    run = yaml.safe_load(CPU_SMOKE.read_text())
    run["environment"].update(api_token=SERVICE_TOKEN)
    run["trainer"].update(max_completion_length=64, dpo_pairs_path=str(CPU_SMOKE_PAIRS))  # the copy is not beside them
    config = tmp_path / "cpu_smoke.yaml"
    config.write_text(yaml.safe_dump(run))
    coding_train = Path(sys.executable).with_name("coding-train")
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(coding_train)),
        *("train", "--config", str(config), "--env-url", service_url, "--max-steps", "2"),
        *("--output-dir", str(tmp_path / "out")),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]

    steps = logged_steps(done.stdout)  # rank 0 logs
    assert len(steps) == 2
    for step in steps:
        assert step["sdpo/loss"] > 0 and step["dpo/loss"] > 0 and step["loss"] != 0
        # 2 rollouts per rank, a random policy fails each one's only turn: a single rank sees at most 2
        sites = step["sdpo/hint_sites"]
        assert sites > 2 and sites == sum(step[f"policy/failures/{kind.value}"] for kind in ErrorKind)
        # every kind is logged every step, 0 when absent
        assert all(f"env/error_rate/{kind.value}" in step for kind in ErrorKind)
