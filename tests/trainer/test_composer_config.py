"""`ComposerConfig`'s own defaults where they differ from TRL's `GRPOConfig`."""

from __future__ import annotations

from pathlib import Path

from trainer_client.trainer import ComposerConfig


def test_a_cpu_run_trains_in_fp32_unless_it_asks_for_bf16(tmp_path: Path) -> None:
    def config(**options: object) -> ComposerConfig:
        return ComposerConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **options)

    assert config().bf16 is False  # TRL's default would be True: 40x slower matmuls on most CPUs
    assert config(bf16=True).bf16 is True
