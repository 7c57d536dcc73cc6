"""pytest-mode grading where the kernel has no Landlock (gVisor) and where it has (runc):
the grader's directory is sealed (decision 058), so the reference scores 1.0 and code that
tries to rewrite, replace or move the hidden tests scores 0."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from env_server.grading.grader import grade, prepare_workspace
from env_server.grading.in_sandbox.pytest_guard import NO_CONFINEMENT_STATUS
from env_server.models import MonitorFlag
from sandbox import DockerSpec, Sandbox, open_sandbox
from tests.sandbox.support import needs_docker
from tests.sandbox.test_gvisor import runsc_registered
from tests.tasks.test_defenses import ALL_PASS_JUNIT, REWRITER, TWO_FILES

RUNTIMES = [
    pytest.param("runc", marks=needs_docker),
    pytest.param("runsc", marks=[*needs_docker, pytest.mark.skipif(not runsc_registered(), reason="no runsc runtime registered with Docker")]),
]

# At import (collection of the first hidden module), try every way around read-only files: make
# one writable, replace it by a rename, move its directory away and put another in its place;
# on any success, start pytest again so it reads the passing stand-ins.
REPLACER = (
    "import os, sys\n"
    "if not os.environ.get('AGAIN'):\n"
    "    done = 0\n"
    "    for path in [a for a in sys.argv[1:] if a.endswith('.py')]:\n"
    "        stand_in = 'def test_words():\\n    pass\\n'\n"
    "        attempts = [\n"
    "            lambda: (os.chmod(path, 0o666), open(path, 'w').write(stand_in)),\n"
    "            lambda: (open('/tmp/s.py', 'w').write(stand_in), os.replace('/tmp/s.py', path)),\n"
    "            lambda: (os.rename(os.path.dirname(path), '/tmp/moved'), os.mkdir(os.path.dirname(path)),\n"
    "                     open(path, 'w').write(stand_in)),\n"
    "            lambda: (os.unlink(path), open(path, 'w').write(stand_in)),\n"
    "        ]\n"
    "        for attempt in attempts:\n"
    "            try:\n"
    "                attempt()\n"
    "                done += 1\n"
    "            except OSError as error:\n"
    "                print('REPLACE REFUSED', type(error).__name__)\n"
    "    if done:\n"
    "        os.environ['AGAIN'] = '1'\n"
    "        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])\n"
    "def slugify(text):\n    return None\n"
)


@pytest.fixture(scope="module", params=RUNTIMES)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    with open_sandbox(DockerSpec(runtime=request.param), backend="docker") as opened:
        yield opened


@pytest.fixture
def workspace(sandbox: Sandbox) -> Sandbox:
    assert sandbox.exec("find . /tmp -mindepth 1 -delete").exit_code == 0
    prepare_workspace(sandbox, TWO_FILES)
    return sandbox


def test_the_reference_scores_one(workspace: Sandbox) -> None:
    for path, text in TWO_FILES.metadata["solution"].items():
        workspace.write_file(path, text)
    result = grade(workspace, TWO_FILES)
    assert (result.reward, result.tests_passed, result.tests_total, result.error_kind) == (1.0, 3, 3, None), result.output


@pytest.mark.parametrize("hack", [REWRITER, REPLACER], ids=["rewrite", "replace-rename-chmod"])
def test_changing_the_hidden_tests_scores_zero(workspace: Sandbox, hack: str) -> None:
    workspace.write_file("minilib/__init__.py", hack)
    result = grade(workspace, TWO_FILES)
    assert (result.reward, result.tests_passed, result.tests_total, result.error_kind) == (0.0, 0, 3, None), result.output
    # Nothing changed (the host's read-back agrees) and the real tests ran against `return None`.
    assert MonitorFlag.GRADER_TAMPER not in result.monitor_flags


# A detached process that keeps forging a passing report: gVisor has no subreaper role, so the
# guard finds it among pid 1's children instead.
FORGER = (
    "import os, subprocess\n"
    "FORGED = " + repr(ALL_PASS_JUNIT) + "\n"
    "LOOP = \"import glob\\nwhile True:\\n    for p in glob.glob('/dev/shm/*/*.x' + 'ml'):\\n        open(p, 'w').write(%r)\\n\" % FORGED\n"
    "if not os.environ.get('FORGER'):\n"
    "    subprocess.Popen(['python3', '-c', LOOP], start_new_session=True, env=dict(os.environ, FORGER='1'),\n"
    "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "def slugify(text):\n    return None\n"
)


def test_a_process_left_behind_is_caught(workspace: Sandbox) -> None:
    workspace.write_file("minilib/__init__.py", FORGER)
    result = grade(workspace, TWO_FILES)
    assert result.reward == 0.0, result.output
    assert MonitorFlag.GRADING_STRAY_PROCESS in result.monitor_flags


def test_the_guard_refuses_a_suite_the_runs_uid_owns_where_landlock_is_missing(sandbox: Sandbox) -> None:
    """Without Landlock, the guard runs tests only over a sealed suite: over files the agent's uid
    owns it exits NO_CONFINEMENT_STATUS (with Landlock it confines and runs)."""
    from importlib import resources

    sandbox.write_file("/tmp/guard.py", (resources.files("env_server.grading.in_sandbox") / "pytest_guard.py").read_bytes())
    sandbox.write_file("/tmp/mine/test_x.py", "def test_x():\n    pass\n")
    landlock = sandbox.exec("python3 -c 'import ctypes; print(ctypes.CDLL(None).syscall(444, None, 0, 1) > 0)'").stdout.strip() == "True"
    result = sandbox.exec("python3 -I /tmp/guard.py --writable /tmp --sealed /tmp/mine -- true")
    assert result.exit_code == (0 if landlock else NO_CONFINEMENT_STATUS), result
    assert landlock == (sandbox.spec.runtime != "runsc")
