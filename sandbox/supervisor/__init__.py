"""The in-sandbox supervisor program and how a backend starts it.

The supervisor is not baked into the image: the host starts `python3 -c BOOTSTRAP` inside the
sandbox and streams `supervisor.py` over stdin before the first request (decision 001). Any
image with a `python3` can host it and the protocol never drifts from the host's version.
"""

from __future__ import annotations

import marshal
from importlib.resources import files
from importlib.util import MAGIC_NUMBER

SOURCE: bytes = files(__package__).joinpath("supervisor.py").read_bytes()
"""The supervisor's source, sent as the first bytes on the channel."""

CODE: bytes = marshal.dumps(compile(SOURCE, "supervisor.py", "exec"))
"""The source compiled by this process's Python, sent right after it: a sandbox whose Python reads the same
bytecode (the same magic number) runs it instead of compiling the source, 7-9 ms of every cold start on a 2-core
VM. One from another Python compiles the source, as before."""

# Reads len(SOURCE) and then len(CODE) bytes from stdin and runs, as __main__, the code if its Python's magic
# number is the host's, else the source; the rest of stdin is then the request stream. -I: ignore the
# environment and user site, -S: skip site, -B: no .pyc. `_frozen_importlib_external` is loaded at every start.
_BOOTSTRAP = (
    "import sys,marshal;"
    "n,k=int(sys.argv[1]),int(sys.argv[2]);"
    "same=sys.argv[3]==getattr(sys.modules.get('_frozen_importlib_external'),'MAGIC_NUMBER',b'').hex();"
    "del sys.argv[1:4];"
    "s=sys.stdin.buffer.read(n);c=sys.stdin.buffer.read(k);"
    "exec(marshal.loads(c) if same else compile(s,'supervisor.py','exec'),{'__name__':'__main__'})"
)


def bootstrap_argv(workdir: str, run_as: str | None = None, python: str = "python3") -> list[str]:
    """Command line that starts the supervisor; send `SOURCE`, `CODE` and then the channel key (one hex
    line) on its stdin right after. `run_as` ("uid:gid"): a root supervisor runs every command
    and file operation as that identity (decision 006)."""
    argv = [python, "-I", "-S", "-B", "-c", _BOOTSTRAP, str(len(SOURCE)), str(len(CODE)), MAGIC_NUMBER.hex(), "--workdir", workdir]
    return argv + ["--run-as", run_as] if run_as else argv
