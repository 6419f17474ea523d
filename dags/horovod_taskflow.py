"""TaskFlow: a learning-rate sweep with ``@task.horovod``, the best model scored with ``@task.ray``.

Written as HorovodRunner users write training (``hr = HorovodRunner(np=2); hr.run(train,
learning_rate=0.1)``): ``@task.horovod(num_workers=2)`` on the function, called with its keyword
arguments. ``.expand()`` makes one training per learning rate of the ``learning_rates`` param (three
by default), one Ray job each, each in its own storage folder;
what rank 0 returns comes back as ``return_value`` in each one's XCom, next to the checkpoint URI
and the metrics; ``pick_best`` reads them and ``evaluate`` scores the winner where torch is, on the
cluster. Horovod's timeline is recorded (``horovod_timeline=True``) and stored beside each
training's checkpoints (``timeline_uri`` in XCom): open it in https://ui.perfetto.dev or
chrome://tracing.

Functions written in a DAG file travel pickled: Airflow and the Ray cluster need the same Python
minor version (an import path, as in ``horovod_quickstart.py``, works across versions). See
``docs/migrating.md``.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task


@dag(
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["horovod", "taskflow", "example"],
    params={
        "storage_path": Param(
            "",
            type="string",
            pattern=r"^(|/.*|file:///.*|s3://[^/\s]+(/.*)?)$",
            description_md="give an absolute path, file:///path or s3://bucket/prefix; "
            "empty: $AIRFLOW_HOME/horovod-storage",
        ),
        "learning_rates": Param(
            [0.02, 0.1, 0.3],
            type="array",
            items={"type": "number", "exclusiveMinimum": 0},
            minItems=1,
            description_md="the sweep: one training each",
        ),
    },
)
def horovod_taskflow():
    @task.horovod(num_workers=2, storage_path="{{ params.storage_path }}", horovod_timeline=True)
    def train(learning_rate: float, epochs: int = 4) -> dict:
        from airflow_provider_horovod.examples.runner_style import train

        return train(learning_rate=learning_rate, epochs=epochs)

    @task
    def learning_rates(params: dict | None = None) -> list[float]:
        return params["learning_rates"]

    trainings = train.partial(epochs=4).expand(learning_rate=learning_rates())

    @task
    def pick_best(results: list[dict]) -> dict:
        """The sweep's best training, by the loss its function returned."""
        best = min(results, key=lambda result: result["return_value"]["loss"])
        print(f"best: learning_rate {best['return_value']['learning_rate']}, loss {best['return_value']['loss']:.5f}")
        return best

    @task.ray(storage_path="{{ params.storage_path }}")
    def evaluate(best: dict) -> dict:
        from airflow_provider_horovod.examples.runner_style import evaluate

        return evaluate(best["checkpoint_uri"])

    evaluate(pick_best(trainings))


horovod_taskflow()
