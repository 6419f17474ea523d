"""``@task.ray``: the decorated function runs as one Ray job on the cluster; what it returns (JSON)
is the task's XCom, as for any TaskFlow task."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from airflow_provider_horovod.operators.ray import RayTaskOperator


class _RayDecoratedOperator(DecoratedOperator, RayTaskOperator):
    """``RayTaskOperator`` whose function and arguments come from a TaskFlow call."""

    custom_operator_name = "@task.ray"
    template_fields = RayTaskOperator.template_fields
    template_fields_renderers = RayTaskOperator.template_fields_renderers

    def __init__(self, *, python_callable: Callable, op_args: Any = None, op_kwargs: Any = None, **kwargs) -> None:
        super().__init__(
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            kwargs_to_upstream={"python_callable": python_callable, "op_args": op_args, "op_kwargs": op_kwargs},
            **kwargs,
        )


def ray_task(python_callable: Callable | None = None, multiple_outputs: bool | None = None, **kwargs):
    """Run the decorated function as one Ray job: ``@task.ray(num_gpus=1) def evaluate(uri): ...``.

    Takes ``RayTaskOperator``'s parameters but ``python_callable``, ``op_args`` and ``op_kwargs``
    (docs/parameters.md). The call's arguments
    (literals, templates, XComArgs) are the function's arguments, as JSON values; its return value
    must be JSON too (numbers, strings, lists, dicts): anything else fails the job saying so.
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_RayDecoratedOperator,
        **kwargs,
    )
