"""``@task.horovod``: the decorated function is the training function every Horovod worker runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.horovodrun import ScriptCommand, parse_command
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator

if TYPE_CHECKING:
    from airflow.sdk import Context


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

    Takes ``HorovodTrainOperator``'s parameters but ``train_fn`` (docs/parameters.md; its template
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


class _HorovodScriptDecoratedOperator(DecoratedOperator, HorovodTrainOperator):
    """``HorovodTrainOperator`` running the script of the command line its TaskFlow function returns."""

    custom_operator_name = "@task.horovod_script"
    template_fields = (*HorovodTrainOperator.template_fields, "op_args", "op_kwargs")
    template_fields_renderers = HorovodTrainOperator.template_fields_renderers

    def __init__(self, *, python_callable: Callable, op_args: Any = None, op_kwargs: Any = None, **kwargs) -> None:
        super().__init__(python_callable=python_callable, op_args=op_args, op_kwargs=op_kwargs, **kwargs)

    def execute(self, context: Context) -> Any:
        # As @task.bash calls its function; the common-compat provider has these on every Airflow 3 minor.
        from airflow.providers.common.compat.sdk import context_merge, determine_kwargs

        context_merge(context, self.op_kwargs)
        command = self.python_callable(*self.op_args, **determine_kwargs(self.python_callable, self.op_args, context))
        self.log.info("Command: %s", command)
        apply_command(self, parse_command(command, "the command @task.horovod_script returned"))
        return super().execute(context)


def apply_command(operator: HorovodTrainOperator, command: ScriptCommand) -> None:
    """The command line's script, arguments and launcher flags on the operator. A flag and a parameter given
    both must agree (``horovod_env`` entries are merged, key by key)."""
    operator.train_script = f"-m {command.script}" if command.module else command.script
    operator.script_args = list(command.args)
    for name, value in command.parameters.items():
        current, default = getattr(operator, name), operator.parameters[name].default
        if isinstance(value, dict):
            current = dict(current or {})
            clash = sorted(k for k in value if k in current and str(current[k]) != str(value[k]))
            if clash:
                raise InvalidParameterError(
                    name, current, f"the command sets {', '.join(clash)} otherwise; give it once."
                )
            value = {**current, **value}
        elif current != default and current != value:
            raise InvalidParameterError(name, current, f"the command line sets it to {value!r}; give it once.")
        setattr(operator, name, value)


def horovod_script_task(python_callable: Callable | None = None, **kwargs):
    """Run a Horovod script unchanged: ``@task.horovod_script(storage_path=...) def train(ds=None): return
    f"horovodrun -np 4 python train.py --date {ds}"``.

    The function runs in the Airflow task and returns the command line, as ``@task.bash`` does: a string or a
    list of strings, ``horovodrun [flags] python script.py ARGS``, ``python -m package.module ARGS`` or
    ``script.py ARGS`` (docs/migrating.md, "From horovodrun": which flag maps to which parameter, and which
    are refused). Takes ``HorovodTrainOperator``'s parameters but ``train_fn``, ``train_script`` and
    ``script_args``; a flag and a parameter given both must agree.
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=False,
        decorated_operator_class=_HorovodScriptDecoratedOperator,
        **kwargs,
    )
