"""A ``@task.ray`` job that ends within a second or two: on the real stack it must finish in the worker
without a deferral (whose resume Airflow 3.3.2 can lose, apache/airflow#67287), run after run."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, max_active_runs=3)
def ahp_stack_short():
    @task.ray(task_id="short", poll_interval_seconds=1)
    def short(n: int) -> int:
        return n * 2

    short(21)


ahp_stack_short()
