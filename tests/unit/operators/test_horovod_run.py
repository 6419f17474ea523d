"""A whole training task run through the real RayHook against a stand-in for the Ray dashboard
served over HTTP (``unit.fakes.Dashboard``, the ``serve`` fixture): what the task returns and
pushes, how a failure of the job fails the try, how a retry resumes, what travels in the payload."""

from __future__ import annotations

import json

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException

from airflow_provider_horovod.contract import (
    SPEC_FILE,
    XCOM_CHECKPOINT_URI,
    XCOM_JOB,
    XCOM_LOG_CURSOR,
    XCOM_SUBMISSION_ID,
    attempt_uri,
)
from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.exceptions import InfrastructureError, RayJobPendingTimeoutError, UserCodeError
from airflow_provider_horovod.failures import Failure, FailureClass
from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.links.ray import RayJobLink
from unit.fakes import FakeRay, Store, context
from unit.operators.training_cluster import TASK_RUN, cluster_that_trains, train_op


def test_a_task_run_trains_and_returns_the_verified_checkpoint(serve, tmp_path, capsys):
    ray = FakeRay(on_submit=cluster_that_trains())
    dashboard = serve(ray)
    op = train_op(tmp_path, num_workers=3)
    ctx = {**context(), "task_state_store": Store()}
    result = op.execute(ctx)
    sid = TASK_RUN.submission_id(1)
    (call,) = ray.submitted
    assert call["submission_id"] == sid
    assert call["entrypoint"].startswith("python -m airflow_provider_horovod.")
    assert result["submission_id"] == sid
    assert result["attempt"] == 1
    assert result["world_size"] == 3
    assert result["checkpoint_uri"] == f"{TASK_RUN.storage_uri(str(tmp_path))}/attempt-1/checkpoint_000001"
    assert result["dashboard_url"] == f"{dashboard.url}/#/jobs/{sid}"
    assert result["metrics"] == {"loss": 0.1}
    xcoms = ctx["ti"].xcoms
    assert xcoms[XCOM_SUBMISSION_ID] == sid
    assert xcoms[XCOM_CHECKPOINT_URI] == result["checkpoint_uri"]
    assert xcoms[RayJobLink().xcom_key] == f"{dashboard.url}/#/jobs/{sid}"
    saved = LogCursor.from_dict(ctx["task_state_store"][XCOM_LOG_CURSOR], sid)
    assert (saved.lines, saved.tail) == (3, LogCursor(sid).advanced(["epoch 0", "epoch 1", "done"]).tail)
    out = capsys.readouterr().out
    assert [out.count(f"[ray] {line}") for line in ("epoch 0", "epoch 1", "done")] == [1, 1, 1]
    assert op.submission_id == sid
    assert xcoms[XCOM_JOB] == {
        "submission_id": sid,
        "dashboard_url": result["dashboard_url"],
        "attempt": 1,
        "kind": "train",
        "storage_uri": TASK_RUN.storage_uri(str(tmp_path)),
        "checkpoint_score_attribute": None,
        "aws_conn_id": None,
        "job_tags": {},
    }
    # The worker's wait reads windows of the log's end, never the whole log.
    assert ray.tail_reads
    assert "get_job_logs" not in ray.calls


def test_clearing_a_succeeded_task_trains_again(serve, tmp_path):
    ray = FakeRay(on_submit=cluster_that_trains())
    serve(ray)
    first = train_op(tmp_path)
    assert first.execute(context())["attempt"] == 1
    again = train_op(tmp_path)
    result = again.execute(context(try_number=2))
    assert result["attempt"] == 2
    assert result["resumed_from"] is None
    assert [c["submission_id"] for c in ray.submitted] == [TASK_RUN.submission_id(1), TASK_RUN.submission_id(2)]


def test_a_lost_job_fails_the_try_as_infrastructure_and_the_retry_resumes(serve, tmp_path):
    # The driver was killed (no verdict of the runtime's in its log): Ray's job info decides.
    ray = FakeRay(on_submit=cluster_that_trains(ends="FAILED", log=("epoch 3", "Killed"), exit_code=-9))
    serve(ray)
    op = train_op(tmp_path, retries=2)
    with pytest.raises(InfrastructureError) as err:
        op.execute(context())
    message = str(err.value)
    assert "ended FAILED (JOB_ENTRYPOINT_COMMAND_ERROR)" in message
    assert "Last lines of the job's log:\nepoch 3\nKilled\ninfrastructure: the job's driver was killed" in message
    assert not isinstance(err.value, AirflowFailException)  # Airflow retries it

    ray.on_submit = cluster_that_trains()
    retry = train_op(tmp_path)
    result = retry.execute(context(try_number=2))
    assert result["attempt"] == 2
    spec = TrainingSpec.from_json(ray.submitted[1]["payload"][SPEC_FILE].decode())
    assert spec.resume_from == [attempt_uri(TASK_RUN.storage_uri(str(tmp_path)), 1)]
    assert result["resumed_from"] == spec.resume_from[0]


def test_a_users_error_fails_the_task_without_retries_unless_asked(serve, tmp_path):
    verdict = Failure(FailureClass.USER_CODE, "ZeroDivisionError: division by zero", rank=1)
    ray = FakeRay(on_submit=cluster_that_trains(ends="FAILED", log=("epoch 0", verdict.line())))
    serve(ray)
    with pytest.raises(UserCodeError) as err:
        train_op(tmp_path, retries=3).execute(context())
    assert isinstance(err.value, AirflowFailException)  # not retried, whatever retries says
    assert str(err.value).splitlines()[1] == "user code, rank 1: ZeroDivisionError: division by zero"
    with pytest.raises(UserCodeError) as err:
        train_op(tmp_path, retries=3, retry_on_user_error=True).execute(context(try_number=2))
    assert not isinstance(err.value, AirflowFailException)


def test_resources_no_node_has_fail_before_submitting(serve, tmp_path):
    ray = FakeRay(cluster={"CPU": 8.0, "memory": 1e9})
    serve(ray)
    op = train_op(tmp_path, use_gpu=True, num_workers=2)
    with pytest.raises(RayJobPendingTimeoutError) as err:
        op.execute(context())
    assert 'ask for {"GPU": 2.0}' in str(err.value)
    assert "none of ['GPU']" in str(err.value)
    assert "check_cluster_resources=False" in str(err.value)
    assert ray.submitted == []

    autoscaling = train_op(tmp_path, use_gpu=True, check_cluster_resources=False, wait_for_completion=False)
    autoscaling.execute(context())
    assert len(ray.submitted) == 1


def test_forwarded_credentials_travel_in_the_payload_only(serve, tmp_path, s3, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_FWD",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "AKIAFWDTEST000000001",
                "password": "long-lived-secret",
                "extra": {"endpoint_url": s3.endpoint_url, "region_name": "us-east-1"},
            }
        ),
    )
    ray = FakeRay()
    serve(ray)
    op = train_op(
        tmp_path,
        forward_aws_credentials=True,
        aws_conn_id="aws_fwd",
        aws_credentials_ttl_seconds=900,
        wait_for_completion=False,
    )
    op.execute(context())
    (call,) = ray.submitted
    session = json.loads(call["payload"]["aws_session.json"])
    assert session["aws_session_token"]
    assert session["endpoint_url"] == s3.endpoint_url
    visible = json.dumps(call["runtime_env"]) + json.dumps(call["metadata"]) + call["entrypoint"]
    assert session["aws_secret_access_key"] not in visible
    assert session["aws_session_token"] not in visible
    assert "long-lived-secret" not in json.dumps({k: v.decode("latin-1") for k, v in call["payload"].items()})
