"""The in-sandbox supervisor program and how a backend starts it.

The supervisor is not baked into the image: the host starts `python3 -c BOOTSTRAP` inside the
sandbox and streams `supervisor.py` over stdin before the first request (decision 001). Any
image with a `python3` can host it and the protocol never drifts from the host's version.
"""

from __future__ import annotations

from importlib.resources import files

SOURCE: bytes = files(__package__).joinpath("supervisor.py").read_bytes()
"""The supervisor's source, sent as the first bytes on the channel."""

# Reads exactly len(SOURCE) bytes from stdin and runs them as __main__; the rest of stdin is
# then the request stream. -I: ignore the environment and user site, -S: skip site, -B: no .pyc.
_BOOTSTRAP = (
    "import sys;"
    "n=int(sys.argv[1]);del sys.argv[1];"
    "exec(compile(sys.stdin.buffer.read(n),'supervisor.py','exec'),{'__name__':'__main__'})"
)


def bootstrap_argv(workdir: str, run_as: str | None = None, python: str = "python3") -> list[str]:
    """Command line that starts the supervisor; send `SOURCE` and then the channel key (one hex
    line) on its stdin right after. `run_as` ("uid:gid"): a root supervisor runs every command
    and file operation as that identity (decision 006)."""
    argv = [python, "-I", "-S", "-B", "-c", _BOOTSTRAP, str(len(SOURCE)), "--workdir", workdir]
    return argv + ["--run-as", run_as] if run_as else argv
