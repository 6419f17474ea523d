"""The workload of `make chaos` (chaos/run.py), sized for a 2-core machine that also runs Airflow,
PostgreSQL, two Ray nodes and S3:

- ``chaos_retraining``: daily retraining as ``dags/horovod_retraining.py`` does it (the example's own model
  code): data (``@task.ray``), the champion as of the day, train (deferred), evaluate (``@task.ray``),
  promote into the champion's log of moves with compare-and-swap on S3. Triggered day after day, and
  backfilled.
- ``chaos_sweep``: a mapped ``@task.horovod`` sweep, *not* deferred (the worker follows the job), then
  the best scored with ``@task.ray``.
- ``chaos_elastic``: an elastic training, ``num_workers=(2, 4)`` of one CPU each across the two hosts,
  deferred.

Trainings are retried (each retry resumes from the last checkpoint) and share one Airflow pool (the
spread deployment gives the elastic ones a pool of their own), so the cluster is kept busy without
drowning the machine. Storage is S3 (``CHAOS_STORAGE``), read by Airflow
through the ``aws_default`` connection; the Ray cluster is ``ray_default``.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import dag, task

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator

STORAGE = os.environ.get("CHAOS_STORAGE", "s3://chaos/runs")
ROOT = f"{STORAGE.rstrip('/')}/chaos_retraining"
CHAMPION = f"{ROOT}/champion.json"
POOL = "chaos_training"
# The spread deployment gives the elastic trainings (2 slots each) a pool of their own.
ELASTIC_POOL = os.environ.get("CHAOS_ELASTIC_POOL", POOL)
AWS = "aws_default"
DAY = "{{ (dag_run.logical_date or dag_run.run_after) | ds }}"
# Each training task: retried after a lost worker, host, head or task process, resuming from its last
# checkpoint; a run that cannot finish in this long is failed by Airflow (none may hang).
TRAINING = {
    "pool": POOL,
    "retries": 4,
    "retry_delay": timedelta(seconds=10),
    "execution_timeout": timedelta(minutes=12),
    "storage_path": STORAGE,
    "aws_conn_id": AWS,
    "pending_timeout_seconds": 600,
    "stall_timeout_seconds": 240,
}
RAY_TASK = {
    "storage_path": STORAGE,
    "aws_conn_id": AWS,
    "retries": 4,
    "retry_delay": timedelta(seconds=10),
    "execution_timeout": timedelta(minutes=10),
}
START = pendulum.datetime(2026, 11, 1, tz="UTC")


@dag(
    schedule="@daily",
    start_date=START,
    catchup=False,
    max_active_runs=2,
    dagrun_timeout=timedelta(minutes=25),
    tags=["chaos"],
)
def chaos_retraining():
    @task.ray(**RAY_TASK)
    def prepare_data(day: str) -> dict:
        from datetime import date

        from airflow_provider_horovod.examples.retraining import write_data

        seed = (date.fromisoformat(day) - date(1970, 1, 1)).days
        return write_data(seed, f"{ROOT}/data/{day.replace('-', '')}")

    @task(retries=4, retry_delay=timedelta(seconds=10))
    def champion_checkpoint(day: str) -> str:
        from airflow_provider_horovod.examples.retraining import champion_as_of
        from airflow_provider_horovod.storage import Storage

        champion = champion_as_of(Storage(AWS).read_json(CHAMPION), day)
        return champion["checkpoint_uri"] if champion else ""

    data = prepare_data(DAY)
    warm_start = champion_checkpoint(DAY)
    train = HorovodTrainOperator(
        task_id="train",
        train_fn="airflow_provider_horovod.examples.retraining:train_regressor",
        train_loop_config={"num_epochs": 12, "lr": 0.01, "batch_size": 32, "init_checkpoint": warm_start},
        datasets={"train": "{{ ti.xcom_pull(task_ids='prepare_data')['train'] }}"},
        num_workers=2,
        max_failures=0,  # a lost worker fails the attempt: the task's retry resumes it
        checkpoint_num_to_keep=3,
        max_active_tis_per_dag=1,
        **TRAINING,
    )
    data >> train

    @task.ray(**RAY_TASK)
    def evaluate(result: dict, data: dict) -> dict:
        from airflow_provider_horovod.examples.retraining import evaluate as score

        scores = score(result["checkpoint_uri"], data["holdout"])
        return {"checkpoint_uri": result["checkpoint_uri"], **scores, "submission_id": result["submission_id"]}

    @task(retries=4, retry_delay=timedelta(seconds=10))
    def promote(evaluation: dict, day: str, run_id=None) -> dict:
        from airflow_provider_horovod.examples.retraining import with_move
        from airflow_provider_horovod.storage import Storage

        candidate = {**evaluation, "logical_date": day, "run_id": run_id}
        _, after = Storage(AWS).swap_json(CHAMPION, lambda record: with_move(record, candidate))
        return {**candidate, "promoted": after is not None}

    promote(evaluate(train.output, data), DAY)


def paced_training(learning_rate: float, steps: int = 24, step_s: float = 1.0) -> dict:
    """A small regression, one allreduce'd step a ``step_s`` apart and a report with rank 0's checkpoint
    every step, resumed from the last checkpoint. Returns the loss and where it resumed."""
    import json
    import os
    import tempfile
    import time

    import horovod.torch as hvd
    import ray.train
    import torch
    from ray.train import Checkpoint

    hvd.init()
    torch.manual_seed(0)
    model, step = torch.nn.Linear(1, 1), 0
    if checkpoint := ray.train.get_checkpoint():
        with checkpoint.as_directory() as folder:
            model.load_state_dict(torch.load(os.path.join(folder, "model.pt")))
            with open(os.path.join(folder, "state.json")) as f:
                step = json.load(f)["step"]
    resumed_at = step
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=learning_rate), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(hvd.rank())
    loss = torch.tensor(0.0)
    while step < steps:
        x = torch.rand(64, 1, generator=generator)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), 3 * x - 1)
        loss.backward()
        optimizer.step()
        loss = hvd.allreduce(loss.detach(), name=f"loss{step}")
        step += 1
        time.sleep(step_s)
        metrics = {"step": step, "loss": float(loss), "size": hvd.size()}
        if hvd.rank() == 0:
            with tempfile.TemporaryDirectory() as folder:
                torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
                with open(os.path.join(folder, "state.json"), "w") as f:
                    json.dump({"step": step}, f)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)
    return {"learning_rate": learning_rate, "loss": float(loss), "resumed_at": resumed_at, "size": hvd.size()}


@dag(schedule=None, start_date=START, catchup=False, dagrun_timeout=timedelta(minutes=25), tags=["chaos"])
def chaos_sweep():
    @task.horovod(num_workers=2, max_failures=1, deferrable=False, **TRAINING)
    def train(learning_rate: float) -> dict:
        return paced_training(learning_rate, steps=20)

    trainings = train.expand(learning_rate=[0.05, 0.1, 0.2])

    # Retried as the DAGs' other plain tasks are: Airflow's executor fails a task it cannot send to the broker.
    @task(retries=4, retry_delay=timedelta(seconds=10))
    def pick_best(results: list[dict]) -> dict:
        return min(results, key=lambda result: result["return_value"]["loss"])

    @task.ray(**RAY_TASK)
    def evaluate(best: dict) -> dict:
        from airflow_provider_horovod.examples.runner_style import evaluate

        return evaluate(best["checkpoint_uri"])

    evaluate(pick_best(trainings))


def elastic_training(config: dict) -> dict:
    """``paced_training`` written for Ray's HorovodTrainer (one ``config``)."""
    return paced_training(config["learning_rate"], steps=config["steps"], step_s=config["step_s"])


@dag(schedule=None, start_date=START, catchup=False, dagrun_timeout=timedelta(minutes=25), tags=["chaos"])
def chaos_elastic():
    HorovodTrainOperator(
        task_id="train",
        train_fn=elastic_training,
        train_loop_config={"learning_rate": 0.1, "steps": 40, "step_s": 1.0},
        num_workers=(2, 4),
        elastic_resize_monitor_interval_s=10,
        max_failures=3,
        pool_slots=2,
        **{**TRAINING, "pool": ELASTIC_POOL},
    )


chaos_retraining()
chaos_sweep()
chaos_elastic()
