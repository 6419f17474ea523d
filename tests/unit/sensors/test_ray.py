"""RayJobSensor: its input checked before the cluster is asked anything, and each poke against a
stand-in for the Ray dashboard."""

from __future__ import annotations

import json
import os
import time

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException
from airflow.sdk import PokeReturnValue

from airflow_provider_horovod.contract import (
    META_KIND,
    META_RESOURCES,
    META_RESULT_URI,
    XCOM_CHECKPOINT_URI,
    result_uri,
)
from airflow_provider_horovod.documents import ResultRecord
from airflow_provider_horovod.exceptions import InfrastructureError, InvalidParameterError, RayJobError, UserCodeError
from airflow_provider_horovod.links.ray import RayJobLink
from airflow_provider_horovod.sensors.ray import RayJobSensor
from airflow_provider_horovod.storage import Storage
from unit.fakes import FakeRay, context

SID = "raysubmit_A1b2C3"


def sensor(**kwargs) -> RayJobSensor:
    return RayJobSensor(task_id="wait", **{"submission_id": SID, "poke_interval": 1, **kwargs})


@pytest.mark.parametrize(
    "kwargs, parameter, fix",
    [
        ({"submission_id": ""}, "submission_id", "xcom_pull"),
        ({"submission_id": None}, "submission_id", "xcom_pull"),
        ({"submission_id": "None"}, "submission_id", "the template rendered None"),
        ({"submission_id": "a/b"}, "submission_id", "no spaces, '/', '?' or '#'"),
        ({"submission_id": "ahp x a1"}, "submission_id", "as the Ray dashboard shows it"),
        ({"ray_conn_id": ""}, "ray_conn_id", "'ray_default'"),
        ({"deferrable": "false"}, "deferrable", "True or False"),
        ({"pending_timeout_seconds": 0}, "pending_timeout_seconds", "greater than 0"),
        ({"deferrable": True, "poke_interval": 0.0}, "poke_interval", "seconds greater than 0"),
        ({"aws_conn_id": "aws_does_not_exist"}, "aws_conn_id", "create it (type aws)"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_input_fails_before_any_cluster_call(serve, kwargs, parameter, fix, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DOES_NOT_EXIST", raising=False)
    dashboard = serve(FakeRay())
    task = sensor(**kwargs)
    with pytest.raises(InvalidParameterError) as err:
        task.execute(context(task_id="wait"))
    assert err.value.parameter == parameter
    assert fix in str(err.value)
    assert str(err.value).startswith(f"Invalid {parameter}={err.value.value!r}: ")
    assert dashboard.requests == []


@pytest.mark.parametrize(
    "kwargs, parameter", [({"poke_interval": -1}, "poke_interval"), ({"timeout": "1h"}, "timeout")]
)
def test_bad_timing_fails_when_the_dag_is_parsed(kwargs, parameter):
    with pytest.raises(InvalidParameterError) as err:
        sensor(**kwargs)
    assert err.value.parameter == parameter
    assert "seconds (0 or more)" in str(err.value)


def test_it_defers_by_default_whatever_airflows_default_deferrable_says():
    from airflow.providers.common.compat.sdk import conf

    assert conf.getboolean("operators", "default_deferrable") is False  # stock Airflow
    assert sensor().deferrable is True


def test_template_fields_render_when_the_task_runs():
    assert set(RayJobSensor.template_fields) == {"submission_id", "ray_conn_id", "aws_conn_id"}
    task = sensor(submission_id="{{ ti.xcom_pull(task_ids='train', key='submission_id') }}")
    assert "xcom_pull" in task.submission_id  # not rendered, nor checked, at parse time
    task = sensor(
        submission_id="{{ params.sid }}", ray_conn_id="ray_{{ params.env }}", aws_conn_id="aws_{{ params.env }}"
    )
    task.render_template_fields({"params": {"sid": SID, "env": "prod"}})
    assert task.submission_id == SID
    assert task.ray_conn_id == "ray_prod"
    assert task.aws_conn_id == "aws_prod"


@pytest.fixture
def poke(serve):
    """A poke through the real hook at ``ray`` served over HTTP (its dashboard as ``poke.dashboard``)."""

    def poke_(task, ray, ctx=None):
        poke_.dashboard = serve(ray, task.ray_conn_id)
        return task.poke(ctx or context(task_id="wait"))

    return poke_


def test_a_running_job_is_not_done(poke):
    ray = FakeRay({SID: {"status": "RUNNING"}}, logs={SID: "lots of log\n"})
    assert poke(sensor(), ray) is False
    assert "get_job_logs" not in ray.calls
    assert ray.stopped == []


def test_a_succeeded_job_of_anyone_gives_the_generic_dict(poke):
    ray = FakeRay({SID: {"status": "SUCCEEDED", "metadata": {"owner": "team-a"}}})
    ctx = context(task_id="wait")
    done = poke(sensor(), ray, ctx)
    assert isinstance(done, PokeReturnValue)
    assert done.is_done
    assert done.xcom_value == {
        "submission_id": SID,
        "status": "SUCCEEDED",
        "metadata": {"owner": "team-a"},
        "dashboard_url": f"{poke.dashboard.url}/#/jobs/{SID}",
        "job_tags": {},
    }
    assert ctx["ti"].xcoms == {}


@pytest.mark.parametrize("status, failure", [("FAILED", UserCodeError), ("STOPPED", InfrastructureError)])
def test_a_failed_job_raises_its_class_with_the_tail_of_its_log(poke, status, failure):
    log = "".join(f"step {i}\n" for i in range(60)) + "RuntimeError: CUDA out of memory\n"
    error_type = "JOB_ENTRYPOINT_COMMAND_ERROR" if status == "FAILED" else None
    ray = FakeRay({SID: {"status": status, "message": "driver failed", "error_type": error_type}}, logs={SID: log})
    with pytest.raises(failure) as err:
        poke(sensor(), ray)
    message = str(err.value)
    assert f"Ray job {SID} ended {status}" in message
    assert ": driver failed" in message
    assert "step 59\nRuntimeError: CUDA out of memory\n" in message
    assert "step 20\n" not in message
    assert message.splitlines()[-1].startswith("What to do: ")
    assert err.value.status == status
    # A job not of the provider's that failed in its entrypoint failed in its own code: not retried.
    assert isinstance(err.value, AirflowFailException) is (failure is UserCodeError)


def test_a_missing_job(poke):
    with pytest.raises(
        RayJobError,
        match=f"'{SID}' does not exist on the cluster of connection 'ray_x'; check submission_id and ray_conn_id",
    ):
        poke(sensor(ray_conn_id="ray_x"), FakeRay())


def test_pending_too_long_stops_the_job(poke):
    ray = FakeRay(
        {
            SID: {
                "status": "PENDING",
                "start_time": (time.time() - 100) * 1000,
                "metadata": {META_RESOURCES: '{"GPU": 8.0}'},
            }
        },
        cluster={"CPU": 2.0},
    )
    with pytest.raises(RayJobError, match='stayed PENDING for 100 s.*ask for {"GPU": 8.0}.*has {"CPU": 2.0}'):
        poke(sensor(pending_timeout_seconds=10), ray)
    assert ray.stopped == [SID]


def test_a_training_job_gives_the_verified_checkpoint(poke, tmp_path):
    storage_uri = str(tmp_path / "dag" / "train" / "run-abcdef")
    checkpoint = f"{storage_uri}/attempt-1/checkpoint_000003"
    os.makedirs(checkpoint)
    with open(f"{checkpoint}/model.pt", "wb") as f:
        f.write(b"w")
    sid = "ahp-dag-train-0123456789-a1"
    record = ResultRecord(
        submission_id=sid,
        attempt=1,
        storage_uri=storage_uri,
        run_uri=f"{storage_uri}/attempt-1",
        checkpoint_uri=checkpoint,
        best_checkpoint_uri=None,
        metrics={"loss": 0.2},
        world_size=2,
        trainer_api="v2",
    )
    Storage().write_bytes(result_uri(storage_uri, 1), record.to_json().encode())
    ray = FakeRay(
        {sid: {"status": "SUCCEEDED", "metadata": {META_RESULT_URI: result_uri(storage_uri, 1), META_KIND: "train"}}}
    )
    ctx = context(task_id="wait")
    done = poke(sensor(submission_id=sid), ray, ctx)
    assert done.xcom_value["checkpoint_uri"] == checkpoint
    assert done.xcom_value["metrics"] == {"loss": 0.2}
    assert ctx["ti"].xcoms[XCOM_CHECKPOINT_URI] == checkpoint
    assert json.loads(open(f"{storage_uri}/attempt-1/consumed.json").read())["submission_id"] == sid


def test_execute_pushes_the_link_and_waits_by_poking(poke, serve):
    ray = FakeRay({SID: [{"status": "RUNNING"}, {"status": "SUCCEEDED", "metadata": {}}]})
    task = sensor(poke_interval=0.01, deferrable=False)
    poke.dashboard = serve(ray)
    ctx = context(task_id="wait")
    assert task.execute(ctx)["status"] == "SUCCEEDED"
    assert ctx["ti"].xcoms[RayJobLink().xcom_key] == f"{poke.dashboard.url}/#/jobs/{SID}"


def test_deferrable_defers_only_while_the_job_runs(poke, serve):
    from airflow.sdk.exceptions import TaskDeferred

    ray = FakeRay({SID: {"status": "SUCCEEDED", "metadata": {}}})
    task = sensor(deferrable=True)
    poke.dashboard = serve(ray)
    assert task.execute(context(task_id="wait"))["status"] == "SUCCEEDED"  # already over: no deferral

    ray = FakeRay({SID: {"status": "RUNNING"}})
    task = sensor(deferrable=True, poke_interval=5, timeout=600, pending_timeout_seconds=30, ray_conn_id="ray_x")
    poke.dashboard = serve(ray, "ray_x")
    with pytest.raises(TaskDeferred) as deferred:
        task.execute(context(task_id="wait"))
    _, kwargs = deferred.value.trigger.serialize()
    assert (kwargs["submission_id"], kwargs["ray_conn_id"], kwargs["policy"]) == (
        SID,
        "ray_x",
        {"poll_interval_s": 5.0, "pending_timeout_s": 30, "stall_timeout_s": None},
    )
    assert deferred.value.timeout.total_seconds() == 600
