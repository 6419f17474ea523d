"""RayTaskOperator: its own input checked in execute() before the cluster is asked anything, its
plan, one Ray job per task run, the return value read back from storage. What it shares with every
operator of the provider (BaseRayJobOperator) is tested once, in test_base.py."""

from __future__ import annotations

import json
import os
import sys

import cloudpickle
import pytest

from airflow_provider_horovod.contract import (
    META_KIND,
    META_RESOURCES,
    SPEC_FILE,
    XCOM_COST,
    XCOM_SUBMISSION_ID,
    TaskRun,
)
from airflow_provider_horovod.documents import TaskRecord, TaskSpec
from airflow_provider_horovod.exceptions import InvalidParameterError, UserCodeError
from airflow_provider_horovod.failures import Failure, FailureClass
from airflow_provider_horovod.jobs.wait import WaitPolicy
from airflow_provider_horovod.operators.base import BaseRayJobOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator
from airflow_provider_horovod.storage import Storage
from unit.fakes import RUN_ID, FakeRay, as_runtime_prints, context

TASK_RUN = TaskRun("dag", "evaluate", RUN_ID)


def evaluate(uri, threshold=0.5):
    return {"uri": uri, "passed": threshold < 0.9}


def operator(**kwargs) -> RayTaskOperator:
    kwargs.setdefault("python_callable", evaluate)
    kwargs.setdefault("storage_path", "/tmp/ahp-unit")
    return RayTaskOperator(task_id="evaluate", **kwargs)


BAD_TASK_INPUTS = [
    ({"python_callable": 42}, "python_callable", "give a function"),
    ({"python_callable": "not a path"}, "python_callable", "package.module:function"),
    ({"python_callable": "no_such_module_xyz:run"}, "python_callable", "not importable"),
    ({"op_args": "s3://b/x"}, "op_args", "give a list of arguments"),
    ({"op_args": [object()]}, "op_args", "JSON-serialisable"),
    ({"op_kwargs": ["x"]}, "op_kwargs", "give a dict"),
    ({"op_kwargs": {"model": object()}}, "op_kwargs", "JSON-serialisable"),
    ({"num_cpus": -1}, "num_cpus", "greater than 0"),
    ({"num_gpus": "1"}, "num_gpus", "greater than 0"),
    ({"memory": 1.5}, "memory", "whole number"),
    ({"resources": {"gpu": 1}}, "resources", "'GPU'"),
]


@pytest.mark.parametrize(
    "kwargs, parameter, fix", BAD_TASK_INPUTS, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD_TASK_INPUTS)]
)
def test_bad_input_fails_in_execute_before_any_cluster_call(serve, kwargs, parameter, fix):
    dashboard = serve(FakeRay())
    op = operator(**kwargs)
    ctx = context(task_id="evaluate")
    with pytest.raises(InvalidParameterError) as err:
        op.execute(ctx)
    assert err.value.parameter == parameter
    assert fix in str(err.value)
    assert str(err.value).startswith(f"Invalid {parameter}=")
    assert op.submission_id is None
    assert ctx["ti"].xcoms == {}
    assert dashboard.requests == []


def test_its_own_template_fields_render():
    # Its own templated parameters beside those it shares with every operator (test_base.py).
    assert set(RayTaskOperator.template_fields) == set(BaseRayJobOperator.template_fields) | {"op_args", "op_kwargs"}
    op = operator(op_args=["s3://b/{{ params.run }}"], op_kwargs={"threshold": "{{ params.t }}"})
    op.render_template_fields({"params": {"run": "r1", "t": 0.7}})
    assert op.op_args == ["s3://b/r1"]
    assert op.op_kwargs == {"threshold": "0.7"}


def test_plan_builds_the_task_spec():
    made = operator(
        op_args=("s3://b/m",), op_kwargs={"threshold": 0.7}, num_gpus=1, memory=2**30, resources={"accel": 1}
    ).checked_plan(TASK_RUN, WaitPolicy())
    spec, files, runtime_env, driver = made.spec, made.files, made.runtime_env, made.driver_resources
    assert spec.submission_id == TASK_RUN.submission_id(1)
    assert spec.function == {"pickle": "function.pkl", "source": __file__}
    assert spec.args == ["s3://b/m"]
    assert spec.kwargs == {"threshold": 0.7}
    assert spec.python_version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert spec.storage_uri == TASK_RUN.storage_uri("/tmp/ahp-unit")
    assert runtime_env == {}
    assert driver == {"num_cpus": 1, "num_gpus": 1, "memory": 2**30, "resources": {"accel": 1.0}}
    assert cloudpickle.loads(files["function.pkl"])("u") == {"uri": "u", "passed": True}
    assert TaskSpec.from_json(spec.to_json()) == spec
    imported = operator(python_callable="json:dumps", num_cpus=0).checked_plan(TASK_RUN, WaitPolicy())
    assert imported.spec.function == {"import": "json:dumps"}
    assert imported.files == {}
    assert imported.driver_resources["num_cpus"] is None


def cluster_that_runs(*, ends="SUCCEEDED"):
    def on_submit(ray, call):
        spec = TaskSpec.from_json(call["payload"][SPEC_FILE].decode())
        if ends == "SUCCEEDED":
            fn = cloudpickle.loads(call["payload"]["function.pkl"])
            record = TaskRecord(
                submission_id=spec.submission_id,
                attempt=spec.attempt,
                storage_uri=spec.storage_uri,
                run_uri=spec.run_uri,
                return_value=fn(*spec.args, **spec.kwargs),
            )
            Storage().write_bytes(spec.result_uri, record.to_json().encode())
        ray.set_job(spec.submission_id, {"status": ends, "metadata": call["metadata"], "message": ends.lower()})
        verdict = Failure(FailureClass.USER_CODE, "ValueError: boom").line()
        text = f"evaluating\nAHP_ERROR user_code: boom\n{verdict}\n" if ends == "FAILED" else "evaluating\n"
        ray.logs[spec.submission_id] = [as_runtime_prints(text, spec.mark_token)]

    return on_submit


def test_a_task_run_returns_the_functions_value(serve, tmp_path):
    ray = FakeRay(on_submit=cluster_that_runs())
    serve(ray)
    op = operator(
        storage_path=str(tmp_path),
        op_args=["s3://b/model"],
        op_kwargs={"threshold": 0.95},
        num_gpus=1,
        poll_interval_seconds=0.001,
    )
    ctx = context(task_id="evaluate")
    assert op.execute(ctx) == {"uri": "s3://b/model", "passed": False}
    (call,) = ray.submitted
    sid = TASK_RUN.submission_id(1)
    assert call["submission_id"] == sid
    assert ctx["ti"].xcoms[XCOM_SUBMISSION_ID] == sid
    assert call["entrypoint"].startswith("python -m airflow_provider_horovod.runtime.entrypoint task ahp_payload_")
    assert call["metadata"][META_KIND] == "task"
    assert json.loads(call["metadata"][META_RESOURCES]) == {
        "num_cpus": 1,
        "num_gpus": 1,
    }
    assert (call["entrypoint_num_cpus"], call["entrypoint_num_gpus"], call["entrypoint_memory"]) == (1, 1, None)
    assert os.path.exists(f"{TASK_RUN.storage_uri(str(tmp_path))}/attempt-1/consumed.json")


def test_the_connections_prices_reach_a_task_that_gives_none_and_its_cost_has_a_key(serve, tmp_path):
    ray = FakeRay(on_submit=cluster_that_runs())
    serve(ray, prices={"cpu_hour": 0.05, "currency": "USD"})
    ctx = context(task_id="evaluate")
    operator(storage_path=str(tmp_path), op_args=["u"], poll_interval_seconds=0.001).execute(ctx)
    (call,) = ray.submitted
    assert json.loads(call["metadata"]["ahp_prices"]) == {"cpu_hour": 0.05, "currency": "USD"}
    assert ctx["ti"].xcoms[XCOM_COST]["prices"] == {"cpu_hour": 0.05, "currency": "USD"}


def test_a_failed_task_job_fails_for_good_and_clearing_runs_it_again(serve, tmp_path):
    ray = FakeRay(on_submit=cluster_that_runs(ends="FAILED"))
    serve(ray)
    op = operator(storage_path=str(tmp_path), op_args=["u"], poll_interval_seconds=0.001)
    with pytest.raises(UserCodeError, match="ended FAILED: failed\nuser code: ValueError: boom\nWhat to do: fix the"):
        op.execute(context(task_id="evaluate"))
    ray.on_submit = cluster_that_runs()
    retry = operator(storage_path=str(tmp_path), op_args=["u"], poll_interval_seconds=0.001)
    assert retry.execute(context(task_id="evaluate", try_number=2)) == {"uri": "u", "passed": True}
    assert [c["submission_id"] for c in ray.submitted] == [TASK_RUN.submission_id(1), TASK_RUN.submission_id(2)]
