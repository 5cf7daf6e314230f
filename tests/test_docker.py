"""docker/ must stay correct even though no Docker engine runs here: the Compose CLI checks the file
(no engine needed for `config`) and the Dockerfile only copies what exists."""

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def compose_command():
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"]


def test_it_passes_compose_config():
    command = [*compose_command(), "-f", str(ROOT / "docker" / "compose.yaml"), "config", "--quiet"]
    result = subprocess.run(
        command, capture_output=True, text=True, env={"SECRET_KEY": "x" * 50, "PATH": "/usr/bin:/bin"}
    )
    assert result.returncode == 0, result.stderr


def test_it_runs_the_production_stack_roles():
    services = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    assert {"postgres", "redis", "web", "worker", "beat"} <= set(services)
    assert "broker.asgi:application" in services["web"]["command"]
    assert services["worker"]["command"][:3] == ["celery", "-A", "broker"]
    assert "beat" in services["beat"]["command"]


def test_it_copies_only_paths_that_exist():
    for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            source = line.split()[1]
            assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
