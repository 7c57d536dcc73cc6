"""The trusted wrapper of a pytest-mode grading run (standard library only; runs in the sandbox).

Run as `python3 -I pytest_guard.py [--writable PATH]... -- COMMAND...` as the grading command's last word (`exec`),
so its exit status is the one the supervisor reports: the only channel out of the grading
sandbox that the test process cannot write.

It makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so every process the test run
leaves behind, however detached (double fork, `setsid`), is reparented to it. After the test
command ends it kills and reaps every such orphan; no process of the run is alive when the
host reads the report afterwards. Any orphan at all means something may have rewritten the
report once the tests had finished, so the status says so. Where the kernel has no subreaper
role (gVisor answers EINVAL) orphans are reparented to the sandbox's init (pid 1) instead: the
guard then kills every live process of its own uid whose parent is pid 1 until none is left
(decision 058). No process of the run can change its uid (no-new-privileges, no capabilities),
and nothing else of that uid has pid 1 as its parent (the supervisor's file worker is the
supervisor's child).

Before the test command starts (so before any code of the submission runs) it confines itself
and everything it starts with Landlock (docs/decisions/055-pytest-mode-out-of-the-agents-reach.md):
files may be created, written, renamed, linked or removed only beneath the paths given with
`--writable`. The hidden tests, the canaries and this file live elsewhere, so no process of the
run can change them, whatever its uid; reading stays allowed everywhere.

Where the kernel has no Landlock (gVisor, older kernels) the run is confined all the same if
every path given with `--sealed` is out of its uid's reach (decision 058): that path, everything
beneath it and every directory above it belong to another uid and are not writable by their
group or others, and nothing beneath it is a link; a directory above it may be writable by
others only if it is sticky (so nobody but its owner, or the owner of an entry, can remove or
rename that entry).

Exit status: the test command's own (0-99) when no orphan was seen; `ORPHANS_STATUS` when one
was; `NO_SUBREAPER_STATUS` when neither way of finding orphans works; `NO_CONFINEMENT_STATUS`
when neither confinement holds (the tests are not run). Anything else (a killed guard, a signal)
is untrusted by the host too.
"""

import ctypes
import os
import signal
import stat
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
ORPHANS_STATUS = 120
NO_SUBREAPER_STATUS = 121
NO_CONFINEMENT_STATUS = 122

# Landlock (linux/landlock.h). The syscall numbers are the same on every architecture that has them.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
ACCESS_WRITE_FILE = 1 << 1
# Every way to change the tree: write, remove, make (files, directories, links, nodes), move
# across directories (ABI 2) and truncate (ABI 3). Reading and executing are not handled.
TREE_ACCESS_BY_ABI = {
    1: ACCESS_WRITE_FILE | sum(1 << bit for bit in range(4, 13)),
    2: ACCESS_WRITE_FILE | sum(1 << bit for bit in range(4, 14)),
    3: ACCESS_WRITE_FILE | sum(1 << bit for bit in range(4, 15)),
}
ACCESS_TRUNCATE = 1 << 14


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


def _orphans_of_init(uid):
    """Live (not zombie) processes of `uid` whose parent is pid 1 (read from /proc/PID/status,
    which a non-dumpable process cannot hide as it can its /proc directory's owner)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        state, parent, uids = fields.get("State", "").split(), fields.get("PPid", "").strip(), fields.get("Uid", "").split()
        if parent == "1" and state[:1] != ["Z"] and str(uid) in uids:
            found.append(int(entry))
    return found


def _kill_init_orphans():
    """Without a subreaper: kill every process of the run that outlived its parent, sweeping until
    none is left (a child one of them forked meanwhile is reparented to pid 1 in turn); whether
    there was any."""
    orphans = False
    while found := _orphans_of_init(os.getuid()):
        orphans = True
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os.sched_yield()
    return orphans


def confine_writes(writable):
    """Allow changes to the file tree only beneath `writable` (directories, or files such as
    /dev/null), for this process and all it starts; False when Landlock is unavailable."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        return False
    handled = TREE_ACCESS_BY_ABI[min(abi, 3)]
    # struct landlock_ruleset_attr's first field; the kernel takes an older, shorter struct.
    ruleset = ctypes.c_uint64(handled)
    ruleset_fd = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(ruleset), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset_fd < 0:
        return False
    # struct landlock_path_beneath_attr is packed: u64 allowed_access, s32 parent_fd.
    beneath = (ctypes.c_char * 12)()
    for path in writable:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # e.g. a device this sandbox does not have
        allowed = handled if os.path.isdir(path) else handled & (ACCESS_WRITE_FILE | ACCESS_TRUNCATE)
        ctypes.memmove(beneath, allowed.to_bytes(8, "little") + fd.to_bytes(4, "little", signed=True), 12)
        added = libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset_fd, LANDLOCK_RULE_PATH_BENEATH, beneath, ctypes.c_uint32(0))
        os.close(fd)
        if added != 0:
            os.close(ruleset_fd)
            return False
    confined = libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 and libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset_fd, ctypes.c_uint32(0)) == 0
    os.close(ruleset_fd)
    return confined


def _out_of_reach(info, uid, sticky_allowed=False):
    """Whether a directory entry's `lstat` shows it cannot be changed by `uid`: another uid owns it
    (an owner may chmod) and neither its group nor others may write (whatever our groups; with an
    ACL the group bits are its mask, so no named user or group may write either), unless
    `sticky_allowed` and it is a sticky directory."""
    if info.st_uid == uid:
        return False
    writable = info.st_mode & 0o022
    return not writable or (sticky_allowed and stat.S_ISDIR(info.st_mode) and bool(info.st_mode & stat.S_ISVTX))


def is_sealed(path):
    """Whether `path` and everything beneath it are regular files and directories that this
    process's uid can neither change, remove, rename nor add to (see the module's docstring)."""
    uid = os.geteuid()
    path = os.path.abspath(path)
    try:
        above = os.path.dirname(path)
        while True:  # every directory above it, up to /
            if not _out_of_reach(os.lstat(above), uid, sticky_allowed=True):
                return False
            if above == "/":
                break
            above = os.path.dirname(above)
        pending = [path]
        while pending:
            current = pending.pop()
            info = os.lstat(current)
            if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)) or not _out_of_reach(info, uid):
                return False
            if stat.S_ISDIR(info.st_mode):
                pending.extend(os.path.join(current, name) for name in os.listdir(current))
    except OSError:
        return False
    return True


def main(writable, command, sealed=()):
    subreaper = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    if not subreaper and os.getppid() == 1:
        return NO_SUBREAPER_STATUS  # its orphans could not be told from the run's
    if not confine_writes(writable) and not (sealed and all(is_sealed(path) for path in sealed)):
        return NO_CONFINEMENT_STATUS
    status = subprocess.call(command)
    orphans = _reap_orphans() if subreaper else _kill_init_orphans()
    if orphans:
        return ORPHANS_STATUS
    return status if 0 <= status < 100 else 99  # a signal (negative) or an odd status


if __name__ == "__main__":
    sys.stdout.flush()
    separator = sys.argv.index("--")
    options = sys.argv[1:separator]
    # `--writable PATH`, repeated: where the test run may change files; `--sealed PATH`, repeated:
    # what must be out of its reach when Landlock is unavailable.
    given = [(options[i], options[i + 1]) for i in range(0, len(options), 2)]
    sys.exit(main([path for option, path in given if option == "--writable"], sys.argv[separator + 1 :], [path for option, path in given if option == "--sealed"]))
