"""Fixtures of the real-stack tests: one Airflow deployment (api-server, scheduler, dag-processor and
triggerer as separate processes) for the whole session, shared by every file that drives it, since
starting one costs about a minute on 2 cores."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MIGRATED_DB, free_port
from support.stack import Stack

REPO = Path(__file__).resolve().parents[2]
# The DAGs of tests/dags_stack the tests trigger: each is parsed and unpaused before any test runs.
STACK_DAGS = (
    "ahp_stack_training",
    "ahp_stack_quick",
    "ahp_stack_short",
    "ahp_stack_slot",
    "ahp_stack_view_training",
    "ahp_stack_view_history",
    "horovod_retraining",
)


@pytest.fixture(scope="session")
def stack(airflow_db, ray_cluster, tmp_path_factory):
    running = Stack(tmp_path_factory.mktemp("stack"), REPO / "tests" / "dags_stack", free_port())
    try:
        running.start(migrated_db=MIGRATED_DB)
        for dag_id in STACK_DAGS:
            running.wait_for_dag(dag_id)
        yield running
    finally:
        running.stop()
