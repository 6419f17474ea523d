"""Every job's entrypoint: the payload written by the Airflow side read, the checks before anything
runs (the cluster's Ray, pickled code's Python), a task's function run and its JSON value in the
attempt's record, and a failure's one AHP_ERROR line (its chain of causes, a hint when a worker died)."""

import json
import os
import sys

import pytest

from airflow_provider_horovod.contract import TaskRecord, TaskRun, TaskSpec, TrainingSpec
from airflow_provider_horovod.plan import task_plan
from airflow_provider_horovod.runtime import entrypoint
from airflow_provider_horovod.runtime.entrypoint import WORKER_DIED_HINT, describe

HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


# --- a task job, end to end -------------------------------------------------------------------------

def run_payload(tmp_path, monkeypatch, function, args=(), kwargs=None):
    plan = task_plan(TaskRun("d", "t", "r"), python_callable=function, op_args=list(args), op_kwargs=kwargs or {},
                     num_cpus=1, num_gpus=None, memory=None, resources=None, runtime_env=None,
                     storage_path=str(tmp_path / "storage"), ray_conn_id="ray_default")
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
    assert record.return_value == '{"a": 2, "b": 1}' and record.attempt == 1
    out = capsys.readouterr().out
    assert f"result: {spec.result_uri}" in out and "AHP_RESULT " in out


def test_a_pickled_function_runs(tmp_path, monkeypatch):
    spec, code = run_payload(tmp_path, monkeypatch, lambda x: {"twice": 2 * x}, args=[21])
    assert code == 0 and TaskRecord.from_json(open(spec.result_uri).read()).return_value == {"twice": 42}


@pytest.mark.parametrize("function, fragment", [
    ("os:getcwd", None),
    ("builtins:object", "returned a object, which XCom cannot hold as JSON"),
    ("math:sqrt", "ValueError: math domain error"),
])
def test_failures_end_the_job_with_one_line_saying_why(tmp_path, monkeypatch, capsys, function, fragment):
    args = [-1] if function == "math:sqrt" else []
    spec, code = run_payload(tmp_path, monkeypatch, function, args=args)
    out = capsys.readouterr().out
    if fragment is None:
        assert code == 0 and json.loads(open(spec.result_uri).read())["return_value"]
        return
    assert code == 1 and "AHP_ERROR" in out and fragment in out
    assert not os.path.exists(spec.result_uri)  # no record: the Airflow side sees the failure


def test_a_wrong_command_line_says_how_to_call_it(capsys):
    assert entrypoint.main(["evaluate", "ahp_payload_x"]) == 2
    assert "train|task <payload module>" in capsys.readouterr().err


# --- before anything runs ---------------------------------------------------------------------------

def test_this_clusters_ray_is_supported():
    assert entrypoint.ray_mismatch() is None


@pytest.mark.parametrize("version", ["2.59.0", "2.61.0", "3.0.0"])
def test_a_ray_outside_the_supported_range_fails_naming_both_and_the_fix(monkeypatch, version):
    import ray

    monkeypatch.setattr(ray, "__version__", version)
    message = entrypoint.ray_mismatch()
    assert message and f"Ray {version}" in message and ">=2.60,<2.61" in message
    assert "ray[default,train]>=2.60,<2.61" in message


def test_pickled_code_from_another_python_fails_naming_the_parameter_both_versions_and_the_fix():
    spec = TrainingSpec(submission_id="s-a1", train_fn={"pickle": "train_fn.pkl"}, storage_uri="/x",
                        datasets={"train": {"pickle": "dataset_train.pkl"}, "val": {"uri": "/v", "format": "csv"}},
                        python_version="3.9")
    message = entrypoint.python_mismatch(spec.python_version, spec.pickled_files())
    assert "train_fn and datasets['train']" in message
    assert "Airflow's Python 3.9" in message and f"runs Python {HERE}" in message
    assert 'import path "package.module:function"' in message


@pytest.mark.parametrize("spec", [
    TrainingSpec(submission_id="s", train_fn={"pickle": "f"}, storage_uri="/x", python_version=HERE),
    TrainingSpec(submission_id="s", train_fn={"import": "m:f"}, storage_uri="/x", python_version="3.9"),
    TaskSpec(submission_id="s", function={"import": "m:f"}, storage_uri="/x", python_version="3.9"),
], ids=["same-python", "import-path", "task-import-path"])
def test_the_same_python_or_import_paths_pass(spec):
    assert entrypoint.preflight(spec) is None


def test_a_task_job_names_its_callable():
    spec = TaskSpec(submission_id="s", function={"pickle": "function.pkl"}, storage_uri="/x", python_version="3.9")
    assert "python_callable travelled pickled" in entrypoint.preflight(spec)


# --- the one error line -----------------------------------------------------------------------------

class ActorDiedError(RuntimeError):
    pass


class WorkerGroupError(RuntimeError):
    def __init__(self, message, worker_failures):
        super().__init__(message)
        self.worker_failures = worker_failures


def test_a_dead_worker_behind_a_train_v2_worker_group_error_gets_the_hint():
    err = WorkerGroupError("Training failed due to worker errors:\nrank 1 ...", {1: ActorDiedError("gone")})
    line = describe(err)
    assert line.startswith("WorkerGroupError: Training failed due to worker errors: <- ActorDiedError: gone")
    assert line.endswith(WORKER_DIED_HINT)


def test_an_error_in_the_training_function_gets_no_hint():
    try:
        try:
            raise ValueError("bad shape")
        except ValueError as inner:
            raise RuntimeError("fit failed") from inner
    except RuntimeError as err:
        assert describe(err) == "RuntimeError: fit failed <- ValueError: bad shape"


def test_a_dead_worker_behind_a_train_v1_task_error_gets_the_hint():
    """Train V1 (legacy) raises TrainingFailedError from Ray's own RayTaskError(ActorDiedError)."""
    from ray.exceptions import ActorDiedError as RayActorDied
    from ray.exceptions import RayTaskError

    cause = RayTaskError("_Inner.train", "traceback", RayActorDied()).as_instanceof_cause()
    try:
        try:
            raise cause
        except RayTaskError as inner:
            raise RuntimeError("The Ray Train run failed.") from inner
    except RuntimeError as err:
        line = describe(err)
    assert "<- RayTaskError(ActorDiedError)" in line
    assert line.endswith(WORKER_DIED_HINT)


def test_an_actor_that_failed_in_its_constructor_gets_no_hint_and_shows_its_error():
    """Train V2's controller raises in its constructor when the storage cannot be reached: that is
    no dead worker, and raising max_failures would not help."""
    from ray.exceptions import ActorDiedError as RayActorDied
    from ray.exceptions import RayTaskError

    traceback = ('Traceback (most recent call last):\n  File "controller.py", line 1, in __init__\n'
                 "OSError: When creating bucket 'b': AWS Error NETWORK_CONNECTION: Could not connect to server")
    init_error = RayTaskError("TrainController.__init__", traceback, OSError("Could not connect to server"))
    died = RayActorDied(cause=init_error)
    assert died.actor_init_failed
    try:
        try:
            raise died
        except RayActorDied as inner:
            raise RuntimeError("The Ray Train run failed.") from inner
    except RuntimeError as err:
        line = describe(err)
    assert WORKER_DIED_HINT not in line
    assert "ActorDiedError: The actor died because of an error raised in its creation task" in line
    assert line.endswith("AWS Error NETWORK_CONNECTION: Could not connect to server")
