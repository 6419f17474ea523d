"""The smallest HorovodTrainOperator DAG: Ray's Horovod quickstart, trained by 2 workers.

With no ``ray_default`` connection, the operator starts an embedded local Ray cluster, and
checkpoints go under ``$AIRFLOW_HOME/horovod-storage``. Point it at a real cluster with the
``ray_default`` connection and at a bucket with ``storage_path="s3://bucket/prefix"``.

The DAG file imports no torch, horovod or ray.train: the training code runs on the cluster.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator


def train_dataset():
    """Runs on the cluster: a small regression problem for the quickstart."""
    from airflow_provider_horovod.examples.quickstart import make_dataset

    return make_dataset(n=256)


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
        datasets={"train": train_dataset},
        num_workers=2,
        storage_path="{{ params.storage_path }}",
    )

    @task
    def evaluate(checkpoint_uri: str) -> float:
        """Load the trained model from its checkpoint (local path or S3) and score it."""
        import tempfile

        from airflow_provider_horovod.examples.quickstart import holdout_mse
        from airflow_provider_horovod.storage import Storage

        with tempfile.TemporaryDirectory() as tmp:
            mse = holdout_mse(Storage().download_folder(checkpoint_uri, tmp))
        print(f"checkpoint: {checkpoint_uri}\nholdout MSE: {mse:.4f}")
        return mse

    evaluate(train.output["checkpoint_uri"])


horovod_quickstart()
