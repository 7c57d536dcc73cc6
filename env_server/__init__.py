"""The environment service (`coding-env serve`): docs/api.md.

Importing this package keeps OpenEnv's gradio web interface out of the process. OpenEnv's server package imports
that interface whenever gradio is installed (openenv depends on it) and skips it when the import fails; the service
never mounts it, and importing gradio took 2.2 s of every process that imported the service's modules (the
service's start, each `coding-env` command, each benchmark). Only OpenEnv's web interface is refused gradio: a
process's own `import gradio` works as ever.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

OPENENV_WEB_INTERFACE = "openenv.core.env_server.web_interface"


class _NoGradioForOpenEnvWebInterface(MetaPathFinder):
    """Refuses `gradio` while OpenEnv's web interface is being imported (the module is in `sys.modules` from the
    start of its import, and taken out again when the import fails)."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name == "gradio" and OPENENV_WEB_INTERFACE in sys.modules:
            raise ModuleNotFoundError("gradio is kept out of OpenEnv's web interface (env_server/__init__.py)", name=name)
        return None


sys.meta_path.insert(0, _NoGradioForOpenEnvWebInterface())
