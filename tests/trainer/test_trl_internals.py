"""Guards on the TRL and transformers internals the trainer relies on (decision 064) that no other test
would catch by name: the pins themselves, and `compute_loss` reaching our `_compute_loss`."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from trl import GRPOTrainer

from trainer_client.trainer import ComposerTrainer

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.mark.parametrize("package", ["trl", "transformers"])
def test_the_installed_version_is_the_exact_pin(package: str) -> None:
    """An upgrade is a review of decision 064: the pin moves with it, never a range."""
    train = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["train"]
    (pin,) = [requirement for requirement in train if re.match(rf"{package}\b", requirement)]
    assert pin == f"{package}=={version(package)}"


def test_compute_loss_is_grpos_own_and_hands_over_to_compute_loss_underscore() -> None:
    """`Trainer.training_step` calls `compute_loss`; every channel is added in `_compute_loss`. A class between
    them that overrides `compute_loss` (newer TRL trainers do) would train on GRPO alone, silently."""
    assert ComposerTrainer.compute_loss is GRPOTrainer.compute_loss

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[object, object]] = []

        def _compute_loss(self, model: object, inputs: object) -> str:
            self.calls.append((model, inputs))
            return "loss"

    recorder = Recorder()
    assert GRPOTrainer.compute_loss(recorder, "model", {"batch": 1}, num_items_in_batch=7) == "loss"
    assert recorder.calls == [("model", {"batch": 1})]
    with pytest.raises(ValueError):
        GRPOTrainer.compute_loss(recorder, "model", {}, return_outputs=True)
