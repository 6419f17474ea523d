"""Airflow's command line as users and their CI run it (`airflow dags test` in a subprocess of this
environment's Airflow), and reading what tasks and jobs print: ``<tag> {json}`` lines."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from harness.stack import airflow_bin


def dags_test(
    dag_id: str,
    *,
    conf: dict | None = None,
    logical_date: str | None = None,
    dags_folder: Path | str | None = None,
    timeout: float = 600,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """`airflow dags test DAG_ID [DATE] [--conf JSON]`; ``dags_folder`` None: the environment's."""
    cmd = [airflow_bin(), "dags", "test", dag_id]
    if logical_date:
        cmd.append(logical_date)
    if conf:
        cmd += ["--conf", json.dumps(conf)]
    env = {**os.environ, **({"AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder)} if dags_folder else {}), **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def tagged_json(output: str, tag: str) -> list[dict]:
    """The objects printed as ``<tag> {json}`` lines, in order: the tag anywhere in the line (a task log
    puts its own prefix before it), ``<tag>:<token>`` too (the runtime's marked lines), anything after
    the object ignored (a log's suffix)."""
    pattern = re.compile(re.escape(tag) + r"(?::[0-9a-f]+)? ")
    decoder = json.JSONDecoder()
    return [
        decoder.raw_decode(line[found.end() :])[0] for line in output.splitlines() if (found := pattern.search(line))
    ]
