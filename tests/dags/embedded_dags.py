"""A DAG for the embedded local cluster (no ray_default connection): one small Ray job."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from airflow_provider_horovod.operators.ray import RayTaskOperator


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def ahp_embedded():
    RayTaskOperator(task_id="where", python_callable="platform:python_version")


ahp_embedded()
