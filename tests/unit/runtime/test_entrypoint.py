"""Every job's entrypoint: the payload written by the Airflow side read, the checks before anything
runs (the cluster's Ray, pickled code's Python), a task's function run and its JSON value in the
attempt's record, and a failure's one AHP_ERROR line (its chain of causes, a hint when a worker died)."""

import json
import os
import signal
import sys

import pytest

from airflow_provider_horovod import failures
from airflow_provider_horovod.contract import META_ATTEMPT, META_RESULT_URI, META_STORAGE_URI, TaskRun
from airflow_provider_horovod.documents import ResultRecord, TaskRecord, TaskSpec, TrainingSpec
from airflow_provider_horovod.failures import FailureClass
from airflow_provider_horovod.plan import task_plan
from airflow_provider_horovod.runtime import entrypoint

HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


# --- a task job, end to end -------------------------------------------------------------------------


def run_payload(tmp_path, monkeypatch, function, args=(), kwargs=None):
    # RayTaskOperator's parameters as its plan gets them, each checked (the cluster side has no operator).
    given = {
        "python_callable": function,
        "op_args": list(args),
        "op_kwargs": kwargs or {},
        "num_cpus": 1,
        "num_gpus": None,
        "memory": None,
        "resources": None,
        "runtime_env": {},
        "storage_path": str(tmp_path / "storage"),
        "ray_conn_id": "ray_default",
        "job_tags": {},
        "prices": None,
    }
    plan = task_plan(TaskRun("d", "t", "r"), given)
    request = plan.request(1)
    parent = tmp_path / "payload"
    request.write_payload(str(parent))
    monkeypatch.syspath_prepend(str(parent))
    kind, module = request.entrypoint.split()[-2:]
    return plan.spec, entrypoint.main([kind, module])


def test_the_function_runs_with_its_arguments_and_its_value_lands_in_the_record(tmp_path, monkeypatch, capsys):
    spec, code = run_payload(tmp_path, monkeypatch, "json:dumps", args=[{"b": 1, "a": 2}], kwargs={"sort_keys": True})
    assert code == 0
    record = TaskRecord.from_json(open(spec.result_uri).read())
    assert record.return_value == '{"a": 2, "b": 1}'
    assert record.attempt == 1
    out = capsys.readouterr().out
    assert f"result: {spec.result_uri}" in out
    assert "AHP_RESULT " in out


def test_a_pickled_function_runs(tmp_path, monkeypatch):
    spec, code = run_payload(tmp_path, monkeypatch, lambda x: {"twice": 2 * x}, args=[21])
    assert code == 0
    assert TaskRecord.from_json(open(spec.result_uri).read()).return_value == {"twice": 42}


@pytest.mark.parametrize(
    "function, fragment",
    [
        ("os:getcwd", None),
        ("builtins:object", "returned a object, which XCom cannot hold as JSON"),
        ("math:sqrt", "ValueError: math domain error"),
    ],
)
def test_failures_end_the_job_with_one_line_saying_why(tmp_path, monkeypatch, capsys, function, fragment):
    args = [-1] if function == "math:sqrt" else []
    spec, code = run_payload(tmp_path, monkeypatch, function, args=args)
    out = capsys.readouterr().out
    if fragment is None:
        assert code == 0
        assert json.loads(open(spec.result_uri).read())["return_value"]
        return
    assert code == 1
    assert "AHP_ERROR" in out
    assert fragment in out
    assert TaskRecord.from_json(open(spec.result_uri).read()).failure  # the failed attempt's record


def test_a_wrong_command_line_says_how_to_call_it(capsys):
    assert entrypoint.main(["evaluate", "ahp_payload_x"]) == 2
    assert "train|task <payload module>" in capsys.readouterr().err


# --- before anything runs ---------------------------------------------------------------------------


def test_this_clusters_ray_runs_a_task_and_a_training_with_the_api_it_chose(capsys):
    task = TaskSpec(submission_id="s", function={"import": "m:f"}, storage_uri="/x", python_version=HERE)
    assert entrypoint.preflight(task) == (task, None)
    training = TrainingSpec(submission_id="s", train_fn={"import": "m:f"}, storage_uri="/x", python_version=HERE)
    chosen, problem = entrypoint.preflight(training)
    assert problem is None
    assert training.trainer_api == "auto"
    assert chosen.trainer_api in ("v2", "legacy")
    assert f"Trainer API: {chosen.trainer_api} (trainer_api='auto': " in capsys.readouterr().out


@pytest.mark.parametrize("version", ["2.49.2", "1.13.0"])
def test_a_ray_older_than_the_range_fails_naming_it_the_range_and_the_fix(monkeypatch, version):
    import ray

    monkeypatch.setattr(ray, "__version__", version)
    for spec in (
        TaskSpec(submission_id="s", function={"import": "m:f"}, storage_uri="/x", python_version=HERE),
        TrainingSpec(submission_id="s", train_fn={"import": "m:f"}, storage_uri="/x", python_version=HERE),
    ):
        _, message = entrypoint.preflight(spec)
        assert message
        assert f"Ray {version}" in message
        assert "tested: 2.50 to 2.60" in message
        assert "ray[default,train]>=2.50" in message


def test_a_newer_ray_runs_a_task_with_a_warning(monkeypatch, capsys):
    import ray

    monkeypatch.setattr(ray, "__version__", "2.61.0")
    spec = TaskSpec(submission_id="s", function={"import": "m:f"}, storage_uri="/x", python_version=HERE)
    assert entrypoint.preflight(spec) == (spec, None)
    assert "WARNING: Ray 2.61.0 is newer than the minors" in capsys.readouterr().out


def test_pickled_code_from_another_python_fails_naming_the_parameter_both_versions_and_the_fix():
    spec = TrainingSpec(
        submission_id="s-a1",
        train_fn={"pickle": "train_fn.pkl"},
        storage_uri="/x",
        datasets={"train": {"pickle": "dataset_train.pkl"}, "val": {"uri": "/v", "format": "csv"}},
        python_version="3.9",
    )
    message = entrypoint.python_mismatch(spec.python_version, spec.pickled_files())
    assert "train_fn and datasets['train']" in message
    assert "Airflow's Python 3.9" in message
    assert f"runs Python {HERE}" in message
    assert 'import path "package.module:function"' in message


@pytest.mark.parametrize(
    "spec",
    [
        TrainingSpec(submission_id="s", train_fn={"pickle": "f"}, storage_uri="/x", python_version=HERE),
        TrainingSpec(submission_id="s", train_fn={"import": "m:f"}, storage_uri="/x", python_version="3.9"),
        TaskSpec(submission_id="s", function={"import": "m:f"}, storage_uri="/x", python_version="3.9"),
    ],
    ids=["same-python", "import-path", "task-import-path"],
)
def test_the_same_python_or_import_paths_pass(spec):
    assert entrypoint.preflight(spec)[1] is None


def test_a_task_job_names_its_callable():
    spec = TaskSpec(submission_id="s", function={"pickle": "function.pkl"}, storage_uri="/x", python_version="3.9")
    assert "python_callable travelled pickled" in entrypoint.preflight(spec)[1]


# --- what a failure was: Ray's own errors, as the runtime catches them -----------------------------------


def users(rank):
    """An error out of the user's function, marked in its worker as Ray Train's wrapper does."""
    try:
        {}["lr"]
    except KeyError as err:
        failures.mark_user_error(err, rank)
        return err


def failed_run(cause):
    """Ray Train's fit() failing from ``cause``, as the driver catches it."""
    try:
        try:
            raise cause
        except Exception as inner:
            raise RuntimeError("The Ray Train run failed.") from inner
    except RuntimeError as err:
        return err


def v2_errors():
    from ray.exceptions import ActorDiedError, RayTaskError
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError, WorkerHealthCheckFailedError
    from ray.train.v2.api.exceptions import ControllerError, PreemptionError, WorkerGroupError
    from ray.train.v2.api.preemption import PreemptionInfo

    died = WorkerHealthCheckFailedError("worker 1 unreachable", failure=ActorDiedError())
    preempted = ActorDiedError()
    preempted._preempted = True
    init_error = RayTaskError(
        "TrainController.__init__",
        "OSError: When creating bucket 'b': AWS Error NETWORK_CONNECTION: Could not connect to server",
        OSError("Could not connect to server"),
    )
    return {
        "user code on rank 1": (
            WorkerGroupError(
                "rank 1 failed", {0: RuntimeError("Horovod has been shut down: Gloo connection reset"), 1: users(1)}
            ),
            FailureClass.USER_CODE,
        ),
        "a dead worker": (WorkerGroupError("rank 1 died", {1: died}), FailureClass.INFRASTRUCTURE),
        "a collective aborted by a dead peer": (
            WorkerGroupError(
                "ranks failed", {0: RuntimeError("Gloo connectFullMesh failed: Connection refused"), 1: died}
            ),
            FailureClass.INFRASTRUCTURE,
        ),
        "a preempted node": (WorkerGroupError("rank 0 died", {0: preempted}), FailureClass.PREEMPTION),
        "a drained node": (
            PreemptionError(PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"n1": [1]})),
            FailureClass.PREEMPTION,
        ),
        "workers that never started": (ControllerError(WorkerGroupStartupTimeoutError(2)), FailureClass.CAPACITY),
        "storage gone at the controller's start": (ActorDiedError(cause=init_error), FailureClass.STORAGE),
        "a module the cluster lacks": (
            ModuleNotFoundError("No module named 'transformers'"),
            FailureClass.CONFIGURATION,
        ),
    }


@pytest.mark.parametrize("name", list(v2_errors()))
def test_ray_train_v2_errors_get_their_class(name):
    cause, expected = v2_errors()[name]
    verdict = failures.of_error(failed_run(cause), user_code=False)
    assert verdict.failure_class is expected, verdict
    if expected is FailureClass.USER_CODE:
        assert (verdict.rank, verdict.error_type) == (1, "KeyError")
        assert '{}["lr"]' in verdict.traceback


def test_ray_train_v1_errors_get_their_class():
    """Train V1 (legacy) raises from Ray's own RayTaskError around the worker's error."""
    from ray.exceptions import ActorDiedError, RayTaskError

    died = RayTaskError("_Inner.train", "traceback", ActorDiedError()).as_instanceof_cause()
    assert failures.of_error(failed_run(died), user_code=False).failure_class is FailureClass.INFRASTRUCTURE
    bug = RayTaskError("_Inner.train", "traceback", users(0))
    verdict = failures.of_error(failed_run(bug), user_code=False)
    assert (verdict.failure_class, verdict.rank) == (FailureClass.USER_CODE, 0)


def test_the_v2_policy_fails_a_users_error_at_once_and_leaves_the_rest_to_ray_train():
    from ray.train import FailureConfig
    from ray.train.v2._internal.execution.failure_handling import FailureDecision
    from ray.train.v2.api.exceptions import WorkerGroupError

    from airflow_provider_horovod.runtime.trainers import FailFastOnUserErrors

    policy = FailFastOnUserErrors(FailureConfig(max_failures=2))
    assert policy.make_decision(WorkerGroupError("bug", {1: users(1)})) is FailureDecision.RAISE
    cause, _ = v2_errors()["a dead worker"]
    assert [policy.make_decision(cause) for _ in range(3)] == [FailureDecision.RETRY] * 2 + [FailureDecision.RAISE]


def test_a_failed_task_job_leaves_its_verdict_in_the_log_and_its_record(tmp_path, monkeypatch, capsys):
    spec, code = run_payload(tmp_path, monkeypatch, "math:sqrt", args=[-1])
    out = capsys.readouterr().out
    verdict = next(f for line in out.splitlines() if (f := failures.of_line(line)) is not None)
    assert code == 1
    assert verdict.failure_class is FailureClass.USER_CODE
    assert verdict.error_type == "ValueError"
    assert "AHP_ERROR user_code: ValueError: math domain error" in out
    record = TaskRecord.from_json(open(spec.result_uri).read())
    assert record.failure["failure_class"] == "user_code"
    assert record.return_value is None


def test_a_function_that_does_not_load_on_the_cluster_is_configuration(tmp_path, monkeypatch, capsys):
    payload = tmp_path / "ahp_payload_noload"
    payload.mkdir()
    (payload / "__init__.py").write_text("")
    spec = TaskSpec(
        submission_id="ahp-d-t-x-a1",
        storage_uri=str(tmp_path / "storage"),
        function={"import": "json:no_such_function"},
    )  # the Airflow side could not look it up
    (payload / "spec.json").write_text(spec.to_json())
    monkeypatch.syspath_prepend(str(tmp_path))
    code = entrypoint.main(["task", payload.name])
    verdict = failures.of_line(next(line for line in capsys.readouterr().out.splitlines() if "AHP_FAILURE" in line))
    assert code == 1
    assert verdict.failure_class is FailureClass.CONFIGURATION


def test_a_training_leaves_ray_once_its_result_is_printed_and_a_task_does_not(tmp_path, monkeypatch, capsys):
    """Ray's exit hook sleeps half a second before it disconnects: a training's driver leaves before it."""
    import ray

    from airflow_provider_horovod.documents import ResultRecord

    printed_before: list[str] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "shutdown", lambda: printed_before.append(capsys.readouterr().out))
    record = ResultRecord(submission_id="ahp-d-t-x-a1", attempt=1, storage_uri=str(tmp_path), run_uri=str(tmp_path))
    monkeypatch.setattr(entrypoint, "run_training", lambda spec, folder, started_at: record)
    payload = tmp_path / "ahp_payload_leave"
    payload.mkdir()
    (payload / "__init__.py").write_text("")
    spec = TrainingSpec(submission_id="ahp-d-t-x-a1", train_fn={"import": "m:f"}, storage_uri=str(tmp_path))
    (payload / "spec.json").write_text(spec.to_json())
    monkeypatch.syspath_prepend(str(tmp_path))
    assert entrypoint.main(["train", payload.name]) == 0
    assert len(printed_before) == 1
    assert "AHP_RESULT " in printed_before[0]

    printed_before.clear()
    spec, code = run_payload(tmp_path, monkeypatch, "os:getcwd")
    assert code == 0
    assert printed_before == []


# --- a stop: Ray's SIGTERM to the driver ---------------------------------------------------------------


@pytest.fixture
def watched(monkeypatch):
    """The driver's watch for Ray's SIGTERM, undone after the test (pytest's own process)."""
    monkeypatch.setenv(entrypoint.NO_NATIVE_SIGNAL_HANDLER_ENV, "1")
    handler, wakeup = signal.getsignal(signal.SIGTERM), signal.set_wakeup_fd(-1)
    entrypoint.watch_for_stop()
    yield
    signal.signal(signal.SIGTERM, handler)
    signal.set_wakeup_fd(wakeup)
    entrypoint._signals = None


def test_a_task_job_stopped_by_sigterm_keeps_its_record_with_its_class(tmp_path, monkeypatch, watched):
    # The function gets Ray's SIGTERM while it runs: the driver unwinds and keeps the record on its way out.
    with pytest.raises(SystemExit):
        run_payload(tmp_path, monkeypatch, "os:kill", args=[os.getpid(), signal.SIGTERM])
    (record_file,) = (tmp_path / "storage").rglob("result.json")
    record = TaskRecord.from_json(record_file.read_text())
    # The class the Airflow side gives a STOPPED job, and the Training view's "killed" reads the same way.
    assert record.failure["failure_class"] == "infrastructure"
    assert failures.stopped_by_request(record.failure)
    assert "SIGTERM" in record.failure["summary"]
    assert record.timings["started_at"]


def test_another_exit_of_the_function_keeps_no_stop_record(tmp_path, monkeypatch, watched):
    with pytest.raises(SystemExit):
        run_payload(tmp_path, monkeypatch, "sys:exit", args=[1])
    assert not list((tmp_path / "storage").rglob("result.json"))


def second_attempt(storage_uri) -> TrainingSpec:
    return TrainingSpec(
        submission_id="ahp-d-t-x-a2",
        attempt=2,
        train_fn={"import": "m:f"},
        storage_uri=str(storage_uri),
        python_version=HERE,
    )


def test_a_stopped_training_keeps_the_reports_it_made_and_an_existing_record_stays(tmp_path):
    spec = second_attempt(tmp_path)
    os.makedirs(os.path.dirname(spec.history_uri), exist_ok=True)
    reports = [{"metrics": {"loss": 0.5, "epoch": 0}}, {"metrics": {"loss": 0.4, "epoch": 1}}]
    with open(spec.history_uri, "w") as f:
        json.dump(reports, f)
    entrypoint.report_stop(spec, started_at=1.0)
    record = ResultRecord.from_json(open(spec.result_uri).read())
    assert record.history == reports
    assert record.attempt == 2
    assert record.checkpoint_uri is None
    assert record.failure["failure_class"] == "infrastructure"
    assert failures.stopped_by_request(record.failure)
    # A record already there (the attempt's result, the Airflow side's post-mortem of a timeout) is kept.
    with open(spec.result_uri, "w") as f:
        f.write('{"kept": true}')
    entrypoint.report_stop(spec, started_at=1.0)
    assert json.loads(open(spec.result_uri).read()) == {"kept": True}


def test_a_stopped_driver_replaces_the_record_its_stopper_kept(tmp_path):
    from airflow_provider_horovod.jobs.stop import keep_stopped
    from airflow_provider_horovod.storage import Storage

    spec = second_attempt(tmp_path)
    meta = {META_RESULT_URI: spec.result_uri, META_STORAGE_URI: spec.storage_uri, META_ATTEMPT: "2"}
    keep_stopped(Storage(), spec.submission_id, {"status": "RUNNING", "metadata": meta})
    assert "while its driver ran" in json.loads(open(spec.result_uri).read())["failure"]["summary"]
    entrypoint.report_stop(spec, started_at=1.0)
    record = ResultRecord.from_json(open(spec.result_uri).read())
    assert record.timings["started_at"] == 1.0  # the driver's own, with what it knows
    assert "SIGTERM" in record.failure["summary"]
