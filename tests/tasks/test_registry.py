"""The registry, the suites' offline loading, and the tasks CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from env_server.models import TaskSpec
from env_server.tasks import StaticSuite, TaskRegistry, default_registry
from env_server.tasks.agent_bench import AgentBenchSuite
from env_server.tasks.cli import main
from env_server.tasks.codeio import CodeIOCases, CodeIOSuite, cache_path, write_cache


def test_suites_load_lazily_and_route_by_prefix() -> None:
    loaded: list[str] = []

    def factory(name: str):
        def load() -> StaticSuite:
            loaded.append(name)
            return StaticSuite([TaskSpec(id=f"{name}/a", prompt="p"), TaskSpec(id=f"{name}/b", prompt="p")])

        return load

    registry = TaskRegistry()
    registry.register("one", factory("one"))
    registry.register("two", factory("two"))
    assert registry.suites() == ["one", "two"] and loaded == []
    assert registry.get("two/b").id == "two/b" and loaded == ["two"]
    assert registry.ids() == ["one/a", "one/b", "two/a", "two/b"]
    with pytest.raises(KeyError, match="no suite 'three'"):
        registry.get("three/a")
    with pytest.raises(KeyError, match="unknown task 'one/c'"):
        registry.get("one/c")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("one", factory("one"))


def test_a_suite_may_be_named_with_hyphens_as_its_generator_is() -> None:
    registry = TaskRegistry()
    registry.register("feature_deletion", lambda: StaticSuite([TaskSpec(id="feature_deletion/x", prompt="p")]))
    assert registry.ids("feature-deletion") == registry.ids("feature_deletion") == ["feature_deletion/x"]


def test_agent_bench_keeps_offline_unprivileged_tasks_with_hidden_answers() -> None:
    suite = AgentBenchSuite()
    assert 70 <= len(suite.ids()) <= 100
    for task_id in suite.ids():
        task = suite.get(task_id)
        assert "/home/agent" not in (task.setup_command or "") and "useradd" not in (task.setup_command or "")
        assert task.hidden_tests and not task.files  # the expected answer is computed at grading time


def test_codeio_reads_its_cache_and_never_ships_the_reference(tmp_path: Path) -> None:
    from env_server.tasks.codeio import read_records

    records = read_records()
    index = next(i for i, r in enumerate(records) if "numpy" not in r["code_sample"] and "def main_solution(" in r["code_sample"])
    cases = [({"x": 1}, 2), ({"x": 2}, 3), ({"x": 5}, 6)]
    write_cache(cache_path(tmp_path), [CodeIOCases(index=index, cases=cases)])
    (task_id,) = CodeIOSuite(tmp_path).ids()
    task = CodeIOSuite(tmp_path).get(task_id)
    shipped = "".join(task.files.values()) + "".join(task.visible_tests.values())
    reference_body = records[index]["code_sample"].split("def main_solution", 1)[1].split(":", 1)[1]
    assert reference_body.strip()[:40] not in shipped
    first, _ = task.hidden_calls
    assert (first.function, first.kwargs, first.expected) == ("main_solution", {"x": ["int", 2]}, ["int", 3])
    assert '"x": 2' not in shipped and not task.hidden_tests


def test_a_cached_codeio_task_a_constant_would_pass_is_not_served(tmp_path: Path) -> None:
    from env_server.tasks.codeio import read_records

    records = read_records()
    index = next(i for i, r in enumerate(records) if "numpy" not in r["code_sample"] and "def main_solution(" in r["code_sample"])
    write_cache(cache_path(tmp_path), [CodeIOCases(index=index, cases=[({"x": 1}, 0), ({"x": 2}, 0), ({"x": 3}, 0)])])
    suite = CodeIOSuite(tmp_path)
    assert suite.ids() == []
    (task_id,) = suite.rejected
    with pytest.raises(KeyError, match="not served: baseline default"):
        suite.get(task_id)


def test_cli_lists_at_least_500_tasks_offline(capsys: pytest.CaptureFixture[str]) -> None:
    # Uses the shared cache: CodeIO's cases are generated there on first use (about a minute).
    assert main(["tasks", "list", "--counts"]) == 0
    counts = dict(line.split("\t") for line in capsys.readouterr().out.splitlines())
    assert int(counts["total"]) >= 500
    assert int(counts["humaneval"]) == 164 and int(counts["builtin"]) >= 3


def test_cli_show_hides_hidden_tests_and_rejects_unknown_ids(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["tasks", "--cache-dir", str(tmp_path), "show", "builtin/fizzbuzz"]) == 0
    shown = capsys.readouterr().out
    assert '"solution.fizzbuzz"' in shown and '"str"' not in shown and '"metadata"' not in shown  # no encoded values
    assert main(["tasks", "--cache-dir", str(tmp_path), "show", "builtin/nope"]) == 2
    assert "unknown task 'builtin/nope'" in capsys.readouterr().err


def test_default_registry_reads_generated_tasks_from_the_cache_dir(tmp_path: Path) -> None:
    registry = default_registry(tmp_path)
    assert registry.ids("feature_deletion") == []
    assert "feature_deletion" in registry.suites()


def test_cli_list_into_a_pipe_closed_early_exits_cleanly() -> None:
    # `coding-env tasks list | head -1`: the reader is gone before the listing is written (closed
    # here before the child starts writing, so every write fails); no traceback, status 0.
    listing = subprocess.Popen(
        [sys.executable, "-m", "env_server.tasks.cli", "tasks", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert listing.stdout is not None
    listing.stdout.close()
    assert listing.wait(timeout=120) == 0
    assert listing.stderr is not None and listing.stderr.read() == b""


def _codeio_record(code: str) -> dict[str, str]:
    generator = "def generate_inputs(rng):\n    return {'words': [rng.choice('abcdefgh') * rng.randint(1, 3) for _ in range(6)]}\n"
    return {"input_generator": generator, "code_sample": code}


def test_codeio_refuses_programs_whose_output_follows_string_hash_order() -> None:
    from env_server.tasks.codeio import run_reference

    hash_ordered = "def main_solution(words):\n    return list(set(words))\n"
    assert run_reference(_codeio_record(hash_ordered), seed=1) is None
    assert run_reference(_codeio_record("def main_solution(words):\n    return sorted(set(words))\n"), seed=1) is not None


def test_codeio_records_inputs_as_they_were_before_the_call() -> None:
    from env_server.tasks.codeio import run_reference

    mutating = "def main_solution(words):\n    first = words.pop(0)\n    return first + str(len(words))\n"
    cases = run_reference(_codeio_record(mutating), seed=1)
    assert cases is not None
    assert all(len(inputs["words"]) == 6 and output == inputs["words"][0] + "5" for inputs, output in cases)


@pytest.mark.docker
def test_codeio_generation_keeps_only_what_the_real_grader_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "--cache-dir", str(tmp_path), "generate", "codeio", "--n", "2"]) == 0
    assert "codeio: 2 tasks" in capsys.readouterr().out
    suite = CodeIOSuite(tmp_path, n=2)
    assert len(suite.ids()) == 2 and not suite.rejected


def test_codeio_refuses_programs_with_values_json_cannot_carry() -> None:
    from env_server.tasks.codeio import run_reference

    record = {"input_generator": "def generate_inputs(rng):\n    return {'x': rng.randint(1, 9)}\n",
              "code_sample": "def main_solution(x):\n    return [x, float('inf')]\n"}
    assert run_reference(record, seed=1) is None
