"""What mypy, and a user's editor, make of calls to the provider's operators, checked by ``make lint``:
the declared parameters are typed, and BaseOperator's own arguments (task_id, retries, pool, ...) pass.
A bad call that stopped being refused would leave its ``type: ignore`` unused, which the lint refuses
(``warn_unused_ignores``)."""

from __future__ import annotations

from datetime import timedelta

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator

HorovodTrainOperator(
    task_id="train",
    train_fn="my_project.training:train_func",
    num_workers=(2, 4),
    use_gpu=True,
    storage_path="s3://bucket/checkpoints",
    retries=3,
    pool="gpu",
    execution_timeout=timedelta(hours=2),
)
RayTaskOperator(task_id="evaluate", python_callable="my_project.evaluation:score", num_gpus=1, queue="gpu")

HorovodTrainOperator(task_id="train", train_fn="m:f", use_gpu="yes")  # type: ignore[arg-type]
HorovodTrainOperator(task_id="train", train_fn="m:f", max_failures="1")  # type: ignore[arg-type]
RayTaskOperator(task_id="evaluate", python_callable="m:f", num_cpus="2")  # type: ignore[arg-type]
