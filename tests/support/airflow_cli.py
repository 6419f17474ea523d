"""Run DAGs the way users and their CI do: `airflow dags test` in a subprocess, or ``dag.test()`` in this
process (docs/ci.md's pytest example) where the command line is not what a test checks: each
`airflow dags test` starts Airflow anew. The runner and ``tagged_json`` are the harness's
(``harness/airflow_cli.py``), shared with the benchmarks."""

from __future__ import annotations

from pathlib import Path

from harness import airflow_cli
from harness.airflow_cli import tagged_json
from harness.stack import airflow_bin

__all__ = ["TEST_DAGS", "airflow_bin", "dag_test", "dags_test", "tagged_json", "xcom_values"]

TEST_DAGS = Path(__file__).resolve().parents[1] / "dags"


def dags_test(
    dag_id: str,
    *,
    conf: dict | None = None,
    logical_date: str | None = None,
    dags_folder: Path = TEST_DAGS,
    timeout: int = 600,
    env: dict | None = None,
):
    """`airflow dags test` of a DAG of tests/dags (or of ``dags_folder``)."""
    return airflow_cli.dags_test(
        dag_id, conf=conf, logical_date=logical_date, dags_folder=dags_folder, timeout=timeout, env=env
    )


def dag_test(dag_id: str, dag_file: Path, *, conf: dict | None = None, logical_date: str | None = None):
    """``dag.test()`` of the DAG ``dag_id`` of ``dag_file``, parsed now (so the environment the test set is
    the one the file reads), in this process; its tasks' output goes to this process's stdout (read it
    with pytest's ``capfd``). Returns the DagRun."""
    import pendulum
    from airflow import settings
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dag_file))
    assert not bag.import_errors, bag.import_errors
    # As `airflow dags test`: the date given, else now.
    when = pendulum.parse(logical_date, tz="UTC") if logical_date else pendulum.now("UTC")
    # dag.test() writes the DAGs of the DAGs folder's bundle to the database and runs the one it finds
    # there: the folder of the file, as `airflow dags test` with AIRFLOW__CORE__DAGS_FOLDER set to it.
    folder, settings.DAGS_FOLDER = settings.DAGS_FOLDER, str(dag_file.parent)
    try:
        return bag.dags[dag_id].test(logical_date=when, run_conf=conf)
    finally:
        settings.DAGS_FOLDER = folder


def xcom_values(dag_id: str, task_id: str, run_id: str | None = None) -> dict:
    """The XComs a task left in Airflow's database (of its latest run, or of ``run_id``)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = session.query(XComModel.key, XComModel.value, XComModel.run_id).filter(
            XComModel.dag_id == dag_id, XComModel.task_id == task_id
        )
        rows = query.all()
    if run_id is None and rows:
        run_id = sorted({r[2] for r in rows})[-1]
    return {key: value for key, value, run in rows if run == run_id}
