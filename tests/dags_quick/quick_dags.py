"""DAGs for tests of Airflow-side behaviour through `airflow dags test` (re-attach after a crash,
clearing a task): their training task is the real operator, its job the quick stand-in that writes
a real checkpoint and result record without training (``tests/support/quick.py``). This folder is
the DAGs folder of those runs only."""

from __future__ import annotations

import sys
from pathlib import Path

import pendulum
from airflow.sdk import dag, task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.quick import use_quick_jobs  # noqa: E402

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator  # noqa: E402

use_quick_jobs()


@dag(schedule="@daily", start_date=pendulum.datetime(2026, 11, 1, tz="UTC"), catchup=False)
def ahp_quick_retraining():
    train = HorovodTrainOperator(
        task_id="train",
        train_fn="airflow_provider_horovod.examples.quickstart:train_func",
        num_workers=2,
        storage_path="{{ dag_run.conf.get('storage_path', '') }}",
        poll_interval_seconds=0.5,
        train_loop_config={"quick_lines": 20, "quick_line_s": 0.5, "run": "{{ run_id }}"},
    )

    @task
    def report(result: dict) -> None:
        print("AHP_TRAINED " + __import__("json").dumps(result))

    report(train.output)


ahp_quick_retraining()
