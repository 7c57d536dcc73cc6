"""`coding-train train` with a LoRA adapter: the `peft:` section and --lora-* flags, the SDPO `base`
teacher, and the adapter saved to --output-dir after a real step against the real service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.trainer.conftest import SERVICE_TOKEN
from trainer_client.cli import build_parser, load_run_config, lora_overrides, main
from trainer_client.lora import LLAMA_STYLE_TARGET_MODULES

LORA_SMOKE = Path(__file__).parents[2] / "trainer_client" / "configs" / "cpu_smoke_lora.yaml"
NO_LORA_SMOKE = LORA_SMOKE.with_name("cpu_smoke.yaml")


def write_config(tmp_path: Path, run: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    return path


def test_flags_add_an_adapter_to_a_config_without_one() -> None:
    args = build_parser().parse_args(
        ["train", "--config", str(NO_LORA_SMOKE), "--lora-r", "4", "--lora-target-modules", "q_proj", "v_proj"]
    )
    run = load_run_config(args.config, lora_overrides(args))
    assert run.peft is not None
    assert (run.peft.r, run.peft.target_modules, run.peft.lora_alpha) == (4, ["q_proj", "v_proj"], 32.0)
    assert load_run_config(args.config).peft is None  # no flags, no section: full fine-tuning


def test_flags_amend_the_config_section_and_build_peft_config() -> None:
    args = build_parser().parse_args(["train", "--config", str(LORA_SMOKE), "--lora-alpha", "4", "--lora-dropout", "0.1"])
    run = load_run_config(args.config, lora_overrides(args))
    lora = run.peft.peft_config()
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (8, 4.0, 0.1)  # r from the file, the rest from flags
    assert set(lora.target_modules) == set(LLAMA_STYLE_TARGET_MODULES) and lora.task_type == "CAUSAL_LM"


def test_base_teacher_without_an_adapter_is_refused_before_loading_a_model(tmp_path: Path) -> None:
    run = yaml.safe_load(LORA_SMOKE.read_text())
    del run["peft"]
    path = write_config(tmp_path, run)
    with pytest.raises(ValueError, match="peft"):
        load_run_config(path)
    with pytest.raises(SystemExit, match="sdpo_teacher 'base'"):
        main(["train", "--config", str(path)])
    # the same config with an adapter from the flags is accepted
    assert load_run_config(path, {"r": 4}).peft.r == 4


def test_bad_lora_settings_are_refused(tmp_path: Path) -> None:
    run = yaml.safe_load(LORA_SMOKE.read_text())
    run["peft"]["rank"] = 8
    with pytest.raises(ValueError, match="rank"):
        load_run_config(write_config(tmp_path, run))
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        load_run_config(LORA_SMOKE, {"r": 0})


@pytest.mark.docker
def test_lora_smoke_config_trains_and_saves_the_adapter_with_the_base_teacher(
    service_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = yaml.safe_load(LORA_SMOKE.read_text())
    run["environment"]["api_token"] = SERVICE_TOKEN
    run["trainer"]["max_completion_length"] = 32
    run["trainer"]["dpo_pairs_path"] = str(LORA_SMOKE.parent / "data" / "cpu_smoke_pairs.jsonl")  # the copy is not beside them
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path)  # any directory
    args = ["train", "--config", str(write_config(tmp_path, run)), "--env-url", service_url, "--max-steps", "1"]
    assert main([*args, "--output-dir", str(out)]) == 0

    # The adapter alone was saved, with the config's settings ...
    assert not (out / "model.safetensors").exists() and not (out / "config.json").exists()
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert adapter_config["r"] == 8 and set(adapter_config["target_modules"]) == set(LLAMA_STYLE_TARGET_MODULES)
    # ... and trained: PEFT starts every B matrix at zero, one optimizer step moved them.
    weights = load_file(out / "adapter_model.safetensors")
    lora_b = {name: tensor for name, tensor in weights.items() if "lora_B" in name}
    assert lora_b and all(tensor.abs().max() > 0 for tensor in lora_b.values())
    assert all("lora_" in name for name in weights)  # no base weight in the adapter file

    # SDPO ran against the base teacher: the random policy's turns are hint sites, the loss is > 0.
    (step,) = [entry for entry in json.loads((out / "trainer_state.json").read_text())["log_history"] if "sdpo/loss" in entry]
    assert step["sdpo/loss"] > 0 and step["sdpo/hint_tokens"] > 0
    assert "dpo/loss" in step


def test_a_saved_adapter_reloads_as_a_policy(tmp_path: Path, tokenizer) -> None:
    """`load_policy(adapter_dir)` (what `coding-train eval --model` calls) loads base + adapter."""
    from peft import get_peft_model

    from trainer_client.policy import load_policy, tiny_random_model

    tiny_random_model(len(tokenizer), hidden_size=32).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    base, _ = load_policy(str(tmp_path / "base"))
    adapted = get_peft_model(base, load_run_config(LORA_SMOKE).peft.peft_config())
    for name, parameter in adapted.named_parameters():
        if "lora_B" in name:
            parameter.data.fill_(0.1)  # an adapter that changes the outputs
    adapted.save_pretrained(tmp_path / "adapter")
    tokenizer.save_pretrained(tmp_path / "adapter")

    reloaded, _ = load_policy(str(tmp_path / "adapter"))
    ids = torch.randint(0, 1000, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, adapted(ids).logits)
        with adapted.disable_adapter():
            assert (reloaded(ids).logits - adapted(ids).logits).abs().max() > 1e-3  # the adapter was applied
