"""BaseRayJobOperator, the flow every operator of the provider shares, tested once (through the
training operator where a concrete one is needed): the constructor does no work; the shared
parameters are checked in execute() before the cluster is asked anything; the storage must be one
the cluster shares; one Ray job per task run, re-attached on a retry; the wait in the worker or
deferred to the triggerer; a pending timeout, a kill and a lost dashboard end the job and the try."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from airflow_provider_horovod import checks, functions, plan
from airflow_provider_horovod.contract import RESUME_GUARD_S, XCOM_CHECKPOINT_URI, XCOM_LOG_CURSOR, XCOM_SUBMISSION_ID
from airflow_provider_horovod.exceptions import (
    InfrastructureError,
    InvalidParameterError,
    RayClusterUnreachableError,
    RayJobError,
    RayJobPendingTimeoutError,
    TaskKilledError,
)
from airflow_provider_horovod.hooks.ray import RayHook
from airflow_provider_horovod.jobs.events import JobEvent
from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.wait import WaitPolicy
from airflow_provider_horovod.links.ray import RayJobLink
from airflow_provider_horovod.operators.base import BaseRayJobOperator
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator
from airflow_provider_horovod.storage import Storage
from unit.fakes import FakeRay, Store, context
from unit.operators.training_cluster import (
    TASK_RUN,
    cluster_that_trains,
    operator,
    runs_until_told,
    train_op,
    write_result,
)


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (
            HorovodTrainOperator,
            {
                "train_fn": "x",
                "num_workers": -1,
                "storage_path": "ftp://x",
                "use_gpu": "yes",
                "runtime_env": {"pips": 1},
                "datasets": 5,
                "ray_conn_id": "",
                "poll_interval_seconds": -1,
            },
        ),
        (
            RayTaskOperator,
            {
                "python_callable": 42,
                "op_args": "x",
                "num_cpus": -1,
                "storage_path": "ftp://x",
                "ray_conn_id": "",
                "deferrable": "no",
            },
        ),
    ],
    ids=["training", "task"],
)
def test_the_constructor_does_no_work(monkeypatch, cls, kwargs):
    # A DAG file is parsed again and again: a bad value fails only when the task runs.
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
    monkeypatch.setattr(cls, "plan", tripwire)
    monkeypatch.setattr(BaseRayJobOperator, "checked_plan", tripwire)
    monkeypatch.setattr(BaseRayJobOperator, "wait_policy", tripwire)
    op = cls(task_id="t", **kwargs)
    assert {name: getattr(op, name) for name in kwargs} == kwargs  # kept as given
    assert "hook" not in op.__dict__


def test_a_task_operators_resources_are_kept_as_given_beside_airflows_own():
    # ``resources`` is also a BaseOperator argument: the task operator keeps its own under another name.
    op = RayTaskOperator(task_id="t", python_callable=42, resources=5)
    assert op.ray_resources == 5


def test_the_shared_template_fields_render():
    # Every operator's (a training's and a task's), declared once on the base.
    assert set(BaseRayJobOperator.template_fields) == {
        "ray_conn_id",
        "storage_path",
        "aws_conn_id",
        "job_tags",
        "runtime_env",
    }
    op = operator(
        storage_path="s3://b/{{ params.env }}",
        ray_conn_id="ray_{{ params.env }}",
        aws_conn_id="aws_{{ params.env }}",
        job_tags={"team": "{{ params.team }}"},
        runtime_env={"env_vars": {"STAGE": "{{ params.env }}"}},
    )
    op.render_template_fields({"params": {"env": "prod", "team": "ranking"}})
    assert op.storage_path == "s3://b/prod"
    assert op.ray_conn_id == "ray_prod"
    assert op.aws_conn_id == "aws_prod"
    assert op.job_tags == {"team": "ranking"}
    assert op.runtime_env == {"env_vars": {"STAGE": "prod"}}
    assert RayJobLink in {type(link) for link in BaseRayJobOperator.operator_extra_links}


# The shared parameters' bad values; the training operator's table (shared with the integration tests)
# has more of them (storage_path, runtime_env, poll_interval_seconds, pending_timeout_seconds).
BAD_SHARED_INPUTS = [
    ({"ray_conn_id": ""}, "ray_conn_id", "'ray_default'"),
    ({"ray_conn_id": None}, "ray_conn_id", "'ray_default'"),
    ({"deferrable": "false"}, "deferrable", "True or False"),
    ({"wait_for_completion": None}, "wait_for_completion", "True or False"),
    ({"wait_for_completion": "yes"}, "wait_for_completion", "True or False"),
    ({"pending_timeout_seconds": float("nan")}, "pending_timeout_seconds", "greater than 0"),
    ({"runtime_env": {"pips": ["pandas"]}}, "runtime_env", "unknown field 'pips'"),
    ({"runtime_env": {"working_dir": "/no/such/dir"}}, "runtime_env", "is not a folder here"),
    ({"job_tags": {"ahp_kind": "mine"}}, "job_tags", "'ahp_kind' is reserved"),
]


@pytest.mark.parametrize(
    "kwargs, parameter, fix", BAD_SHARED_INPUTS, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD_SHARED_INPUTS)]
)
def test_a_bad_shared_parameter_fails_in_execute_before_any_cluster_call(serve, kwargs, parameter, fix):
    dashboard = serve(FakeRay())
    op = operator(**kwargs)
    ctx = context()
    with pytest.raises(InvalidParameterError) as err:
        op.execute(ctx)
    assert err.value.parameter == parameter
    message = str(err.value)
    assert message.startswith(f"Invalid {parameter}={kwargs[parameter]!r}: ")
    assert fix in message
    assert op.submission_id is None
    assert ctx["ti"].xcoms == {}
    assert dashboard.requests == []


def test_the_base_operator_leaves_the_plan_and_the_result_to_subclasses():
    op = BaseRayJobOperator(task_id="base")
    with pytest.raises(NotImplementedError):
        op.checked_plan(TASK_RUN, WaitPolicy())
    with pytest.raises(NotImplementedError):
        op.task_result(context(), {})


def test_a_local_storage_path_needs_a_shared_filesystem(serve):
    ray = FakeRay()
    serve(ray, "ray_remote", shared_storage=False)
    op = operator(storage_path="/data/checkpoints", ray_conn_id="ray_remote")
    with pytest.raises(InvalidParameterError) as err:
        op.execute(context())
    message = str(err.value)
    assert err.value.parameter == "storage_path"
    assert message.startswith("Invalid storage_path='/data/checkpoints': ")
    assert "connection 'ray_remote'" in message
    assert '{"shared_storage": true}' in message
    assert "s3://bucket/prefix" in message
    assert op.submission_id is None
    assert ray.submitted == []  # no job


@pytest.mark.parametrize("storage_path, shared", [("/data/checkpoints", True), ("s3://bucket/prefix", False)])
def test_shared_or_s3_storage_passes_that_check(serve, storage_path, shared, monkeypatch):
    # No S3 here (test_storage.py has moto): the storage answers that no attempt was submitted yet.
    monkeypatch.setattr(Storage, "check_bucket", lambda self, uri: None)
    monkeypatch.setattr(Storage, "exists", lambda self, uri: False)
    ray = FakeRay(cluster={})
    serve(ray, shared_storage=shared)
    op = operator(storage_path=storage_path)
    with pytest.raises(RayJobPendingTimeoutError) as err:  # the next check: the cluster has no CPU at all
        op.execute(context())
    assert "none of ['CPU']" in str(err.value)
    assert ray.submitted == []


def test_a_retry_reattaches_and_repeats_no_log_line(serve, tmp_path, capsys):
    sid = TASK_RUN.submission_id(1)
    ray = FakeRay(on_submit=cluster_that_trains())
    serve(ray)
    op = train_op(tmp_path)
    store = Store()
    op.execute({**context(), "task_state_store": store})
    capsys.readouterr()
    # A worker died after the job had ended, before the task did: the next try finds the job.
    ray.jobs[sid] = [{"status": "SUCCEEDED", "metadata": ray.submitted[0]["metadata"]}]
    ray.logs[sid] = ["epoch 0\nepoch 1\ndone\nshutdown\n"]
    os.remove(f"{TASK_RUN.storage_uri(str(tmp_path))}/attempt-1/consumed.json")
    retry = train_op(tmp_path)
    assert retry.execute({**context(try_number=2), "task_state_store": store})["attempt"] == 1
    out = capsys.readouterr().out
    assert "[ray] shutdown" in out
    assert "[ray] epoch" not in out
    assert "[ray] done" not in out
    assert len(ray.submitted) == 1


def test_without_waiting_the_task_returns_the_job(serve, tmp_path):
    ray = FakeRay()
    dashboard = serve(ray)
    op = train_op(tmp_path, wait_for_completion=False)
    ctx = context()
    sid = TASK_RUN.submission_id(1)
    assert op.execute(ctx) == {
        "submission_id": sid,
        "dashboard_url": f"{dashboard.url}/#/jobs/{sid}",
        "storage_uri": TASK_RUN.storage_uri(str(tmp_path)),
        "attempt": 1,
        "kind": "train",
        "checkpoint_score_attribute": None,
        "aws_conn_id": None,
        "job_tags": {},
    }
    assert ctx["ti"].xcoms[XCOM_SUBMISSION_ID] == sid
    assert "get_job_logs" not in ray.calls


def test_deferred_the_trigger_gets_the_job_and_the_cursor_after_a_short_wait_here(serve, tmp_path, monkeypatch, capsys):
    from airflow.sdk.exceptions import TaskDeferred

    monkeypatch.setenv("AIRFLOW__HOROVOD__DEFER_AFTER_SECONDS", "0.3")
    ray = FakeRay(on_submit=runs_until_told(("epoch 0", "epoch 1", "epoch 2")))
    serve(ray, "my_ray")
    op = train_op(tmp_path, deferrable=True, pending_timeout_seconds=45, ray_conn_id="my_ray")
    sid = TASK_RUN.submission_id(1)
    earlier = LogCursor(sid).advanced(["epoch 0", "epoch 1"])  # streamed by an earlier try
    ctx = {**context(), "task_state_store": Store({XCOM_LOG_CURSOR: earlier.to_dict()})}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    assert (
        "The job runs on after 0.3 s followed here ([horovod] defer_after_seconds): deferred."
        in capsys.readouterr().out
    )
    classpath, kwargs = deferred.value.trigger.serialize()
    assert classpath == "airflow_provider_horovod.triggers.ray.RayJobTrigger"
    # The short wait here streamed the line the earlier try had not: the trigger goes on after it.
    handed = LogCursor.from_dict(kwargs.pop("log_cursor"), sid)
    assert (handed.lines, handed.tail) == (3, earlier.advanced(["epoch 2"]).tail)
    # The event waits until Airflow has seen this worker exit (apache/airflow#67287).
    assert abs(kwargs.pop("not_before") - (time.time() + RESUME_GUARD_S)) < 5
    assert kwargs == {
        "submission_id": sid,
        "ray_conn_id": "my_ray",
        "stream_logs": True,
        "policy": {"poll_interval_s": 0.001, "pending_timeout_s": 45, "stall_timeout_s": None},
        "aws_conn_id": None,  # the record of an attempt killed before its driver started (jobs.stop)
    }
    assert deferred.value.method_name == "execute_complete"
    # Pushed before deferring: a restarted trigger reads it there.
    assert LogCursor.from_dict(ctx["ti"].xcoms[XCOM_LOG_CURSOR], sid).lines == 3

    # The trigger's event resumes a new operator instance.
    write_result(ray.submitted[0])
    event = JobEvent.from_info(
        sid,
        {"status": "SUCCEEDED", "metadata": ray.submitted[0]["metadata"]},
        log_cursor={"submission_id": sid, "lines": 3},
    )
    resumed = train_op(tmp_path, deferrable=True, ray_conn_id="my_ray")
    result = resumed.execute_complete(ctx, json.loads(json.dumps(event.to_dict())))
    assert result["checkpoint_uri"].endswith("/attempt-1/checkpoint_000001")
    assert ctx["task_state_store"][XCOM_LOG_CURSOR] == {"submission_id": sid, "lines": 3}
    assert ctx["ti"].xcoms[XCOM_CHECKPOINT_URI] == result["checkpoint_uri"]
    assert RayJobLink().get_link(resumed, ti_key=None) == result["dashboard_url"]


@pytest.mark.parametrize("given", ["soon", "-5"])
def test_a_bad_defer_after_seconds_fails_the_task_before_anything_is_submitted(serve, tmp_path, monkeypatch, given):
    monkeypatch.setenv("AIRFLOW__HOROVOD__DEFER_AFTER_SECONDS", given)
    ray = FakeRay(on_submit=cluster_that_trains())
    serve(ray)
    with pytest.raises(InvalidParameterError, match=r"\[horovod\] defer_after_seconds") as raised:
        operator(storage_path=str(tmp_path)).execute(context())
    assert given in str(raised.value)
    assert ray.submitted == []


def test_a_deferrable_task_whose_job_ends_in_its_first_seconds_never_defers(serve, tmp_path):
    ray = FakeRay(on_submit=cluster_that_trains())
    serve(ray)
    op = operator(storage_path=str(tmp_path), poll_interval_seconds=0.001)
    assert op.deferrable is True  # the default
    result = op.execute(context())  # no TaskDeferred: finished in the worker
    assert result["attempt"] == 1
    assert result["checkpoint_uri"].endswith("/attempt-1/checkpoint_000001")


@pytest.mark.parametrize("limit", [{"max_active_tis_per_dag": 1}, {"max_active_tis_per_dagrun": 2}])
def test_a_deferrable_task_under_a_task_level_limit_waits_in_its_worker(serve, tmp_path, monkeypatch, limit):
    # A task-level limit counts deferred task instances, and a resume must win a slot again: a waiting
    # task instance of another run could take it first, so the finished training would wait a whole one.
    monkeypatch.setattr(BaseRayJobOperator, "sync_wait_before_defer_s", 0.0)  # else it defers at once
    ray = FakeRay(on_submit=runs_until_told())
    serve(ray, "my_ray")
    op = train_op(tmp_path, deferrable=True, ray_conn_id="my_ray", **limit)
    assert op.slot_limit() == "{}={}".format(*next(iter(limit.items())))

    def job_ends():
        while not ray.submitted:
            time.sleep(0.01)
        write_result(ray.submitted[0])
        sid = ray.submitted[0]["submission_id"]
        ray.set_job(sid, {"status": "SUCCEEDED", "metadata": ray.submitted[0]["metadata"]})

    ender = threading.Timer(0.5, job_ends)
    ender.start()
    try:
        result = op.execute(context())  # no TaskDeferred: the job's end is seen here
    finally:
        ender.join()
    assert result["checkpoint_uri"].endswith("/attempt-1/checkpoint_000001")
    assert train_op(tmp_path, deferrable=True).slot_limit() is None


def test_the_link_of_a_task_that_failed_before_its_job_reads_no_xcom(monkeypatch):
    from airflow.sdk.bases.xcom import BaseXCom

    def no_xcom(**kwargs):
        raise AssertionError("the link read an XCom that was never pushed")

    monkeypatch.setattr(BaseXCom, "get_value", staticmethod(no_xcom))
    assert RayJobLink().get_link(operator(), ti_key=None) == ""


def test_pending_too_long_stops_the_job_and_fails(serve, tmp_path):
    def stays_pending(ray, call):
        ray.set_job(
            call["submission_id"],
            {"status": "PENDING", "metadata": call["metadata"], "start_time": (time.time() - 60) * 1000},
        )

    ray = FakeRay(on_submit=stays_pending, cluster={"CPU": 1.0})
    serve(ray)
    op = train_op(tmp_path, num_workers=4, pending_timeout_seconds=5)
    with pytest.raises(RayJobError) as err:
        op.execute(context())
    message = str(err.value)
    assert "stayed PENDING for 60 s" in message
    assert 'ask for {"CPU": 4.0}' in message
    assert 'the cluster has {"CPU": 1.0}' in message
    assert ray.stopped == [TASK_RUN.submission_id(1)]


def test_a_killed_task_stops_its_job(serve, tmp_path):
    def runs_forever(ray, call):
        ray.set_job(call["submission_id"], {"status": "RUNNING", "metadata": call["metadata"]})

    ray = FakeRay(on_submit=runs_forever)
    serve(ray)
    op = train_op(tmp_path)
    outcome = {}

    def run():
        try:
            op.execute(context())
        except Exception as err:
            outcome["error"] = err

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.time() + 10
    while op.submission_id is None and time.time() < deadline:
        time.sleep(0.01)
    op.on_kill()
    worker.join(10)
    assert not worker.is_alive()
    assert isinstance(outcome.get("error"), RayJobError)
    assert "Task killed" in str(outcome["error"])
    assert ray.stopped == [TASK_RUN.submission_id(1)]


def test_a_killed_task_keeps_its_attempts_record_with_the_s3_client_it_already_has(serve, s3, monkeypatch):
    """Airflow SIGKILLs a task 5 s after its SIGTERM: at a high load a new S3 client (the connection read,
    boto3's session and client) did not fit in that time beside the stop, and the attempt lost its record."""
    made = []
    monkeypatch.setattr(
        Storage, "_client", lambda self, config, real=Storage._client: made.append(config) or real(self, config)
    )
    ray = FakeRay(
        on_submit=lambda ray, call: ray.set_job(
            call["submission_id"], {"status": "PENDING", "metadata": call["metadata"]}
        )
    )
    serve(ray)
    op = operator(storage_path=f"s3://{s3.bucket()}/runs", poll_interval_seconds=0.001, deferrable=False)
    worker = threading.Thread(target=lambda: pytest.raises(RayJobError, op.execute, context()))
    worker.start()
    deadline = time.time() + 10
    while op.submission_id is None and time.time() < deadline:
        time.sleep(0.01)
    clients = len(made)
    op.on_kill()
    worker.join(10)
    assert len(made) == clients  # the kill made no S3 client of its own
    record = Storage().read_json(ray.get_job_info(op.submission_id)["metadata"]["ahp_result_uri"])
    assert "while PENDING" in record["failure"]["summary"]


def test_a_task_killed_while_its_job_is_being_submitted_stops_that_job(serve, tmp_path):
    """Airflow's SIGTERM handler runs on_kill and lets execute go on: a kill that lands while the job is
    being submitted finds no job to stop yet; the job that submission makes must not outlive the task."""
    op = train_op(tmp_path)

    def killed_meanwhile(ray, call):
        ray.set_job(call["submission_id"], {"status": "RUNNING", "metadata": call["metadata"]})
        op.on_kill()  # the submission is on its way: no submission id on the operator yet

    ray = FakeRay(on_submit=killed_meanwhile)
    serve(ray)
    with pytest.raises(TaskKilledError, match="the job was stopped"):
        op.execute(context())
    assert [call["submission_id"] for call in ray.submitted] == [TASK_RUN.submission_id(1)]
    assert ray.stopped == [TASK_RUN.submission_id(1)]


@pytest.mark.parametrize("deferrable", [False, True])
def test_a_dashboard_lost_while_waiting_fails_as_infrastructure_as_a_deferred_wait_does(
    serve, tmp_path, monkeypatch, deferrable
):
    """The Ray head replaced mid-training: past the hook's retries the worker's wait fails with the class
    the trigger gives the same error (infrastructure, retried), not with the bare RayClusterUnreachableError."""

    def runs(ray, call):
        ray.set_job(call["submission_id"], {"status": "RUNNING", "metadata": call["metadata"]})

    serve(FakeRay(on_submit=runs))
    op = train_op(tmp_path, deferrable=deferrable)

    async def gone(self, submission_id, fresh_within_s=None):
        raise RayClusterUnreachableError("The Ray dashboard at http://ray-head:8265 did not answer after 6 tries")

    monkeypatch.setattr(RayHook, "a_get_job_info", gone)
    with pytest.raises(InfrastructureError, match="did not answer after 6 tries") as err:
        op.execute(context())
    assert err.value.failure["failure_class"] == "infrastructure"


def test_on_kill_before_a_job_exists_does_nothing(serve):
    dashboard = serve(FakeRay())
    op = operator()
    op.on_kill()
    assert dashboard.requests == []
    assert "hook" not in op.__dict__


def test_a_missing_aws_connection_fails_before_submitting(serve, tmp_path, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_AWS_NOPE", raising=False)
    dashboard = serve(FakeRay())
    op = train_op(tmp_path, aws_conn_id="aws_nope")
    with pytest.raises(InvalidParameterError, match="create it \\(type aws\\)"):
        op.execute(context())
    assert dashboard.requests == []
