"""Run DAGs the way users and their CI do: `airflow dags test` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from harness.stack import airflow_bin

__all__ = ["airflow_bin", "dags_test", "tagged_json"]

TEST_DAGS = Path(__file__).resolve().parents[1] / "dags"


def dags_test(
    dag_id: str,
    *,
    conf: dict | None = None,
    logical_date: str | None = None,
    dags_folder: Path = TEST_DAGS,
    timeout: int = 600,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    cmd = [airflow_bin(), "dags", "test", dag_id]
    if logical_date:
        cmd.append(logical_date)
    if conf:
        cmd += ["--conf", json.dumps(conf)]
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder), **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def tagged_json(output: str, tag: str) -> list[dict]:
    """Objects that tasks printed as `<tag> {json}` lines (the task log may add its own suffix)."""
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(line.split(tag + " ", 1)[1])[0] for line in output.splitlines() if tag + " " in line]
