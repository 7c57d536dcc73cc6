"""Every command the README shows is run by a test, and is written as the tools accept it.

Each shell command of the README's `bash` blocks must match one entry of `RUN_BY`, which names the
test that runs it (or the CI step that does); a command no entry covers fails here, so a new README
line needs its test. Each command is also checked against the real tools: `coding-env` and
`coding-train` lines parse with the CLIs' own parsers, a benchmark script's options are in its
`--help`, `make` targets and `pip` extras exist, and the cheap task commands run here as written.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from env_server.cli import build_parser as service_parser
from trainer_client.cli import build_parser as trainer_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

RUN_BY: list[tuple[str, str]] = [
    # (a regular expression a README command matches in full, the test that runs it)
    (r"docker compose up( -d)?", "tests/service/test_compose.py::test_compose_up_serves_an_episode_and_leaves_no_sandbox"),
    (r"python examples/http_episode\.py", "tests/service/test_episode.py::test_plain_httpx_example_plays_a_full_episode"),
    (r"make test", ".ci/run"),
    (r"pip install -e '\.\[(server,tasks|train)\]'", "Makefile::install"),
    (r"coding-env build-image", "tests/test_console_scripts.py::test_build_image_if_missing_and_reap_run_against_the_engine"),
    (r"coding-env serve --port 8000( &)?", "tests/service/test_operations.py::test_token_guards_every_route_but_health"),
    (r"coding-env tasks list( \[--suite humaneval\])?", "tests/tasks/test_registry.py::test_cli_lists_at_least_500_tasks_offline"),
    (r"coding-env tasks list --suite warmup --split held_out", "tests/test_readme_commands.py::test_the_cheap_task_commands_run_as_written"),
    (r"coding-env tasks show .*", "tests/test_readme_commands.py::test_the_cheap_task_commands_run_as_written"),
    (r"coding-env tasks validate .*", "tests/tasks/test_validity_gate.py::test_cli_validate_reports_every_baseline"),
    (r"coding-env tasks generate feature-deletion .*", "tests/tasks/test_feature_deletion.py::test_generation_from_a_local_sdist_yields_gradable_tasks"),
    (r"coding-env tasks generate bug-injection .*", "tests/tasks/test_bug_injection.py::test_generation_writes_only_tasks_the_whole_suite_grades"),
    (r"coding-env tasks export .*", "tests/tasks/test_export.py::test_parquet_and_json_lines_hold_the_same_rows_and_trl_reads_them_as_conversations"),
    (r"coding-train train --config cpu_smoke --env-url \S+", "tests/trainer/test_shipped_configs.py::test_cpu_smoke_runs_all_three_channels_with_a_nonzero_loss"),
    (r"coding-train plot \S+", "tests/trainer/test_shipped_configs.py::test_cpu_smoke_runs_all_three_channels_with_a_nonzero_loss"),
    (r"coding-train train --config cpu_smoke_lora .*", "tests/trainer/test_cli_lora.py::test_lora_smoke_config_trains_and_saves_the_adapter_with_the_base_teacher"),
    (r"torchrun .*", "tests/trainer/test_multiprocess_training.py::test_two_processes_train_all_three_channels_to_the_end"),
    (r"coding-train train --config smollm2_warm_cpu .*", "tests/trainer/test_shipped_configs.py::test_every_run_config_builds_its_trainer"),
    (r"coding-train demos .*", "tests/trainer/test_gpu_check.py::test_the_dry_run_runs_every_stage_and_reports_in_at_most_eight_files"),
    (r"coding-train sft --config \S+", "tests/trainer/test_gpu_check.py::test_the_dry_run_runs_every_stage_and_reports_in_at_most_eight_files"),
    (r"coding-train eval .*", "tests/trainer/test_eval.py::test_eval_command_writes_report_and_figure"),
    (r"coding-train hint-uptake .*", "tests/trainer/test_hint_uptake.py::test_the_command_scores_each_source_and_the_policy_never_reads_the_reference"),
    (r"python benchmarks/learning_curve\.py .*", "tests/trainer/test_gpu_check.py::test_the_dry_run_runs_every_stage_and_reports_in_at_most_eight_files"),
    (r"python benchmarks/gpu_bundle\.py", "tests/trainer/test_gpu_check.py::test_parts_hold_at_most_their_size_and_unpack_to_the_same_files"),
    (r"python3 benchmarks/gpu_check\.py .*", "tests/trainer/test_gpu_check.py::test_the_dry_run_runs_every_stage_and_reports_in_at_most_eight_files"),
    (r"coding-train ingest .*", "tests/traces/test_trace_ingest.py::test_ingest_cli_writes_states_and_prints_counts"),
    (r"coding-train replay .*", "tests/traces/test_trace_cli.py::test_killed_run_resumes_without_paying_twice"),
]


def readme_commands() -> list[str]:
    """Every command line of the README's `bash` blocks: continuations joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            command = re.sub(r"(^|\s)#.*$", "", line).strip()
            if command:
                commands.append(re.sub(r"\s+", " ", command))
    return commands


def argv_of(command: str) -> list[str]:
    """The command's words as the tool receives them: `[--optional]` brackets opened, `$(which X)` as X, no `&`."""
    command = command.replace("$(which coding-train)", "coding-train").rstrip(" &")
    return shlex.split(re.sub(r"\[(--[^\]]+)\]", r"\1", command))


COMMANDS = readme_commands()


def test_the_readme_shows_commands() -> None:
    assert len(COMMANDS) >= 20 and "make test" in COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_every_readme_command_is_run_by_a_named_test(command: str) -> None:
    runners = [runner for pattern, runner in RUN_BY if re.fullmatch(pattern, command)]
    assert len(runners) == 1, f"README command {command!r} is run by {len(runners)} entries of RUN_BY: add the test that runs it"
    path, _, name = runners[0].partition("::")
    source = (ROOT / path).read_text()
    assert (f"def {name}(" in source) if path.endswith(".py") else (f"\n{name}:" in source or path == ".ci/run"), runners[0]


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith(("coding-env ", "coding-train ", "torchrun "))])
def test_cli_commands_parse_as_written(command: str) -> None:
    argv = argv_of(command)
    if argv[0] == "torchrun":
        argv = argv[argv.index("coding-train"):]
    parser = service_parser() if argv[0] == "coding-env" else trainer_parser()
    parser.parse_args(argv[1:])  # SystemExit(2) on an unknown subcommand or option


@pytest.mark.parametrize("command", [c for c in COMMANDS if re.match(r"python3? benchmarks/", c)])
def test_benchmark_options_are_in_their_help(command: str) -> None:
    argv = argv_of(command)
    shown = subprocess.run([sys.executable, str(ROOT / argv[1]), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    for option in (word.split("=")[0] for word in argv[2:] if word.startswith("--")):
        assert option in shown.stdout, f"{argv[1]} has no {option}"


def test_make_targets_and_pip_extras_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for command in COMMANDS:
        if command.startswith("make "):
            assert f"\n{command.split()[1]}:" in makefile, command
        if command.startswith("pip install"):
            for extra in re.search(r"\[([^\]]+)\]", command).group(1).split(","):
                assert extra in extras, f"{command}: no extra {extra!r}"
    # The README's offline path and the first-episode example are named in prose, not in a block.
    assert "\ncompose-offline:" in makefile and "make compose-offline" in README.read_text()


def test_the_cheap_task_commands_run_as_written() -> None:
    outputs = {}
    for command in ("coding-env tasks list --suite warmup --split held_out", "coding-env tasks show humaneval/HumanEval/0"):
        assert command in COMMANDS
        argv = argv_of(command)
        done = subprocess.run([str(Path(sys.executable).with_name(argv[0])), *argv[1:]], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        outputs[argv[2]] = done.stdout
    held_out = outputs["list"].split()
    assert 0 < len(held_out) < 1200 and all(task_id.startswith("warmup/") for task_id in held_out)  # a split, not the suite
    assert "HumanEval/0" in outputs["show"]
