"""Replicas of the service as real `coding-env serve` processes behind a real nginx, on loopback.

Each replica's listening socket is bound here and handed to the process (`--fd`); this process then
closes its copy, so a killed replica's port refuses connections at once (as a dead host's would).
A replica is ready when uvicorn logs the end of its start-up (warm pool started), read from its
stderr; nginx is handed a socket already listening, so it needs no readiness wait.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from deploy.nginx.render import Replica, render

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0
"""Longest wait for a replica's start-up (a warm pool of real sandboxes on a loaded machine)."""
STOP_TIMEOUT_S = 90.0
"""Longest wait for a replica's graceful shutdown (every session and pool closed)."""
READY_LINE = "Application startup complete"
"""What uvicorn logs once the app's lifespan start-up (pools, orphan reaping) has finished."""

REPLICA_ENV = {
    "CODING_ENV_POOL_SIZE": "1",
    "CODING_ENV_GRADING_POOL_SIZE": "0",
    "CODING_ENV_MAX_SESSIONS": "24",
    "CODING_ENV_ADMISSION_TIMEOUT_S": "60",
    "CODING_ENV_LOG_LEVEL": "info",
    "CODING_ENV_REAP_ORPHANS_ON_START": "true",  # with a replica id: only that id's sandboxes
}
"""Small pools; orphan reaping on, which a replica id scopes to its own predecessor's sandboxes."""


@dataclass
class ReplicaProcess:
    """One `coding-env serve` replica."""

    replica_id: str
    port: int
    log_path: Path
    process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the process on this replica's port and return once its start-up is complete."""
        self.wait_ready(self.launch())

    def launch(self) -> threading.Event:
        """Start the process on this replica's port; the event is set once its start-up is over."""
        sock = socket.create_server(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        env = {**os.environ, **REPLICA_ENV, "CODING_ENV_REPLICA_ID": self.replica_id, "PYTHONPATH": str(REPO_ROOT)}
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "env_server.cli", "serve", "--fd", str(sock.fileno())],
                pass_fds=[sock.fileno()],
                env=env,
                cwd=REPO_ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        finally:
            sock.close()  # the replica holds the only copy: killed, its port refuses connections
        ready = threading.Event()
        threading.Thread(target=self._read_log, args=(ready,), daemon=True).start()
        return ready

    def wait_ready(self, ready: threading.Event) -> None:
        """Return once `launch`'s event is set with the process running; raise if it never is."""
        assert self.process is not None
        if not ready.wait(START_TIMEOUT_S) or self.process.poll() is not None:
            self.stop()
            raise RuntimeError(f"replica {self.replica_id} did not start; its log: {self.log_path}")

    def _read_log(self, ready: threading.Event) -> None:
        assert self.process is not None and self.process.stderr is not None
        with self.log_path.open("a") as log:
            for line in self.process.stderr:
                log.write(line)
                log.flush()
                if READY_LINE in line:
                    ready.set()
        ready.set()  # the process ended: wake the waiter (it checks `poll()`)

    def kill(self) -> None:
        """SIGKILL: the replica dies as a crashed host would, leaving its sandboxes behind."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM: a graceful shutdown that closes every session and warm pool."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)


class Nginx:
    """nginx as the current user, with its own prefix, pid file, temp dirs and error log."""

    def __init__(self, directory: Path, replicas: list[ReplicaProcess]) -> None:
        self.directory = directory
        self.replicas = replicas
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start nginx on a listening socket bound here and handed over (nginx's `NGINX` variable of
        inherited sockets), so its port accepts connections before nginx runs and none is lost."""
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        (self.directory / "temp").mkdir(parents=True, exist_ok=True)
        config = render(
            [Replica(r.replica_id, f"127.0.0.1:{r.port}") for r in self.replicas],
            listen=f"127.0.0.1:{self.port}",
            pid_file=str(self.directory / "nginx.pid"),
            error_log=str(self.directory / "error.log"),
            temp_dir=str(self.directory / "temp"),
            worker_processes="1",
        )
        config_path = self.directory / "nginx.conf"
        config_path.write_text(config)
        command = ["nginx", "-p", str(self.directory), "-c", str(config_path)]
        try:
            checked = subprocess.run([*command, "-t"], capture_output=True, text=True)  # a bad config fails here, not as a hang
            if checked.returncode != 0:
                raise RuntimeError(f"nginx refused its configuration: {checked.stderr}")
            self.process = subprocess.Popen(
                [*command, "-g", "daemon off;"],
                env={**os.environ, "NGINX": f"{sock.fileno()};"},
                pass_fds=[sock.fileno()],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        finally:
            sock.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # graceful
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
