"""Command execution through the supervisor, on both backends."""

from __future__ import annotations

import threading

from sandbox import Sandbox


def test_exec_returns_output_and_exit_code(sandbox: Sandbox) -> None:
    result = sandbox.exec("python3 -c 'print(1)'; echo err >&2; exit 3", timeout_s=10)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "1\n", "err\n")
    assert not (result.timed_out or result.truncated or result.oom_killed)
    assert result.signal is None


def test_command_killed_by_a_signal_reports_it(sandbox: Sandbox) -> None:
    result = sandbox.exec("kill -TERM $$")
    assert result.exit_code is None and result.signal == 15


def test_commands_run_in_the_workspace_with_a_fixed_environment(sandbox: Sandbox) -> None:
    result = sandbox.exec('pwd; echo "$PAGER $GIT_EDITOR $PYTHONDONTWRITEBYTECODE $EXTRA"', env={"EXTRA": "x"})
    assert result.stdout == f"{sandbox.spec.workdir}\ncat true 1 x\n"


def test_commands_run_in_the_utf8_locale(sandbox: Sandbox) -> None:
    # The image keeps C.UTF-8 in a locale archive (a cheaper start): the locale must load from it.
    result = sandbox.exec("locale charmap; printf '\\303\\251' | wc -m", timeout_s=10)
    assert (result.stdout, result.stderr) == ("UTF-8\n1\n", "")


def test_commands_run_as_an_unprivileged_user(sandbox: Sandbox) -> None:
    assert sandbox.exec("id -u").stdout.strip() == "1000"


def test_timeout_kills_the_whole_group_and_keeps_partial_output(sandbox: Sandbox) -> None:
    result = sandbox.exec("echo started; sleep 1000 & echo $! > bg.pid; while true; do :; done", timeout_s=2)
    assert result.timed_out and result.signal == 9 and result.exit_code is None
    assert result.stdout == "started\n"
    assert sandbox.exec("kill -0 $(cat bg.pid)").exit_code != 0, "background grandchild survived"


def test_background_children_do_not_outlive_their_command(sandbox: Sandbox) -> None:
    result = sandbox.exec("sleep 1000 & echo $! > bg.pid; echo done")
    assert (result.exit_code, result.stdout) == (0, "done\n")
    assert sandbox.exec("kill -0 $(cat bg.pid)").exit_code != 0


def test_output_is_capped_keeping_head_and_tail(sandbox: Sandbox) -> None:
    result = sandbox.exec("seq 1 200000")
    assert result.truncated and result.exit_code == 0
    assert result.stdout.startswith("1\n2\n3\n") and result.stdout.endswith("199999\n200000\n")
    assert "bytes truncated" in result.stdout
    assert len(result.stdout.encode()) < sandbox.spec.output_cap_bytes + 100


def test_endless_output_is_capped_and_returns_at_the_timeout(sandbox: Sandbox) -> None:
    result = sandbox.exec("yes", timeout_s=2)  # the cap is reached in milliseconds
    assert result.timed_out and result.truncated
    assert result.stdout.startswith("y\ny\n")
    assert len(result.stdout.encode()) < sandbox.spec.output_cap_bytes + 100
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_invalid_utf8_is_decoded_with_replacement(sandbox: Sandbox) -> None:
    result = sandbox.exec(r"printf 'a\xff\xfeb'; printf '\xc3' >&2")
    assert result.stdout == "a\ufffd\ufffdb" and result.stderr == "\ufffd"


def test_a_command_reading_stdin_gets_eof_at_once(sandbox: Sandbox) -> None:
    assert sandbox.exec("cat; read line; echo read=$?", timeout_s=10).stdout == "read=1\n"
    assert sandbox.exec("python3 -c 'import sys; print(len(sys.stdin.read()))'", timeout_s=10).stdout == "0\n"


def test_a_slow_command_does_not_block_other_requests(sandbox: Sandbox) -> None:
    results = []
    waiter = threading.Thread(target=lambda: results.append(sandbox.exec("until [ -f go ]; do sleep 0.01; done; echo went", timeout_s=30)))
    waiter.start()
    assert sandbox.is_alive()  # served while the loop is running
    sandbox.write_file("go", "")
    waiter.join()
    assert results[0].stdout == "went\n" and not results[0].timed_out


def test_requests_in_flight_at_once_each_run_at_once(sandbox: Sandbox) -> None:
    # Each command finishes only once all four are running: served one after another (a handler
    # thread reused while busy, or too few started after earlier requests), every one times out.
    for _ in range(3):
        sandbox.exec("true", timeout_s=10)
    every_ready = " && ".join(f"[ -f ready-{k} ]" for k in range(4))
    results: list = [None] * 4

    def run(k: int) -> None:
        results[k] = sandbox.exec(f"touch ready-{k}; until {every_ready}; do sleep 0.01; done; echo {k}", timeout_s=30)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [(r.stdout, r.timed_out) for r in results] == [(f"{k}\n", False) for k in range(4)]
