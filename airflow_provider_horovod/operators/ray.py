"""``RayTaskOperator``: one Python function as one Ray job (``@task.ray``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from airflow_provider_horovod import checks
from airflow_provider_horovod.contract import (
    TaskRun,
)
from airflow_provider_horovod.parameters import Declaration, Param

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_horovod.jobs.wait import WaitPolicy
    from airflow_provider_horovod.plan import JobPlan

from airflow_provider_horovod.operators.base import BaseRayJobOperator


class RayTaskOperator(BaseRayJobOperator):
    """Run one Python function as one Ray job, for work that belongs next to the model: evaluation,
    batch inference, data preparation. Its return value (JSON) is the task's XCom ``return_value``.

    The function runs in the job's driver, which Ray schedules with the resources asked for here
    (``num_gpus`` sets its ``CUDA_VISIBLE_DEVICES``). One task run is one Ray job: a retry re-attaches
    to a running job, reuses a succeeded one, and runs again after a failed one. It takes the shared
    parameters of ``BaseRayJobOperator`` too (``storage_path`` holds the record that carries the return
    value); the job's cost is pushed as XCom ``cost``.
    """

    def __init__(
        self,
        *,
        python_callable: Annotated[
            Callable[..., Any] | str,
            Param(
                "The function: a callable (shipped with cloudpickle; code in DAG files travels by value) or "
                'an import path `"package.module:function"`.'
            ),
        ],
        op_args: Annotated[
            Collection[Any] | None,
            Param("Positional arguments (JSON values, XComArgs included).", templated=True, check=checks.check_args),
        ] = None,
        op_kwargs: Annotated[
            Mapping[str, Any] | None,
            Param(
                "Keyword arguments (JSON values, XComArgs included).",
                templated=True,
                renderer="json",
                check=checks.check_json,
            ),
        ] = None,
        num_cpus: Annotated[float, Param("CPUs the job reserves for the function (0: none).")] = 1,
        num_gpus: Annotated[float | None, Param("GPUs it reserves (None or 0: none).")] = None,
        memory: Annotated[
            int | None,
            Param(
                "Memory it reserves, in bytes.",
                check=functools.partial(checks.check_positive, allow_none=True, integer=True),
            ),
        ] = None,
        resources: Annotated[
            dict[str, float] | None,
            Param(
                'Custom Ray resources it reserves, e.g. `{"accelerator_type:A100": 1}`.',
                # Not `self.resources`: BaseOperator makes that attribute Airflow's own Resources (cpus, ram, ...).
                attribute="ray_resources",
            ),
        ] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.parameters.store(self, locals())

    parameters: ClassVar[Declaration] = Declaration.of(__init__, base=BaseRayJobOperator.parameters)
    template_fields: Sequence[str] = parameters.template_fields
    template_fields_renderers = parameters.template_fields_renderers
    __doc__ = parameters.docstring(__doc__)

    def plan(self, task_run: TaskRun, policy: WaitPolicy, given: dict[str, Any], *, try_number: int | None) -> JobPlan:
        from airflow_provider_horovod.plan import task_plan

        return task_plan(task_run, given)

    def task_result(self, context: Context, result: dict[str, Any]) -> Any:
        from airflow_provider_horovod.cost import summary

        if result.get("cost"):
            self.log.info("%s", summary(result["cost"]))
        return result["return_value"]

    def lineage(self, result: dict[str, Any] | None) -> Any:
        from airflow_provider_horovod.lineage import task_lineage

        return task_lineage(
            inlets=self.inlets,
            outlets=self.outlets,
            python_callable=self.python_callable,
            submission_id=self.submission_id,
            result=result,
        )
