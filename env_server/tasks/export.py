"""`coding-env tasks export`: a suite as dataset rows that TRL, verl and SkyRL read as they are.

A row names its task; it never carries the task. The episode's prompt comes from the service at
reset, and what grades it (hidden tests, hidden calls and their values, hidden files, reference
solutions, everything under `metadata`) stays in the service. The columns:

- `prompt`: one empty user message, which the reset's observation fills in (TRL's
  `environment_factory` and `trainer_client.task_rows.task_row`; verl's and SkyRL's adapters
  append the task's prompt after it).
- `task_id`: the task (TRL passes the row to `reset(**row)`; SkyRL passes it in `extras`).
- `data_source`: `coding-env/<suite>` (verl and SkyRL group their metrics by it).
- `agent_name`: the verl agent loop that plays the row (`trainer_client.integrations.verl`).
- `env_class`: the SkyRL environment that plays it (`trainer_client.integrations.skyrl`).
- `extra_info`: `task_id`, `suite`, `split` (verl's agent loop reads `extra_info["task_id"]`), and
  for real-repository tasks their `difficulty` (lines changed, tests failing, hidden files, call
  depth: a curriculum's keys).
- `task_prompt`, `max_steps`: what the agent is told at reset and its step budget, for browsing
  and curricula.
- `source`, `license`: where the task comes from and under which licence.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args

from env_server.models import TaskSpec
from env_server.tasks import TaskRegistry
from env_server.tasks.splits import Split, split_of

Format = Literal["jsonl", "parquet"]
FORMATS: tuple[Format, ...] = get_args(Format)

PLAYER_NAME = "coding_env"
"""The name the verl agent loop and the SkyRL environment are registered under."""

PROJECT_LICENSE = "Apache-2.0"
"""The licence of the tasks this project wrote itself (the builtin, warmup and canary suites)."""

UNKNOWN_LICENSE = "unknown (see the project's LICENSE)"


def dataset_row(task: TaskSpec, suite: str) -> dict[str, Any]:
    """The exported row of `task`: public facts only (see the module's docstring)."""
    split = split_of(task.id)
    source = str(task.metadata.get("source") or f"coding-env {suite} suite")
    return {
        "prompt": [{"role": "user", "content": ""}],
        "task_id": task.id,
        "data_source": f"coding-env/{suite}",
        "agent_name": PLAYER_NAME,
        "env_class": PLAYER_NAME,
        "extra_info": {"task_id": task.id, "suite": suite, "split": split}
        | ({"difficulty": task.metadata["difficulty"]} if task.metadata.get("difficulty") else {}),
        "task_prompt": task.prompt,
        "max_steps": task.limits.max_steps,
        "source": source,
        "license": task.metadata.get("license", None if "source" in task.metadata else PROJECT_LICENSE),
    }


def dataset_rows(registry: TaskRegistry, suite: str, split: Split | None = None) -> Iterator[dict[str, Any]]:
    """The rows of every task of `suite` that the service serves (in `split`, when given)."""
    for task_id in registry.ids(suite, split=split):
        yield dataset_row(registry.get(task_id), suite)


def write_rows(rows: list[dict[str, Any]], path: Path, fmt: Format) -> None:
    """`rows` as JSON lines, or as one Parquet file (needs pyarrow: the `train` extra has it)."""
    if fmt == "jsonl":
        with path.open("w", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("--format parquet needs pyarrow: pip install pyarrow (the 'train' extra has it), or use --format jsonl") from None
    pq.write_table(pa.Table.from_pylist(rows), path)


def dataset_card(suite: str, rows: list[dict[str, Any]], data_file: str, split: Split | None) -> str:
    """A Hugging Face dataset card (README.md): the rows' schema, sources and licences."""
    sources = Counter((row["source"], row["license"] or UNKNOWN_LICENSE) for row in rows)
    splits = Counter(row["extra_info"]["split"] for row in rows)
    licenses = {row["license"] for row in rows}
    card_license = next(iter(licenses)).lower() if len(licenses) == 1 and None not in licenses else "other"
    lines = [
        "---",
        f"license: {card_license}",
        "task_categories:",
        "- text-generation",
        "tags:",
        "- reinforcement-learning",
        "- code",
        "- coding-env",
        "configs:",
        "- config_name: default",
        "  data_files:",
        f"  - split: {split or 'train'}",
        f"    path: {data_file}",
        "---",
        "",
        f"# coding-env tasks: {suite}",
        "",
        f"{len(rows)} tasks of the `{suite}` suite"
        + (f", {split} split only" if split else f" ({', '.join(f'{n} {name}' for name, n in sorted(splits.items()))}, by a hash of the id)")
        + ", exported by `coding-env tasks export`. A row names a task; it does not carry it. Play a row"
        " against a running coding-env service: the prompt is filled in at reset, and the hidden tests"
        " that grade it never leave the service, so this file cannot leak them.",
        "",
        "## How to use",
        "",
        "- TRL: `GRPOTrainer(..., train_dataset=rows, environment_factory=...)` with",
        "  `trainer_client.TrlEnvironment`: each row's `task_id` is passed to `reset`.",
        "- verl: rows name the `coding_env` agent loop (`agent_name`); it resets on `extra_info.task_id`.",
        "- SkyRL: rows name the `coding_env` environment (`env_class`); it resets on `task_id`.",
        "",
        "## Columns",
        "",
        "| column | meaning |",
        "|---|---|",
        "| `prompt` | one empty user message; the reset's observation fills it in |",
        "| `task_id` | the task the service resets onto |",
        "| `data_source` | `coding-env/<suite>` |",
        "| `agent_name`, `env_class` | the verl agent loop and the SkyRL environment that play it |",
        "| `extra_info` | `task_id`, `suite`, `split` (`train` or `held_out`, fixed by the id) |",
        "| `task_prompt` | what the agent is told at reset |",
        "| `max_steps` | the episode's step budget |",
        "| `source`, `license` | where the task comes from, under which licence |",
        "",
        "## Sources and licences",
        "",
        "| source | licence | tasks |",
        "|---|---|---|",
        *(f"| {source} | {licence} | {count} |" for (source, licence), count in sorted(sources.items())),
        "",
    ]
    return "\n".join(lines)


def export_suite(registry: TaskRegistry, suite: str, out: Path, fmt: Format, split: Split | None = None) -> tuple[Path, int]:
    """Write `suite`'s rows and their dataset card (README.md) into the directory `out`; the data
    file's path and the number of rows."""
    rows = list(dataset_rows(registry, suite, split))
    if not rows:
        raise ValueError(f"suite {suite!r} has no task to export" + (f" in the {split} split" if split else ""))
    out.mkdir(parents=True, exist_ok=True)
    data_file = f"{suite}{'-' + split if split else ''}.{fmt}"
    write_rows(rows, out / data_file, fmt)
    (out / "README.md").write_text(dataset_card(suite, rows, data_file, split), encoding="utf-8")
    return out / data_file, len(rows)
