"""The DAG of the OpenLineage tests (tests/integration/test_lineage.py), run by `airflow dags test`
with the OpenLineage provider's listener on: a ``@task.ray`` job that writes the data (not
deferred), a small real training that reads it (deferred), and a ``@task.ray`` job that promotes the
model, the champion its outlet (deferred). The Ray jobs return the OpenLineage environment they saw.
This folder is the DAGs folder of those runs only."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Asset, dag, task

from airflow_provider_horovod.operators.base import BaseRayJobOperator
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator

# Read when the file is parsed, in the test's `airflow dags test` process.
STORAGE = os.environ.get("AHP_LINEAGE_STORAGE", "/tmp/ahp-lineage")
DATA = os.environ.get("AHP_LINEAGE_DATA", f"{STORAGE}/data")
CHAMPION = Asset(name="ahp_lineage_champion", uri=f"file://{STORAGE}/champion.json")
CONFIG = {"num_epochs": 1, "lr": 0.01, "batch_size": 64}
PARENT_ENV = ("OPENLINEAGE_PARENT_ID", "OPENLINEAGE_ROOT_PARENT_ID")
# The deferrable tasks defer after one second of following their job in the worker (15 s otherwise).
BaseRayJobOperator.sync_wait_before_defer_s = 1.0


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def ahp_lineage():
    @task.ray(storage_path=STORAGE, deferrable=False, poll_interval_seconds=0.5)
    def prepare() -> dict:
        from airflow_provider_horovod.examples.retraining import write_data

        return {**write_data(1, DATA), "env": {name: os.environ.get(name) for name in PARENT_ENV}}

    train = HorovodTrainOperator(
        task_id="train",
        train_fn="airflow_provider_horovod.examples.retraining:train_regressor",
        train_loop_config=CONFIG,
        datasets={"train": "{{ ti.xcom_pull(task_ids='prepare')['train'] }}"},
        num_workers=2,
        storage_path=STORAGE,
        poll_interval_seconds=0.5,
    )

    @task.ray(storage_path=STORAGE, outlets=[CHAMPION], poll_interval_seconds=0.5)
    def promote(result: dict) -> dict:
        import time

        time.sleep(3)  # past the second the worker follows the job: the task defers
        return {"champion": result["checkpoint_uri"], "env": {name: os.environ.get(name) for name in PARENT_ENV}}

    prepare() >> train
    promote(train.output)


ahp_lineage()
