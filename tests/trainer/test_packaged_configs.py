"""The shipped configs as an installed wheel has them: every file under trainer_client/configs/ in the wheel,
a config found by name from any directory, and the data it names found beside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trainer_client.cli import load_run_config, main
from trainer_client.preferences import load_preference_pairs
from trainer_client.shipped_configs import CONFIG_DIR, config_names, find_config, input_path

REPO = Path(__file__).resolve().parents[2]


def shipped_files() -> set[str]:
    return {
        path.relative_to(REPO).as_posix()
        for path in CONFIG_DIR.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_the_wheel_carries_every_shipped_config_and_its_data(tmp_path: Path) -> None:
    # The build runs on a copy of what the wheel is made of: the checkout's build/ may hold stale files.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("env_server", "sandbox", "trainer_client"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # No build isolation: the environment's setuptools builds it, without fetching one from an index.
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "wheel"), str(source)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = shipped_files()
    assert {"trainer_client/configs/cpu_smoke.yaml", "trainer_client/configs/data/cpu_smoke_pairs.jsonl"} <= shipped
    assert shipped - names == set()


@pytest.mark.parametrize("name", ["cpu_smoke", "cpu_smoke_lora", "cpu_smoke.yaml"])
def test_a_smoke_config_by_name_from_any_directory_finds_its_pairs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = find_config(name)
    assert path == CONFIG_DIR / f"{name.removesuffix('.yaml')}.yaml"
    pairs = Path(load_run_config(path).trainer["dpo_pairs_path"])
    assert pairs == CONFIG_DIR / "data" / "cpu_smoke_pairs.jsonl"
    assert load_preference_pairs(pairs)  # the packaged pairs themselves


def test_sft_configs_are_found_among_the_sft_ones() -> None:
    # `smollm2_cpu` names a run config and an SFT config: each command looks in its own folder.
    assert find_config("smollm2_cpu", "sft") == CONFIG_DIR / "sft" / "smollm2_cpu.yaml"
    assert find_config("smollm2_cpu") == CONFIG_DIR / "smollm2_cpu.yaml"
    assert set(config_names("sft")) == {path.stem for path in (CONFIG_DIR / "sft").glob("*.yaml")}


def test_user_paths_keep_their_meaning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A config given as a path, relative to the working directory, is that file, not a shipped one.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu_smoke.yaml").write_text("tasks: [builtin/fizzbuzz]\n")
    assert find_config("cpu_smoke.yaml") == Path("cpu_smoke.yaml")
    # A pairs path with no file beside the config stays relative to the working directory (`coding-train
    # replay`'s output, as the GPU configs name it); one beside it is taken from there.
    assert load_run_config(CONFIG_DIR / "gpu_qwen_1_5b.yaml").trainer["dpo_pairs_path"] == "data/pairs.jsonl"
    configs = tmp_path / "configs"
    (configs / "data").mkdir(parents=True)
    (configs / "data" / "pairs.jsonl").touch()
    assert input_path("data/pairs.jsonl", configs / "run.yaml") == str(configs / "data" / "pairs.jsonl")
    assert input_path(str(tmp_path / "elsewhere.jsonl"), configs / "run.yaml") == str(tmp_path / "elsewhere.jsonl")


def test_an_unknown_config_name_lists_the_shipped_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="no shipped config of that name; shipped: cpu_smoke, cpu_smoke_lora, gpu_qwen_1_5b"):
        main(["train", "--config", "cpu_smok"])
    with pytest.raises(SystemExit, match=r"coding-train sft: .*shipped: smollm2_cpu, smollm2_l1_cpu"):
        main(["sft", "--config", "nope"])
    # A path that names no file is not looked up among the shipped configs.
    with pytest.raises(SystemExit, match="no config file 'configs/cpu_smoke'"):
        main(["train", "--config", "configs/cpu_smoke"])

