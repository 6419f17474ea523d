"""Training that runs for hours: submit, let go of the worker slot, wait in the triggerer.

``train`` submits the Horovod job with ``wait_for_completion=False`` and returns at once, pushing
the job's ``submission_id``. ``wait_for_training`` is a deferrable ``RayJobSensor``: it waits in
the triggerer, holding no worker slot, fails when the job fails, and returns the same result as
the operator, with the verified ``checkpoint_uri``. ``evaluate`` then scores that checkpoint on the
cluster.

The same sensor can wait for a training job that something else started: give it the job's
submission id. With no ``ray_default`` connection the job runs on the embedded local Ray cluster;
the ``storage_path`` param (empty: ``$AIRFLOW_HOME/horovod-storage``) can point at ``s3://``.

This file imports no torch, horovod or ray.train: the scheduler parses it often.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator
from airflow_provider_horovod.sensors.ray import RayJobSensor


@dag(
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["horovod", "sensor", "example"],
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
def horovod_sensor_example():
    train = HorovodTrainOperator(
        task_id="train",
        train_fn="airflow_provider_horovod.examples.quickstart:train_func",
        train_loop_config={"num_epochs": 8, "lr": 0.1, "batch_size": 16},
        datasets={"train": "airflow_provider_horovod.examples.quickstart:make_dataset"},
        num_workers=2,
        storage_path="{{ params.storage_path }}",
        wait_for_completion=False,
    )

    wait_for_training = RayJobSensor(
        task_id="wait_for_training",
        submission_id="{{ ti.xcom_pull(task_ids='train', key='submission_id') }}",
        deferrable=True,
        poke_interval=5,
        timeout=12 * 3600,
    )

    # Scored where the model fits: a Ray job on the cluster.
    evaluate = RayTaskOperator(
        task_id="evaluate",
        python_callable="airflow_provider_horovod.examples.quickstart:evaluate",
        op_args=[wait_for_training.output],
        storage_path="{{ params.storage_path }}",
    )

    train >> wait_for_training >> evaluate


horovod_sensor_example()
