"""HorovodTrainOperator: every bad input fails in execute() before the cluster is asked anything,
naming the parameter, the value and the fix; good input becomes a plan and a Ray request; and the
whole task run (submit, wait, finish, retry) through the real RayHook against a stand-in for the
Ray dashboard served over HTTP (``unit.fakes.Dashboard``, the ``serve`` fixture).

``BAD_INPUTS`` and ``GOOD_FN`` are also used by the integration tests (against a real cluster).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import cloudpickle
import pytest
from airflow.providers.common.compat.sdk import AirflowFailException

from airflow_provider_horovod import checks, functions, plan
from airflow_provider_horovod.contract import (
    RESUME_GUARD_S,
    SPEC_FILE,
    XCOM_CHECKPOINT_URI,
    XCOM_JOB,
    XCOM_LOG_CURSOR,
    XCOM_SUBMISSION_ID,
    TaskRun,
    attempt_uri,
)
from airflow_provider_horovod.documents import ResultRecord, TrainingSpec
from airflow_provider_horovod.exceptions import (
    InfrastructureError,
    InvalidParameterError,
    RayClusterUnreachableError,
    RayJobError,
    RayJobPendingTimeoutError,
    TaskKilledError,
    UserCodeError,
)
from airflow_provider_horovod.failures import Failure, FailureClass
from airflow_provider_horovod.hooks.ray import RayHook
from airflow_provider_horovod.jobs.events import JobEvent
from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.links.ray import RayJobLink
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import BaseRayJobOperator
from airflow_provider_horovod.storage import Storage
from unit.fakes import RUN_ID, FakeRay, Store, as_runtime_prints, context

GOOD_FN = "airflow_provider_horovod.examples.quickstart:train_func"


def operator(**kwargs) -> HorovodTrainOperator:
    kwargs.setdefault("train_fn", GOOD_FN)
    kwargs.setdefault("storage_path", "/tmp/ahp-unit")
    return HorovodTrainOperator(task_id="train", **kwargs)


def local_train(config):
    return config


class Unpicklable:
    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self, config):
        return self.lock


BAD_INPUTS = [
    ({"num_workers": 0}, "num_workers", "1 or more"),
    ({"num_workers": "two"}, "num_workers", "whole number"),
    ({"num_workers": (4, 2)}, "num_workers", "at most max 2"),
    ({"num_workers": [0, 2]}, "num_workers", "at least 1"),
    ({"num_workers": (2, 4), "trainer_api": "legacy"}, "num_workers", "no elastic training"),
    (
        {"num_workers": (2, 4), "elastic_resize_monitor_interval_s": 0},
        "elastic_resize_monitor_interval_s",
        "greater than 0",
    ),
    ({"num_workers": True}, "num_workers", "whole number"),
    ({"train_fn": "no_such_module_xyz:train"}, "train_fn", "not importable"),
    ({"train_fn": "not a path"}, "train_fn", "package.module:function"),
    ({"train_fn": 42}, "train_fn", "give a function"),
    ({"train_fn": Unpicklable()}, "train_fn", "cannot be pickled"),
    ({"train_fn": lambda a, b: None}, "train_fn", "no argument or one"),
    ({"datasets": {"train": 5}}, "datasets['train']", "URI of parquet"),
    ({"datasets": {"train": "ftp://host/x.parquet"}}, "datasets['train']", "s3://"),
    ({"datasets": ["s3://b/x"]}, "datasets", "give a dict"),
    ({"datasets": {"bad name": "s3://b/x"}}, "datasets", "simple name"),
    ({"storage_path": "gs://bucket/x"}, "storage_path", "not supported"),
    ({"storage_path": "s3:///nobucket"}, "storage_path", "name the bucket"),
    ({"storage_path": "relative/dir"}, "storage_path", "absolute"),
    ({"train_loop_config": {"model": object()}}, "train_loop_config", "JSON-serialisable"),
    ({"train_loop_config": [1, 2]}, "train_loop_config", "give a dict"),
    ({"resources_per_worker": {"CPU": -1}}, "resources_per_worker", "negative"),
    ({"resources_per_worker": {"CPU": "one"}}, "resources_per_worker", "not a number"),
    ({"resources_per_worker": {"gpu": 1}, "use_gpu": True}, "resources_per_worker", "'GPU'"),
    ({"resources_per_worker": {"GPU": 1}}, "resources_per_worker", "use_gpu=True"),
    ({"checkpoint_score_order": "best"}, "checkpoint_score_order", "'max'"),
    ({"checkpoint_num_to_keep": 0}, "checkpoint_num_to_keep", "greater than 0"),
    ({"max_failures": -3}, "max_failures", "-1"),
    ({"horovod_env": {"OMP_NUM_THREADS": "1"}}, "horovod_env", "HOROVOD_"),
    ({"horovod_timeout_s": 0}, "horovod_timeout_s", "greater than 0"),
    ({"horovod_nics": [""]}, "horovod_nics", "interface names"),
    ({"runtime_env": {"env_vars": {"AWS_SECRET_ACCESS_KEY": "abc"}}}, "runtime_env", "looks like a secret"),
    ({"runtime_env": "pip"}, "runtime_env", "give a dict"),
    ({"trainer_api": "v3"}, "trainer_api", "'legacy'"),
    ({"poll_interval_seconds": 0}, "poll_interval_seconds", "greater than 0"),
    ({"pending_timeout_seconds": -5}, "pending_timeout_seconds", "greater than 0"),
]

# Cases that need no cluster either, beyond the table the integration tests share.
MORE_BAD_INPUTS = [
    ({"use_gpu": "yes"}, "use_gpu", "True or False"),
    ({"ray_conn_id": ""}, "ray_conn_id", "'ray_default'"),
    ({"deferrable": "false"}, "deferrable", "True or False"),
    ({"wait_for_completion": None}, "wait_for_completion", "True or False"),
    ({"check_cluster_resources": "no"}, "check_cluster_resources", "True or False"),
    ({"forward_aws_credentials": True}, "forward_aws_credentials", "set aws_conn_id"),
    ({"runtime_env": {"pips": ["pandas"]}}, "runtime_env", "unknown field 'pips'"),
    ({"runtime_env": {"working_dir": "/no/such/dir"}}, "runtime_env", "is not a folder here"),
    ({"datasets": {"train": "no_such_module_xyz:make"}}, "datasets['train']", "not importable"),
    ({"train_fn": f"{GOOD_FN[: -len('train_func')]}trian_func"}, "train_fn", "(it has train_func"),
    ({"mlflow_tracking_uri": "mlflow:5000"}, "mlflow_tracking_uri", "http://mlflow:5000"),
    ({"mlflow_tracking_uri": "http://mlflow:5000", "mlflow_conn_id": "mlflow_default"}, "mlflow_conn_id", "not both"),
    (
        {"mlflow_tracking_uri": "http://mlflow:5000", "mlflow_experiment_name": " "},
        "mlflow_experiment_name",
        "MLflow experiment",
    ),
]


def given(kwargs: dict, parameter: str):
    """The value as the error shows it: env var values hidden."""
    if parameter.startswith("datasets["):
        return kwargs["datasets"][parameter[len("datasets['") : -2]]
    value = kwargs.get(parameter)
    if parameter == "runtime_env" and isinstance(value, dict) and isinstance(value.get("env_vars"), dict):
        return {**value, "env_vars": {k: "***" for k in value["env_vars"]}}
    return value


@pytest.mark.parametrize(
    "kwargs, parameter, fix",
    BAD_INPUTS + MORE_BAD_INPUTS,
    ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD_INPUTS + MORE_BAD_INPUTS)],
)
def test_bad_input_fails_in_execute_before_any_cluster_call(serve, kwargs, parameter, fix):
    dashboard = serve(FakeRay())
    op = operator(**kwargs)
    ctx = context()
    with pytest.raises(InvalidParameterError) as err:
        op.execute(ctx)
    assert err.value.parameter == parameter
    message = str(err.value)
    assert message.startswith(f"Invalid {parameter}={given(kwargs, parameter)!r}: ") and fix in message
    assert op.submission_id is None and ctx["ti"].xcoms == {} and dashboard.requests == []


def test_secret_values_are_not_echoed_in_the_error(serve):
    dashboard = serve(FakeRay())
    op = operator(runtime_env={"env_vars": {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}})
    with pytest.raises(InvalidParameterError) as err:
        op.execute(context())
    assert "s3cr3t-value" not in str(err.value) and dashboard.requests == []


def test_the_constructor_does_no_work(monkeypatch):
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
    monkeypatch.setattr(HorovodTrainOperator, "plan", tripwire)
    monkeypatch.setattr(BaseRayJobOperator, "checked_plan", tripwire)
    monkeypatch.setattr(BaseRayJobOperator, "wait_policy", tripwire)
    op = HorovodTrainOperator(
        task_id="train",
        train_fn="x",
        num_workers=-1,
        storage_path="ftp://x",
        use_gpu="yes",
        runtime_env={"pips": 1},
        datasets=5,
        ray_conn_id="",
        poll_interval_seconds=-1,
    )
    assert (op.train_fn, op.num_workers, op.storage_path, op.datasets, op.ray_conn_id) == ("x", -1, "ftp://x", 5, "")
    assert "hook" not in op.__dict__


def test_template_fields():
    # Its own templated parameters and those it shares with every operator of the provider.
    assert set(HorovodTrainOperator.template_fields) == {
        "train_script",
        "script_args",
        "train_loop_config",
        "datasets",
        "num_workers",
        "horovod_env",
        "mlflow_tracking_uri",
        "mlflow_conn_id",
        "mlflow_experiment_name",
        "ray_conn_id",
        "storage_path",
        "aws_conn_id",
        "job_tags",
        "runtime_env",
    }
    assert HorovodTrainOperator.template_fields_renderers == {
        "train_loop_config": "json",
        "horovod_env": "json",
        "runtime_env": "json",
    }
    op = operator(
        storage_path="s3://b/{{ params.env }}",
        train_loop_config={"lr": "{{ params.lr }}"},
        datasets={"train": "s3://b/{{ params.env }}/train/"},
        ray_conn_id="ray_{{ params.env }}",
    )
    op.render_template_fields({"params": {"env": "prod", "lr": 0.1}})
    assert op.storage_path == "s3://b/prod" and op.train_loop_config == {"lr": "0.1"}
    assert op.datasets == {"train": "s3://b/prod/train/"} and op.ray_conn_id == "ray_prod"
    assert RayJobLink in {type(link) for link in HorovodTrainOperator.operator_extra_links}


# --- plan() and the requests it makes: pure -------------------------------------------------------

TASK_RUN = TaskRun("dag", "train", RUN_ID)


def make_dataset():
    return None


def planned(op: HorovodTrainOperator):
    return op.checked_plan(TASK_RUN, op.wait_policy())


def test_plan_builds_the_spec():
    training = planned(
        operator(
            train_fn=local_train,
            train_loop_config={"lr": 0.1},
            num_workers=3,
            use_gpu=True,
            resources_per_worker={"CPU": 2},
            pending_timeout_seconds=30,
            datasets={
                "train": "s3://b/train/",
                "val": "/data/v.csv",
                "test": "file:///t.json",
                "built": make_dataset,
                "imported": "airflow_provider_horovod.examples.quickstart:make_dataset",
            },
        )
    )
    spec = training.spec
    assert spec.python_version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert spec.submission_id == TASK_RUN.submission_id(1) and spec.attempt == 1
    assert spec.storage_uri == TASK_RUN.storage_uri("/tmp/ahp-unit")
    assert spec.train_fn == {"pickle": "train_fn.pkl", "source": __file__} and spec.train_loop_config == {"lr": 0.1}
    assert spec.datasets == {
        "train": {"uri": "s3://b/train/", "format": "parquet"},
        "val": {"uri": "/data/v.csv", "format": "csv"},
        "test": {"uri": "file:///t.json", "format": "json"},
        "built": {"pickle": "dataset_built.pkl", "source": __file__},
        "imported": {"import": "airflow_provider_horovod.examples.quickstart:make_dataset"},
    }
    assert set(training.files) == {"train_fn.pkl", "dataset_built.pkl"}
    assert (spec.num_workers, spec.use_gpu, spec.resources_per_worker) == (3, True, {"CPU": 2.0})
    assert spec.pending_timeout_s == 30 and training.runtime_env == {}
    assert TrainingSpec.from_json(spec.to_json()) == spec


def test_an_elastic_range_plans_with_its_minimum():
    training = planned(
        operator(num_workers=(2, 4), resources_per_worker={"CPU": 2}, elastic_resize_monitor_interval_s=5)
    )
    spec = training.spec
    assert (spec.num_workers, spec.min_workers, spec.max_workers, spec.elastic) == ([2, 4], 2, 4, True)
    assert spec.elastic_resize_monitor_interval_s == 5
    # The resource check and the unschedulable message count what the run needs to start.
    assert training.resources == {"CPU": 4.0}
    assert training.request(1).metadata["ahp_num_workers"] == "2-4"
    assert TrainingSpec.from_json(spec.to_json()) == spec


def test_a_templated_range_renders_to_the_same_plan():
    op = operator(num_workers="{{ params.workers }}")
    op.render_template_fields({"params": {"workers": [2, 4]}})
    assert planned(op).spec.num_workers == [2, 4]


def test_a_callable_travels_by_value(monkeypatch):
    training = planned(operator(train_fn=local_train))
    monkeypatch.setitem(sys.modules, __name__, None)
    assert cloudpickle.loads(training.files["train_fn.pkl"])({"x": 1}) == {"x": 1}


def test_an_import_path_is_not_looked_up_when_the_runtime_env_brings_code(tmp_path):
    op = operator(train_fn="code_on_the_cluster:train", runtime_env={"py_modules": [str(tmp_path)]})
    training = planned(op)
    assert training.spec.train_fn == {"import": "code_on_the_cluster:train"}
    assert training.runtime_env == {"py_modules": [str(tmp_path)]}


def test_storage_defaults_to_airflow_home_and_is_normalised(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert planned(operator(storage_path=None)).spec.storage_uri.startswith(
        str(tmp_path / "horovod-storage") + "/dag/train/"
    )
    assert planned(operator(storage_path="file:///data/x/")).spec.storage_uri.startswith("/data/x/dag/")


def test_request_of_a_later_attempt_resumes_from_the_earlier_ones():
    training = planned(operator())
    first = training.request(1, resume=False)
    second = training.request(2, resume=True)
    third = training.request(3, resume=True)
    fresh = training.request(3, resume=False)

    def spec_of(made):
        return TrainingSpec.from_json(made.files[SPEC_FILE].decode())

    root = training.spec.storage_uri
    assert spec_of(first).resume_from == [] and spec_of(fresh).resume_from == []
    assert spec_of(second).resume_from == [attempt_uri(root, 1)]
    assert spec_of(third).resume_from == [attempt_uri(root, 2), attempt_uri(root, 1)]
    assert (second.submission_id, spec_of(second).attempt) == (TASK_RUN.submission_id(2), 2)
    assert spec_of(second).run_uri == f"{root}/attempt-2"


def test_extra_files_travel_in_the_payload_only():
    made = planned(operator()).request(1, extra_files={"aws_session.json": b'{"k": "v"}'})
    assert made.files["aws_session.json"] == b'{"k": "v"}'
    assert "aws_session" not in json.dumps(made.runtime_env) + json.dumps(made.metadata)


# --- where the storage is ------------------------------------------------------------------------


def test_a_local_storage_path_needs_a_shared_filesystem(serve):
    dashboard = serve(FakeRay(), "ray_remote", shared_storage=False)
    op = operator(storage_path="/data/checkpoints", ray_conn_id="ray_remote")
    with pytest.raises(InvalidParameterError) as err:
        op.execute(context())
    message = str(err.value)
    assert err.value.parameter == "storage_path" and message.startswith("Invalid storage_path='/data/checkpoints': ")
    assert "connection 'ray_remote'" in message and '{"shared_storage": true}' in message
    assert "s3://bucket/prefix" in message
    assert not any(path.startswith("/api/jobs") for _, path in dashboard.requests)  # nothing asked of the jobs


@pytest.mark.parametrize("storage_path, shared", [("/data/checkpoints", True), ("s3://bucket/prefix", False)])
def test_shared_or_s3_storage_passes_that_check(serve, storage_path, shared, monkeypatch):
    # No S3 here (test_storage.py has moto): the storage answers that no attempt was submitted yet.
    monkeypatch.setattr(Storage, "check_bucket", lambda self, uri: None)
    monkeypatch.setattr(Storage, "exists", lambda self, uri: False)
    dashboard = serve(FakeRay(cluster={}), shared_storage=shared)
    op = operator(storage_path=storage_path)
    with pytest.raises(RayJobPendingTimeoutError):  # the next check: the cluster has no CPU at all
        op.execute(context())
    assert ("GET", f"/api/jobs/{TASK_RUN.submission_id(1)}") in dashboard.requests


# --- a whole task run against the stand-in dashboard, through the real hook -------------------------


def cluster_that_trains(*, ends="SUCCEEDED", log=("epoch 0", "epoch 1", "done"), exit_code=1):
    """Plays the Ray job of a submission: two polls RUNNING, then ``ends``; on success it leaves a
    checkpoint and the result record where the runtime would."""

    def on_submit(ray: FakeRay, call: dict):
        spec = TrainingSpec.from_json(call["payload"][SPEC_FILE].decode())
        if ends == "SUCCEEDED":
            write_result(call)
        meta = call["metadata"]
        ray.set_job(
            spec.submission_id,
            {"status": "RUNNING", "metadata": meta},
            {"status": "RUNNING", "metadata": meta},
            {
                "status": ends,
                "metadata": meta,
                "message": f"job {ends.lower()}",
                "error_type": None if ends == "SUCCEEDED" else "JOB_ENTRYPOINT_COMMAND_ERROR",
                "driver_exit_code": 0 if ends == "SUCCEEDED" else exit_code,
            },
        )
        text = as_runtime_prints("".join(f"{line}\n" for line in log), spec.mark_token)
        ray.logs[spec.submission_id] = [text[: len(text) // 2], text]

    return on_submit


def write_result(call: dict) -> None:
    """The checkpoint and the result record the runtime would leave for a submitted training."""
    spec = TrainingSpec.from_json(call["payload"][SPEC_FILE].decode())
    checkpoint = f"{spec.run_uri}/checkpoint_000001"
    os.makedirs(checkpoint)
    with open(f"{checkpoint}/model.pt", "wb") as f:
        f.write(b"weights")
    record = ResultRecord(
        submission_id=spec.submission_id,
        attempt=spec.attempt,
        storage_uri=spec.storage_uri,
        run_uri=spec.run_uri,
        checkpoint_uri=checkpoint,
        best_checkpoint_uri=None,
        metrics={"loss": 0.1},
        world_size=spec.num_workers,
        trainer_api=spec.trainer_api,
        resumed_from=spec.resume_from[0] if spec.resume_from else None,
    )
    Storage().write_bytes(spec.result_uri, record.to_json().encode())


def train_op(tmp_path, **kwargs):
    kwargs.setdefault("deferrable", False)
    return operator(storage_path=str(tmp_path), poll_interval_seconds=0.001, **kwargs)


@pytest.fixture
def url(serve):
    """The dashboard's job URL of a submission, once ``serve`` served a FakeRay."""
    return lambda dashboard, sid: f"{dashboard.url}/#/jobs/{sid}"


def test_a_task_run_trains_and_returns_the_verified_checkpoint(serve, tmp_path, capsys):
    ray = FakeRay(on_submit=cluster_that_trains())
    dashboard = serve(ray)
    op = train_op(tmp_path, num_workers=3)
    ctx = {**context(), "task_state_store": Store()}
    result = op.execute(ctx)
    sid = TASK_RUN.submission_id(1)
    (call,) = ray.submitted
    assert call["submission_id"] == sid and call["entrypoint"].startswith("python -m airflow_provider_horovod.")
    assert result["submission_id"] == sid and result["attempt"] == 1 and result["world_size"] == 3
    assert result["checkpoint_uri"] == f"{TASK_RUN.storage_uri(str(tmp_path))}/attempt-1/checkpoint_000001"
    assert result["dashboard_url"] == f"{dashboard.url}/#/jobs/{sid}" and result["metrics"] == {"loss": 0.1}
    xcoms = ctx["ti"].xcoms
    assert xcoms[XCOM_SUBMISSION_ID] == sid and xcoms[XCOM_CHECKPOINT_URI] == result["checkpoint_uri"]
    assert xcoms[RayJobLink().xcom_key] == f"{dashboard.url}/#/jobs/{sid}"
    saved = LogCursor.from_dict(ctx["task_state_store"][XCOM_LOG_CURSOR], sid)
    assert (saved.lines, saved.tail) == (3, LogCursor(sid).advanced(["epoch 0", "epoch 1", "done"]).tail)
    out = capsys.readouterr().out
    assert [out.count(f"[ray] {line}") for line in ("epoch 0", "epoch 1", "done")] == [1, 1, 1]
    assert op.submission_id == sid and xcoms[XCOM_JOB] == {
        "submission_id": sid,
        "dashboard_url": result["dashboard_url"],
        "attempt": 1,
        "kind": "train",
        "storage_uri": TASK_RUN.storage_uri(str(tmp_path)),
        "checkpoint_score_attribute": None,
        "aws_conn_id": None,
        "job_tags": {},
    }
    # The worker's wait reads windows of the log's end (the State API), never the whole log.
    paths = [path for _, path in dashboard.requests]
    assert any(path.startswith("/api/v0/logs/file?") for path in paths)
    assert not any(path.endswith("/logs") for path in paths)


def test_clearing_a_succeeded_task_trains_again(serve, tmp_path):
    ray = FakeRay(on_submit=cluster_that_trains())
    serve(ray)
    first = train_op(tmp_path)
    assert first.execute(context())["attempt"] == 1
    again = train_op(tmp_path)
    result = again.execute(context(try_number=2))
    assert result["attempt"] == 2 and result["resumed_from"] is None
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
    assert "[ray] shutdown" in out and "[ray] epoch" not in out and "[ray] done" not in out
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
    assert ctx["ti"].xcoms[XCOM_SUBMISSION_ID] == sid and "get_job_logs" not in ray.calls


def runs_until_told(log=("epoch 0", "epoch 1")):
    """A job that prints ``log`` and goes on RUNNING until the test moves it on."""

    def on_submit(ray: FakeRay, call: dict):
        ray.set_job(call["submission_id"], {"status": "RUNNING", "metadata": call["metadata"]})
        ray.logs[call["submission_id"]] = ["".join(f"{line}\n" for line in log)]

    return on_submit


def test_deferred_the_trigger_gets_the_job_and_the_cursor_after_a_short_wait_here(serve, tmp_path, monkeypatch):
    from airflow.sdk.exceptions import TaskDeferred

    monkeypatch.setattr(BaseRayJobOperator, "sync_wait_before_defer_s", 0.3)
    ray = FakeRay(on_submit=runs_until_told(("epoch 0", "epoch 1", "epoch 2")))
    serve(ray, "my_ray")
    op = train_op(tmp_path, deferrable=True, pending_timeout_seconds=45, ray_conn_id="my_ray")
    sid = TASK_RUN.submission_id(1)
    earlier = LogCursor(sid).advanced(["epoch 0", "epoch 1"])  # streamed by an earlier try
    ctx = {**context(), "task_state_store": Store({XCOM_LOG_CURSOR: earlier.to_dict()})}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
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


def test_a_deferrable_task_whose_job_ends_in_its_first_seconds_never_defers(serve, tmp_path):
    ray = FakeRay(on_submit=cluster_that_trains())
    serve(ray)
    op = operator(storage_path=str(tmp_path), poll_interval_seconds=0.001)
    assert op.deferrable is True  # the default
    result = op.execute(context())  # no TaskDeferred: finished in the worker
    assert result["attempt"] == 1 and result["checkpoint_uri"].endswith("/attempt-1/checkpoint_000001")


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


def test_resources_no_node_has_fail_before_submitting(serve, tmp_path):
    ray = FakeRay(cluster={"CPU": 8.0, "memory": 1e9})
    serve(ray)
    op = train_op(tmp_path, use_gpu=True, num_workers=2)
    with pytest.raises(RayJobPendingTimeoutError) as err:
        op.execute(context())
    assert 'ask for {"GPU": 2.0}' in str(err.value) and "none of ['GPU']" in str(err.value)
    assert "check_cluster_resources=False" in str(err.value) and ray.submitted == []

    autoscaling = train_op(tmp_path, use_gpu=True, check_cluster_resources=False, wait_for_completion=False)
    autoscaling.execute(context())
    assert len(ray.submitted) == 1


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
    assert "stayed PENDING for 60 s" in message and 'ask for {"CPU": 4.0}' in message
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
    assert isinstance(outcome.get("error"), RayJobError) and "Task killed" in str(outcome["error"])
    assert ray.stopped == [TASK_RUN.submission_id(1)]


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
    assert dashboard.requests == [] and "hook" not in op.__dict__


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
    assert session["aws_session_token"] and session["endpoint_url"] == s3.endpoint_url
    visible = json.dumps(call["runtime_env"]) + json.dumps(call["metadata"]) + call["entrypoint"]
    assert session["aws_secret_access_key"] not in visible and session["aws_session_token"] not in visible
    assert "long-lived-secret" not in json.dumps({k: v.decode("latin-1") for k, v in call["payload"].items()})


def test_a_missing_aws_connection_fails_before_submitting(serve, tmp_path, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_AWS_NOPE", raising=False)
    dashboard = serve(FakeRay())
    op = train_op(tmp_path, aws_conn_id="aws_nope")
    with pytest.raises(InvalidParameterError, match="create it \\(type aws\\)"):
        op.execute(context())
    assert dashboard.requests == []
