"""Smoke runs (docs/ci.md): the example retraining DAG configured as production would be (8 GPU workers of
8 CPUs, 1000 epochs, a dataset bigger than the check reads) passes under ``AIRFLOW__HOROVOD__SMOKE_RUN=True``
on the test cluster, which has no GPU, driven by the pytest example of docs/ci.md itself (``dag.test()``);
its checkpoint is real, its XCom says ``smoke_run``, and no champion is promoted. A planted bug fails the
same smoke run through ``airflow dags test`` with its own message. One training in all."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.airflow_cli import dags_test

from harness.example_dag import PRODUCTION, edited_copy
from integration.test_dags import DAG_ID, champion_events, xcom_values

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SMOKE_ROWS = 40  # of the 512 rows the DAG's data task writes


def ci_pytest_example() -> str:
    """The pytest example of docs/ci.md, as users copy it."""
    page = (REPO / "docs" / "ci.md").read_text()
    section = page.split("## A pytest example", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def smoke_env(tmp_path, airflow_db, ray_cluster):
    storage = tmp_path / "storage"
    return storage, {
        "AIRFLOW__HOROVOD__SMOKE_RUN": "True",
        "AIRFLOW__HOROVOD__SMOKE_ROWS": str(SMOKE_ROWS),
        "HOROVOD_RETRAINING_STORAGE": str(storage),
    }


def test_a_production_retraining_dag_passes_its_smoke_run_without_promoting(smoke_env, tmp_path):
    storage, env = smoke_env
    dags = edited_copy(tmp_path / "dags", PRODUCTION)
    ci = tmp_path / "ci"
    ci.mkdir()
    (ci / "test_dags_smoke.py").write_text(ci_pytest_example())
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", "--rootdir", str(ci), str(ci)],
        cwd=ci,
        env={**os.environ, **env, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-8000:]
    assert "2 passed" in output, output[-3000:]
    # Scaled down and said so; the first rows only.
    assert 'Smoke run: 8 GPU worker(s) of {"CPU": 8.0, "GPU": 1.0} -> 2 CPU worker(s)' in output, output[-8000:]
    assert f"first {SMOKE_ROWS} rows of each dataset ['train']" in output

    result = xcom_values(DAG_ID, "train")["return_value"]
    assert result["smoke_run"] is True
    assert result["world_size"] == 2
    # Stopped after the first epoch's checkpoint, of 1000.
    assert result["metrics"]["epoch"] == 0
    assert [p["report"] for p in xcom_history(result)] == [1]
    checkpoint = Path(result["checkpoint_uri"])
    assert checkpoint.is_relative_to(storage)
    assert (checkpoint / "model.pt").stat().st_size > 0
    # The evaluation loaded that checkpoint; the promotion refused it: no champion, no Asset event.
    evaluation = xcom_values(DAG_ID, "evaluate")["return_value"]
    assert evaluation["checkpoint_uri"] == result["checkpoint_uri"]
    assert evaluation["smoke_run"] is True
    assert evaluation["holdout_mse"] > 0
    summary = xcom_values(DAG_ID, "promote")["return_value"]
    assert summary["promoted"] is False
    assert summary["current"] is False
    assert not (storage / DAG_ID / "champion.json").exists()
    assert champion_events(storage) == []


def xcom_history(result: dict) -> list[dict]:
    """Rank 0's reports, as the attempt's history file keeps them."""
    import json

    return json.loads((Path(result["run_uri"]) / "metrics_history.json").read_text())


def test_a_planted_template_bug_fails_the_smoke_run_naming_it(smoke_env, tmp_path):
    _, env = smoke_env
    dags = edited_copy(tmp_path / "dags", {"['train'] }}": "['trian'] }}"})
    run = dags_test(DAG_ID, logical_date="2026-11-02", dags_folder=dags, env=env)
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-3000:]
    assert "'dict object' has no attribute 'trian'" in output, output[-6000:]
