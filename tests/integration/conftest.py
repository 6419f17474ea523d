"""Fixtures of the real-stack tests: one Airflow deployment (api-server, scheduler, dag-processor and
triggerer as separate processes, LocalExecutor, PostgreSQL) for the whole session, shared by every
file that drives it, since starting one costs about a minute on 2 cores."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TEST_HOME

from harness.ports import free_port
from harness.postgres import Postgres, unavailable_reason
from harness.stack import Stack

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
def postgres():
    """A PostgreSQL server of the session's own (Debian's, on 127.0.0.1), as deployments keep Airflow's
    metadata in."""
    why = unavailable_reason()
    if why:
        pytest.fail(f"the real-stack tests run Airflow on PostgreSQL: {why}")
    server = Postgres(TEST_HOME / "postgres")
    server.start()
    yield server
    server.remove()


@pytest.fixture(scope="session")
def stack(ray_cluster, postgres, tmp_path_factory):
    running = Stack(
        tmp_path_factory.mktemp("stack"),
        REPO / "tests" / "dags_stack",
        free_port(),
        database_url=postgres.create_database("stack"),
        # The tests' trainings last well under a minute; several are about what happens once deferred.
        env={"AIRFLOW__HOROVOD__DEFER_AFTER_SECONDS": "15"},
    )
    try:
        running.start()
        for dag_id in STACK_DAGS:
            running.wait_for_dag(dag_id)
        yield running
    finally:
        running.stop()
