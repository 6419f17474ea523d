"""RayTaskOperator, and what every operator of the provider shares (BaseRayJobOperator): input
checked in execute() before the cluster is asked anything, one Ray job per task run, the return
value read back from storage."""

from __future__ import annotations

import json
import os
import sys

import cloudpickle
import pytest

from airflow_provider_horovod import checks, functions, plan
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
from airflow_provider_horovod.hooks.ray import RayHook
from airflow_provider_horovod.jobs.wait import WaitPolicy
from airflow_provider_horovod.operators.ray import BaseRayJobOperator, RayTaskOperator
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
    ({"runtime_env": {"pips": []}}, "runtime_env", "unknown field 'pips'"),
    ({"storage_path": "relative"}, "storage_path", "absolute"),
    ({"ray_conn_id": None}, "ray_conn_id", "'ray_default'"),
    ({"poll_interval_seconds": 0}, "poll_interval_seconds", "greater than 0"),
    ({"wait_for_completion": "yes"}, "wait_for_completion", "True or False"),
    ({"pending_timeout_seconds": float("nan")}, "pending_timeout_seconds", "greater than 0"),
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
    assert err.value.parameter == parameter and fix in str(err.value)
    assert str(err.value).startswith(f"Invalid {parameter}=")
    assert op.submission_id is None and ctx["ti"].xcoms == {} and dashboard.requests == []


def test_the_constructor_does_no_work(monkeypatch):
    def tripwire(*args, **kwargs):
        raise AssertionError("the constructor checked, shipped or connected")

    for module in (checks, functions, plan):
        for name, value in list(vars(module).items()):
            if callable(value) and getattr(value, "__module__", None) in (
                checks.__name__,
                functions.__name__,
                plan.__name__,
            ):
                monkeypatch.setattr(module, name, tripwire)
    monkeypatch.setattr(RayHook, "__init__", tripwire)
    monkeypatch.setattr(RayTaskOperator, "plan", tripwire)
    monkeypatch.setattr(BaseRayJobOperator, "checked_plan", tripwire)
    op = RayTaskOperator(
        task_id="t",
        python_callable=42,
        op_args="x",
        num_cpus=-1,
        storage_path="ftp://x",
        resources=5,
        ray_conn_id="",
        deferrable="no",
    )
    assert (op.python_callable, op.op_args, op.num_cpus, op.storage_path) == (42, "x", -1, "ftp://x")
    assert "hook" not in op.__dict__


def test_template_fields():
    assert set(RayTaskOperator.template_fields) == {
        "op_args",
        "op_kwargs",
        "runtime_env",
        "storage_path",
        "ray_conn_id",
        "aws_conn_id",
        "job_tags",
    }
    # runtime_env is every job's (a training's and a task's), declared once on the base.
    assert set(BaseRayJobOperator.template_fields) == {
        "ray_conn_id",
        "storage_path",
        "aws_conn_id",
        "job_tags",
        "runtime_env",
    }
    op = operator(
        op_args=["s3://b/{{ params.run }}"],
        op_kwargs={"threshold": "{{ params.t }}"},
        job_tags={"team": "{{ params.team }}"},
    )
    op.render_template_fields({"params": {"run": "r1", "t": 0.7, "team": "ranking"}})
    assert op.op_args == ["s3://b/r1"] and op.op_kwargs == {"threshold": "0.7"} and op.job_tags == {"team": "ranking"}


def test_bad_job_tags_fail_before_anything_is_submitted():
    from airflow_provider_horovod.exceptions import InvalidParameterError

    op = operator(job_tags={"ahp_kind": "mine"})
    with pytest.raises(InvalidParameterError) as err:
        op.checked_plan(TASK_RUN, WaitPolicy())
    assert err.value.parameter == "job_tags" and "'ahp_kind' is reserved" in str(err.value)


def test_plan_builds_the_task_spec():
    made = operator(
        op_args=("s3://b/m",), op_kwargs={"threshold": 0.7}, num_gpus=1, memory=2**30, resources={"accel": 1}
    ).checked_plan(TASK_RUN, WaitPolicy())
    spec, files, runtime_env, driver = made.spec, made.files, made.runtime_env, made.driver_resources
    assert spec.submission_id == TASK_RUN.submission_id(1)
    assert spec.function == {"pickle": "function.pkl", "source": __file__}
    assert spec.args == ["s3://b/m"] and spec.kwargs == {"threshold": 0.7}
    assert spec.python_version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert spec.storage_uri == TASK_RUN.storage_uri("/tmp/ahp-unit") and runtime_env == {}
    assert driver == {"num_cpus": 1, "num_gpus": 1, "memory": 2**30, "resources": {"accel": 1.0}}
    assert cloudpickle.loads(files["function.pkl"])("u") == {"uri": "u", "passed": True}
    assert TaskSpec.from_json(spec.to_json()) == spec
    imported = operator(python_callable="json:dumps", num_cpus=0).checked_plan(TASK_RUN, WaitPolicy())
    assert imported.spec.function == {"import": "json:dumps"} and imported.files == {}
    assert imported.driver_resources["num_cpus"] is None


def test_a_local_storage_path_needs_a_shared_filesystem(serve):
    serve(FakeRay(), shared_storage=False)
    op = operator(storage_path="/data/records")
    with pytest.raises(InvalidParameterError, match="shared_storage") as err:
        op.execute(context(task_id="evaluate"))
    assert err.value.parameter == "storage_path"


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
    assert call["submission_id"] == sid and ctx["ti"].xcoms[XCOM_SUBMISSION_ID] == sid
    assert call["entrypoint"].startswith("python -m airflow_provider_horovod.runtime.entrypoint task ahp_payload_")
    assert call["metadata"][META_KIND] == "task" and json.loads(call["metadata"][META_RESOURCES]) == {
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


def test_the_base_operator_leaves_the_plan_and_the_result_to_subclasses():
    op = BaseRayJobOperator(task_id="base")
    with pytest.raises(NotImplementedError):
        op.checked_plan(TASK_RUN, WaitPolicy())
    with pytest.raises(NotImplementedError):
        op.task_result(context(), {})
