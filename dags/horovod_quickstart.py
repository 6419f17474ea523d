"""The smallest training DAG: Ray's Horovod quickstart, trained by 2 workers, evaluated on the cluster.

With no ``ray_default`` connection, the operator starts an embedded local Ray cluster, and
checkpoints go under ``$AIRFLOW_HOME/horovod-storage``. Point it at a real cluster with the
``ray_default`` connection and at a bucket with the ``storage_path`` param (``s3://bucket/prefix``).

Every function here is named by its import path, so it runs on the cluster whatever Python the
Airflow side has. The DAG file imports no torch, horovod or ray.train: the code runs on the cluster.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator

STORAGE = "{{ params.storage_path }}"


@dag(
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["horovod", "example"],
    # The pattern refuses a bad path when the run is triggered, before any task starts.
    params={"storage_path": Param("", type="string", pattern=r"^(|/.*|file:///.*|s3://[^/\s]+(/.*)?)$",
                                  description_md="give an absolute path, file:///path or s3://bucket/prefix; "
                                              "empty: $AIRFLOW_HOME/horovod-storage")},
)
def horovod_quickstart():
    train = HorovodTrainOperator(
        task_id="train",
        train_fn="airflow_provider_horovod.examples.quickstart:train_func",
        train_loop_config={"num_epochs": 5, "lr": 0.1, "batch_size": 16},
        datasets={"train": "airflow_provider_horovod.examples.quickstart:make_dataset"},
        num_workers=2,
        storage_path=STORAGE,
    )
    # The model is loaded where torch is: a Ray job, its scores back in XCom.
    RayTaskOperator(
        task_id="evaluate",
        python_callable="airflow_provider_horovod.examples.quickstart:evaluate",
        op_args=[train.output],
        storage_path=STORAGE,
    )


horovod_quickstart()
