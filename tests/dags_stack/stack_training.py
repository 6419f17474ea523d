"""The DAG the real-stack tests trigger through the REST API: a small real training, deferred into
the real triggerer by default (nothing here asks for it, and Airflow's configuration is its own)."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from airflow_provider_horovod.examples.runner_style import train


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def ahp_stack_training():
    task.horovod(task_id="train", num_workers=2, poll_interval_seconds=1)(train)(
        learning_rate=0.1, epochs=8, samples=4096
    )


ahp_stack_training()
