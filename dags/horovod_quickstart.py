"""The smallest training DAG: Ray's Horovod quickstart as a ``@task.horovod`` task, 2 workers, and
its model scored on the cluster with ``@task.ray``.

``train_func`` is Ray's quickstart function (``airflow_provider_horovod/examples/quickstart.py``),
unchanged from what ``HorovodTrainer`` takes: ``train_func({...})`` hands the config to every worker,
as ``train_loop_config`` did. Both functions come from an installed package, so they travel by import
path, whatever Python the Airflow side has (a function written in the DAG file travels pickled and
needs the cluster's Python; see ``horovod_taskflow.py``). More: ``docs/migrating.md``.

With no ``ray_default`` connection, it trains on an embedded local Ray cluster, checkpoints under
``$AIRFLOW_HOME/horovod-storage``. Point it at a real cluster with the ``ray_default`` connection and
at a bucket with the ``storage_path`` param (``s3://bucket/prefix``). The DAG file imports no torch,
horovod or ray.train: that code runs on the cluster.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from airflow_provider_horovod.examples.quickstart import evaluate, train_func

STORAGE = "{{ params.storage_path }}"


@dag(
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["horovod", "example"],
    # The pattern refuses a bad path when the run is triggered, before any task starts.
    params={
        "storage_path": Param(
            "",
            type="string",
            pattern=r"^(|/.*|file:///.*|s3://[^/\s]+(/.*)?)$",
            description_md="give an absolute path, file:///path or s3://bucket/prefix; "
            "empty: $AIRFLOW_HOME/horovod-storage",
        )
    },
)
def horovod_quickstart():
    train = task.horovod(
        task_id="train",
        num_workers=2,
        datasets={"train": "airflow_provider_horovod.examples.quickstart:make_dataset"},
        storage_path=STORAGE,
    )(train_func)
    result = train({"num_epochs": 5, "lr": 0.1, "batch_size": 16})
    # The model is loaded where torch is: a Ray job, its scores back in XCom.
    task.ray(task_id="evaluate", storage_path=STORAGE)(evaluate)(result)


horovod_quickstart()
