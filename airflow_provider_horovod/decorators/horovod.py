"""``@task.horovod``: the decorated function is the training function every Horovod worker runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator


class _HorovodDecoratedOperator(DecoratedOperator, HorovodTrainOperator):
    """``HorovodTrainOperator`` whose training function and its arguments come from a TaskFlow call."""

    custom_operator_name = "@task.horovod"
    template_fields = (*HorovodTrainOperator.template_fields, "op_args", "op_kwargs")
    template_fields_renderers = HorovodTrainOperator.template_fields_renderers

    def __init__(self, *, python_callable: Callable, op_args: Any = None, op_kwargs: Any = None, **kwargs) -> None:
        super().__init__(
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            kwargs_to_upstream={"train_fn": python_callable},
            **kwargs,
        )

    def train_call(self) -> tuple[Any, Any]:
        return self.op_args, self.op_kwargs


def horovod_task(python_callable: Callable | None = None, multiple_outputs: bool | None = None, **kwargs):
    """Train with Horovod on Ray: ``@task.horovod(num_workers=4, use_gpu=True) def train(config): ...``.

    Takes ``HorovodTrainOperator``'s parameters but ``train_fn`` (README, "Parameters"; its template
    fields are the operator's, and the call's arguments). Every worker calls
    the function with the arguments of the call in the DAG (literals, templates, XComArgs), as JSON values:
    ``train({"lr": 0.1})`` for a function written for Ray's ``HorovodTrainer`` (``def train(config)``), or
    ``train(lr=0.1, epochs=5)`` as with HorovodRunner's ``hr.run(train, lr=0.1, epochs=5)``. The task's XCom is the
    operator's result dict, with what the function returned on rank 0 as ``return_value``.
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_HorovodDecoratedOperator,
        **kwargs,
    )
