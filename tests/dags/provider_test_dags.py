"""DAGs the integration tests run through `airflow dags test` (storage comes from dag_run.conf)."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator

QUICKSTART = "airflow_provider_horovod.examples.quickstart:train_func"
CONFIG = {"num_epochs": 5, "lr": 0.1, "batch_size": 8}
STORAGE = "{{ dag_run.conf.get('storage_path', '') }}"


def train_dataset():
    from airflow_provider_horovod.examples.quickstart import make_dataset

    return make_dataset(n=256)


@task.ray(storage_path=STORAGE)
def evaluate(result: dict) -> dict:
    """What a user's evaluation task does, on the cluster: load the model from the checkpoint, score it."""
    import json

    from airflow_provider_horovod.examples.quickstart import evaluate as score

    mse = score(result)["holdout_mse"]
    print("AHP_EVAL " + json.dumps({"result": result, "mse": mse}, default=str), flush=True)
    return {"mse": mse}


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def ahp_train_deferred():
    train = HorovodTrainOperator(
        task_id="train",
        train_fn=QUICKSTART,
        train_loop_config=CONFIG,
        datasets={"train": train_dataset},
        num_workers=2,
        storage_path=STORAGE,
        deferrable=True,
        poll_interval_seconds=0.5,
    )
    evaluate(train.output)


ahp_train_deferred()
