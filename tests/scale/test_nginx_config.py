"""The nginx configuration: what deploy/nginx/render.py renders is accepted by nginx, refuses bad
replica lists, and the shipped deploy/nginx/nginx.conf is exactly its rendering for the compose replicas."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deploy.nginx.render import Replica, main, render

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_REPLICAS = ["r1=replica-1:8000", "r2=replica-2:8000", "r3=replica-3:8000"]


def test_nginx_accepts_the_rendered_configuration(tmp_path: Path) -> None:
    replicas = [Replica("a", "127.0.0.1:1"), Replica("b-2", "127.0.0.1:2")]
    config = tmp_path / "nginx.conf"
    config.write_text(render(replicas, listen="127.0.0.1:1", pid_file=str(tmp_path / "pid"), error_log=str(tmp_path / "err"), temp_dir=str(tmp_path)))
    checked = subprocess.run(["nginx", "-t", "-p", str(tmp_path), "-c", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_the_shipped_configuration_is_the_rendering_for_the_compose_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*(arg for r in COMPOSE_REPLICAS for arg in ("--replica", r))]) == 0
    assert capsys.readouterr().out == (REPO_ROOT / "deploy/nginx/nginx.conf").read_text()


@pytest.mark.parametrize(
    "replicas, problem",
    [
        (["r1=a:1", "r1=b:2"], "unique"),
        (["r.1=a:1"], "letters, digits or dashes"),
        (["r1"], "ID=HOST:PORT"),
    ],
)
def test_a_bad_replica_list_is_refused_with_its_reason(replicas: list[str], problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*(arg for r in replicas for arg in ("--replica", r))]) == 2
    assert problem in capsys.readouterr().err
