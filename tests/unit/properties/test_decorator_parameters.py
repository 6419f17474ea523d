"""The decorators' own inputs and the sensor's parameters, given anything: ``@task.horovod``'s call
arguments, the command line ``@task.horovod_script``'s function returns, and ``RayJobSensor``'s
parameters and poke settings. The checked inputs, or InvalidParameterError naming the input; never
another exception, and nothing asked of the cluster (the checks run before it)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_horovod.decorators.horovod import _HorovodDecoratedOperator, apply_command
from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.horovodrun import ScriptCommand, parse_command
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.sensors.ray import RayJobSensor
from unit.properties.test_operator_parameters import PER_PARAMETER, plan_or_refusal
from unit.properties.values import anything

# Words of horovodrun/mpirun/python command lines, right and wrong, and their values.
WORDS = [
    "horovodrun", "mpirun", "mpiexec", "python", "python3", "-m", "-u", "train.py", "pkg.train", "env", "A=1",
    "-np", "--num-proc", "--min-np", "--max-np", "--gloo-timeout-seconds", "--network-interfaces",
    "--timeline-filename", "--fusion-threshold-mb", "--cycle-time-ms", "--cache-capacity", "--autotune",
    "--no-autotune", "--log-level", "--gloo", "--verbose", "-H", "--hostfile", "--stall-check", "-x",
    "--autotune-gaussian-process-noise", "--", "4", "0", "-1", "2.5", "1e9", "eth0,eth1", "DEBUG", "", " ", "'",
]  # fmt: skip
commands = (
    st.lists(st.sampled_from(WORDS) | st.text(max_size=8), max_size=10)
    | st.lists(st.sampled_from(WORDS), max_size=10).map(" ".join)
    | st.text(max_size=40)
    | anything
)


def train(*args, **kwargs):
    return args, kwargs


@given(command=commands)
def test_a_command_line_parses_or_is_refused_by_name(command):
    try:
        parsed = parse_command(command, "the command")
    except InvalidParameterError as err:
        assert err.parameter == "the command"
        return
    assert isinstance(parsed, ScriptCommand)
    # What it sets is then checked with the operator's own parameters, as ``execute`` does.
    op = HorovodTrainOperator(task_id="task", storage_path="/tmp/ahp-unit")
    try:
        apply_command(op, parsed)
    except InvalidParameterError as err:
        assert err.parameter in op.parameters.names, err
        return
    outcome = plan_or_refusal(op)
    if isinstance(outcome, InvalidParameterError):
        assert outcome.parameter in (*op.parameters.names, "the command") or "[" in outcome.parameter, outcome


@pytest.mark.parametrize("name", ["op_args", "op_kwargs"])
@settings(max_examples=PER_PARAMETER * 3)
@given(value=anything)
def test_the_call_arguments_of_task_horovod_plan_or_are_refused_by_name(name, value):
    try:
        op = _HorovodDecoratedOperator(
            task_id="task", python_callable=train, storage_path="/tmp/ahp-unit", **{name: value}
        )
    except TypeError:  # Airflow binds the call to the function's signature as the DAG is parsed
        return
    outcome = plan_or_refusal(op)
    if isinstance(outcome, InvalidParameterError):
        assert outcome.parameter == name, outcome


SENSOR = [*RayJobSensor.parameters.names, "poke_interval", "timeout"]


@pytest.mark.parametrize("name", SENSOR)
@settings(max_examples=PER_PARAMETER * 2)
@given(value=anything)
def test_any_value_of_a_sensor_parameter_is_checked_or_refused_by_name(name, value):
    given_values = {"submission_id": "ahp-dag-task-0123456789-a1", name: value}
    try:
        sensor = RayJobSensor(task_id="wait", **given_values)
        sid, policy = sensor._check_inputs()
    except InvalidParameterError as err:
        assert err.parameter == name, err
        return
    assert isinstance(sid, str) and sid.strip() == sid
    assert policy.poll_interval_s > 0
