"""The compose file and the stack's versions (scripts/versions.env), read once per module."""

from __future__ import annotations

import pytest
import yaml

from unit.docker.files import DOCKER, ROOT


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def versions() -> dict[str, str]:
    """scripts/versions.env, the stack's versions (KEY=VALUE lines, # comments)."""
    out = {}
    for line in (ROOT / "scripts" / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"versions.env: {line!r} is not KEY=VALUE"
            out[key.strip()] = value.strip().strip("\"'")
    assert {"AIRFLOW", "RAY", "TORCH", "HOROVOD", "PYTHON_CLUSTER", "PYTHON_AIRFLOW"} <= set(out)
    return out
