"""The files of docker/ and how Docker reads a Dockerfile, for the tests of the images and the compose file."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
AIRFLOW_DOCKERFILE = DOCKER / "airflow.Dockerfile"
RAY_DOCKERFILE = DOCKER / "ray.Dockerfile"
BIN = Path(sys.executable).parent


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each instruction, comment lines dropped and continued lines joined,
    as Docker reads them."""
    out, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if line.strip().startswith("#"):
            continue
        current = f"{current} {line.strip()}".strip()
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        if current:
            keyword, _, arguments = current.partition(" ")
            out.append((keyword.upper(), arguments.strip()))
        current = ""
    assert not current, f"{dockerfile.name} ends inside a continued line"
    return out


def tool(name: str) -> str:
    """A test tool from the venv (next to this python), else from PATH."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return str(found)
