"""The trusted harness that runs a call table inside the grading sandbox (standard library only).

Copied at grading time into a fresh directory outside the workspace, next to `typed_values.py`
and `calls.json` (the calls' inputs: module, function, encoded arguments; never the expected
results), and run as `python3 -I call_harness.py DIR TIMEOUT_S PER_PROCESS` from the workspace.

The driver (this process) never imports the solution. It starts a worker process per
`PER_PROCESS` calls, in its own session, so state and monkeypatching do not carry far; each
call must answer within `TIMEOUT_S` (import time counts towards the first call of a worker) or
the worker's whole group is killed and the next call starts a fresh worker. A worker imports
the solution with the workspace *appended* to `sys.path` (a workspace `json.py` shadows
nothing), says `ready`, then writes one JSON line per call to a private descriptor (its stdout and stderr go to
/dev/null), and the driver appends the lines in order to `DIR/results.jsonl`.

Nothing here is a security boundary: the solution runs in the worker and can forge any line.
The host decides, comparing with expected values that never entered the sandbox, so a forged
line has to carry the right answer.
"""

import importlib
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import time

MAX_RESULT_BYTES = 1 << 20
"""A result line longer than this fails its call (and keeps the host's memory bounded)."""

MAX_TOTAL_BYTES = 16 << 20
"""Past this many bytes of results the remaining calls are not run."""

STARTUP_TIMEOUT_S = 60.0
"""How long a worker may take to start, before its first call's own time limit begins."""


def _load_codec(directory):
    spec = importlib.util.spec_from_file_location("_grader_typed_values", os.path.join(directory, "typed_values.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _exception_name(error_type):
    module = getattr(error_type, "__module__", "?")
    name = getattr(error_type, "__qualname__", "?")
    return name if module == "builtins" else f"{module}.{name}"


def work(directory, first, count):
    """Worker: run calls first..first+count-1, one result line each on a private descriptor."""
    codec = _load_codec(directory)
    with open(os.path.join(directory, "calls.json")) as handle:
        calls = json.load(handle)[first : first + count]
    out = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.path.append(os.getcwd())
    os.write(out, b"ready\n")
    for offset, call in enumerate(calls):
        try:
            args = [codec.decode(value) for value in call["args"]]
            kwargs = {name: codec.decode(value) for name, value in call["kwargs"].items()}
            function = getattr(importlib.import_module(call["module"]), call["function"])
            result = function(*args, **kwargs)
            if call["json_result"]:
                result = json.loads(json.dumps(result))
            line = {"i": first + offset, "returned": codec.encode(result)}
            if call["report_args"]:
                line["args"] = [codec.encode(value) for value in args]
        except BaseException as error:  # SystemExit and KeyboardInterrupt are the solution's too
            line = {"i": first + offset, "raised": _exception_name(type(error))}
        try:
            data = json.dumps(line, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):  # e.g. an int too long to print
            data = json.dumps({"i": first + offset, "returned": list(codec.UNENCODABLE)})
        os.write(out, data.encode() + b"\n")


def _start_worker(directory, first, count):
    return subprocess.Popen(
        [sys.executable, "-I", "-B", os.path.abspath(__file__), "--work", directory, str(first), str(count)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )


def _kill(worker):
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except OSError:
        pass
    worker.wait()


def drive(directory, timeout_s, per_process):
    """Driver: run every call through workers, write `results.jsonl` in call order."""
    with open(os.path.join(directory, "calls.json")) as handle:
        total = len(json.load(handle))
    written = 0
    with open(os.path.join(directory, "results.jsonl"), "w") as results:
        index = 0
        while index < total and written < MAX_TOTAL_BYTES:
            count = min(per_process, total - index)
            worker = _start_worker(directory, index, count)
            buffer = b""
            # Starting an interpreter is not the solution's time (a loaded host can take seconds).
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            started = False
            end = index + count
            while index < end:
                newline = buffer.find(b"\n")
                if newline >= 0:
                    line, buffer = buffer[:newline], buffer[newline + 1 :]
                    if not started:
                        started = line == b"ready"
                        deadline = time.monotonic() + timeout_s
                        if started:
                            continue
                    outcome = _parse(line, index)
                    data = json.dumps(outcome, separators=(",", ":")) + "\n"
                    results.write(data)
                    written += len(data)
                    index += 1
                    deadline = time.monotonic() + timeout_s
                    continue
                remaining = deadline - time.monotonic()
                ready = select.select([worker.stdout], [], [], max(remaining, 0))[0] if remaining > 0 else []
                chunk = os.read(worker.stdout.fileno(), 65536) if ready else None
                if chunk and len(buffer) + len(chunk) <= MAX_RESULT_BYTES:
                    buffer += chunk
                    continue
                # Timed out, died (EOF) or sent too much: this call fails, the next starts afresh.
                kind = "timeout" if chunk is None else ("crashed" if not chunk else "too_large")
                results.write(json.dumps({"i": index, kind: True}) + "\n")
                index += 1
                break
            _kill(worker)
            worker.stdout.close()
        results.flush()


def _parse(line, index):
    """A worker's line for call `index`, or a failure if it is not one."""
    try:
        outcome = json.loads(line)
    except ValueError:
        return {"i": index, "malformed": True}
    if type(outcome) is not dict or outcome.get("i") != index:
        return {"i": index, "malformed": True}
    return outcome


if __name__ == "__main__":
    if sys.argv[1] == "--work":
        work(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        drive(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))
