"""Every parameter of the operators, the sensor and the decorators, given any value: the checked plan
(or the sensor's checked inputs), or InvalidParameterError naming that parameter; never another
exception. The checks run before anything is submitted (``BaseRayJobOperator.checked_plan``)."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings

from airflow_provider_horovod.contract import TaskRun
from airflow_provider_horovod.documents import TaskSpec, TrainingSpec
from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.operators.base import BaseRayJobOperator
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator
from airflow_provider_horovod.plan import JobPlan
from unit.properties.values import anything

# Cases per parameter, a fifth of the profile's (conftest.py): a plan takes milliseconds, and there are
# some sixty parameters.
PER_PARAMETER = max(1, settings.default.max_examples // 5)
TASK_RUN = TaskRun("dag", "task", "manual__2026-01-01T00:00:00+00:00")


def evaluate(uri, threshold=0.5):
    return {"uri": uri, "passed": threshold < 0.9}


# What each operator needs besides the parameter under test: a valid task.
VALID: dict[type[BaseRayJobOperator], dict[str, Any]] = {
    HorovodTrainOperator: {"train_fn": "airflow_provider_horovod.examples.quickstart:train_func"},
    RayTaskOperator: {"python_callable": evaluate},
}
OPERATOR_PARAMETERS = [(cls, name) for cls in VALID for name in cls.parameters.names]


def make(cls, **given_values):
    values = {**VALID[cls], "storage_path": "/tmp/ahp-unit", **given_values}
    return cls(task_id="task", **values)


def plan_or_refusal(op) -> JobPlan | InvalidParameterError:
    try:
        return op.checked_plan(TASK_RUN, op.wait_policy())
    except InvalidParameterError as err:
        return err


def fits(value, annotation) -> bool:
    """Whether a value is of the spec field's type, as far as JSON tells types apart (its outer
    type and, for a dict or a list, that of its items)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is typing.Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arg) for arg in args)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, Mapping) and all(fits(k, args[0]) and fits(v, args[1]) for k, v in value.items())
    if origin is list:
        return isinstance(value, list) and all(fits(item, args[0]) for item in value)
    return isinstance(value, origin or annotation)


def names_it(err: InvalidParameterError, name: str, attribute: str) -> bool:
    return err.parameter in (name, attribute) or name in str(err)


@pytest.mark.parametrize(
    ("cls", "name"), OPERATOR_PARAMETERS, ids=[f"{c.__name__}.{n}" for c, n in OPERATOR_PARAMETERS]
)
@settings(max_examples=PER_PARAMETER)
@given(value=anything)
def test_any_value_of_a_parameter_plans_or_is_refused_by_name(cls, name, value):
    op = make(cls, **{name: value})
    outcome = plan_or_refusal(op)
    if isinstance(outcome, InvalidParameterError):
        assert names_it(outcome, name, cls.parameters[name].attribute), outcome
        return
    # A plan: its spec crosses the boundary as JSON and comes back the same.
    spec_class = TrainingSpec if cls is HorovodTrainOperator else TaskSpec
    field_types = typing.get_type_hints(spec_class)
    for field in dataclasses.fields(outcome.spec):
        assert fits(getattr(outcome.spec, field.name), field_types[field.name]), field.name
    text = outcome.spec.to_json()
    assert spec_class.from_json(text).to_json() == text
    outcome.request(1)


# Found by the properties above; kept as examples so that they stay found.
@pytest.mark.parametrize(
    ("name", "value"),
    [("prices", {"": None, 0: None}), ("checkpoint_score_attribute", 5), ("checkpoint_score_attribute", {"a": 1})],
)
def test_values_the_properties_found_are_refused_by_name(name, value):
    outcome = plan_or_refusal(make(HorovodTrainOperator, **{name: value}))
    assert isinstance(outcome, InvalidParameterError) and outcome.parameter == name
