"""A Horovod script run unchanged from a DAG: what ``horovodrun -np 2 python train_classifier.py --epochs 3
--date 2026-01-01 --checkpoint-dir ./checkpoints`` does, as a task, then its model scored on the cluster.

Every worker runs ``scripts/train_classifier.py`` as ``__main__`` with those arguments (``{{ ds }}``
rendered), from the job's copy of the script's folder, so its neighbour module ``classifier.py`` imports.
The files rank 0 leaves under ``$AHP_CHECKPOINT_DIR`` become the run's checkpoint, its URI in XCom; its
``METRICS ...`` lines, the run's metrics. More: ``docs/migrating.md``, "From horovodrun".

With no ``ray_default`` connection it trains on an embedded local Ray cluster. The DAG file imports no
torch, horovod or ray.train: that code runs on the cluster.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
STORAGE = "{{ params.storage_path }}"


@dag(
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["horovod", "example"],
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
def horovod_script():
    train = HorovodTrainOperator(
        task_id="train",
        train_script="scripts/train_classifier.py",
        script_args=["--epochs", "3", "--date", "{{ ds }}", "--checkpoint-dir", "$AHP_CHECKPOINT_DIR"],
        num_workers=2,
        storage_path=STORAGE,
    )
    # The evaluation imports the script's neighbour module, which travels with its job too.
    RayTaskOperator(
        task_id="evaluate",
        python_callable="classifier:evaluate",
        op_args=[train.output],
        runtime_env={"working_dir": SCRIPTS},
        storage_path=STORAGE,
    )


horovod_script()
