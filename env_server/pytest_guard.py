"""The trusted wrapper of a pytest-mode grading run (standard library only; runs in the sandbox).

Run as `python3 -I pytest_guard.py -- COMMAND...` as the grading command's last word (`exec`),
so its exit status is the one the supervisor reports: the only channel out of the grading
sandbox that the test process cannot write.

It makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so every process the test run
leaves behind, however detached (double fork, `setsid`), is reparented to it. After the test
command ends it kills and reaps every such orphan; no process of the run is alive when the
host reads the report afterwards. Any orphan at all means something may have rewritten the
report once the tests had finished, so the status says so.

Exit status: the test command's own (0-99) when no orphan was seen; `ORPHANS_STATUS` when one
was; `NO_SUBREAPER_STATUS` when the kernel refused the subreaper role. Anything else (a killed
guard, a signal) is untrusted by the host too.
"""

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36
ORPHANS_STATUS = 120
NO_SUBREAPER_STATUS = 121


def _children(parent):
    """Pids whose parent is `parent` (from /proc; a process gone meanwhile is skipped)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(parent):
            found.append(int(entry))
    return found


def _reap_orphans():
    """Kill and reap every remaining descendant; whether there was any."""
    orphans = False
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return orphans
        if pid:
            orphans = True
            continue
        for child in _children(os.getpid()):
            orphans = True
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(-1, 0)
            orphans = True
        except ChildProcessError:
            return orphans


def main(command):
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return NO_SUBREAPER_STATUS
    status = subprocess.call(command)
    orphans = _reap_orphans()
    if orphans:
        return ORPHANS_STATUS
    return status if 0 <= status < 100 else 99  # a signal (negative) or an odd status


if __name__ == "__main__":
    sys.stdout.flush()
    sys.exit(main(sys.argv[sys.argv.index("--") + 1 :]))
