"""A DAG of the script tests (``tests/integration/test_scripts.py``): ``@task.horovod_script`` returning a
``horovodrun`` command line, its script leaving no checkpoint."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

STORAGE = "{{ dag_run.conf.get('storage_path', '') }}"


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def ahp_script_command():
    @task.horovod_script(storage_path=STORAGE, deferrable=False)
    def report_world(ds=None):
        return f"horovodrun -np 2 --gloo-timeout-seconds 60 python scripts/report_world.py --date {ds}"

    report_world()


ahp_script_command()
