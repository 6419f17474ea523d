"""The plan of a task run's job, and the Ray request of each attempt built from it: the entrypoint,
the runtime_env, the metadata and the payload. Pure: no cluster, no storage."""

import dataclasses
import importlib
import json
import os
import sys

import pytest

import airflow_provider_horovod
from airflow_provider_horovod.contract import (
    META_ATTEMPT,
    META_KIND,
    META_NUM_WORKERS,
    META_RESOURCES,
    META_RESULT_URI,
    META_STORAGE_URI,
    META_WORKER_RESOURCES,
    MLFLOW_AUTH_FILE,
    SPEC_FILE,
    TaskRun,
)
from airflow_provider_horovod.documents import TaskSpec, TrainingSpec
from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator
from airflow_provider_horovod.plan import JobRequest, payload_module, provider_folder, task_plan, training_plan

TASK_RUN = TaskRun("dag", "train", "manual__1", -1)
ROOT = "s3://b/p"
PICKLE = b"\x80\x05pickled-function-bytes"
# Every job gives its driver time to keep a stopped attempt's record before Ray's SIGKILL.
STOP_WAIT = {"RAY_JOB_STOP_WAIT_TIME_S": "10"}
# What the operator is given; the rest are its defaults.
TRAINING = {
    "train_fn": "json:dumps",
    "num_workers": 3,
    "resources_per_worker": {"CPU": 2},
    "horovod_env": {"HOROVOD_CYCLE_TIME": "1"},
    "aws_credentials_ttl_seconds": 3600,
    "storage_path": ROOT,
}


def given(**kwargs) -> dict:
    """The operator's declared parameters as its plan gets them: each through its own check."""
    op = HorovodTrainOperator(task_id="train", **{**TRAINING, **kwargs})
    return op.parameters.checked(op)


def training(task_run=TASK_RUN, *, mlflow_tracking_uri=None, mlflow_auth=None, try_number=None, **kwargs):
    return training_plan(
        task_run,
        given(**kwargs),
        train_call=None,
        pending_timeout_s=600.0,
        mlflow_tracking_uri=mlflow_tracking_uri,
        mlflow_auth=mlflow_auth,
        try_number=try_number,
    )


def plan(**kwargs):
    # A pickled function travels in the payload; an import path does not. Tests of the payload use one.
    return dataclasses.replace(training(**kwargs), files={"train_fn.pkl": PICKLE})


def request(attempt=2, **kwargs):
    return plan(**kwargs).request(attempt)


def spec(attempt=2, **kwargs):
    return TrainingSpec.from_json(request(attempt, **kwargs).files[SPEC_FILE].decode())


# --- the plan ---------------------------------------------------------------------------------------


def test_the_plan_holds_the_checked_spec_of_the_first_attempt_and_what_it_asks_for():
    made = training()
    assert made.spec.submission_id == TASK_RUN.submission_id(1)
    assert made.spec.attempt == 1
    assert made.storage_uri == TASK_RUN.storage_uri(ROOT)
    assert made.storage_root == ROOT
    assert made.spec.train_fn == {"import": "json:dumps"}
    assert made.files == {}
    assert made.resources == {"CPU": 6.0}
    assert made.kind.value == "train"
    assert made.check_cluster_resources
    assert made.forward_aws is None


@pytest.mark.parametrize(
    "storage_path, root", [("file:///data/x/", "/data/x"), ("s3://b/p/", "s3://b/p"), ("/data/./y", "/data/y")]
)
def test_the_storage_root_is_normalised(storage_path, root):
    assert training(storage_path=storage_path).storage_root == root


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"num_workers": 0}, "num_workers"),
        ({"trainer_api": "v3"}, "trainer_api"),
        ({"storage_path": "relative/path"}, "storage_path"),
        ({"horovod_timeout_s": 0}, "horovod_timeout_s"),
        ({"train_fn": "no_such_module_x:f"}, "train_fn"),
        ({"runtime_env": {"bogus": 1}}, "runtime_env"),
        ({"forward_aws_credentials": True}, "forward_aws_credentials"),
    ],
)
def test_bad_parameters_raise_naming_the_parameter(kwargs, parameter):
    with pytest.raises(InvalidParameterError) as err:
        training(**kwargs)
    assert err.value.parameter == parameter


# --- the request of an attempt ------------------------------------------------------------------------


def test_entrypoint_runs_the_runtime_on_the_payload():
    made = request()
    assert made.entrypoint == f"python -m airflow_provider_horovod.runtime.entrypoint train {made.payload_module}"
    assert made.payload_module.startswith("ahp_payload_")
    assert made.payload_module.isidentifier()
    assert made.submission_id == TASK_RUN.submission_id(2)


def test_runtime_env_puts_the_provider_first_and_keeps_the_users(tmp_path):
    user = {
        "py_modules": [str(tmp_path), "gcs://_ray_pkg_x.zip"],
        "pip": ["pandas"],
        "env_vars": {"MODE": "fast", "HOROVOD_CYCLE_TIME": "5"},
    }
    made = request(runtime_env=user, train_fn="json:dumps")
    env = made.runtime_env
    assert env["py_modules"] == [provider_folder(), str(tmp_path), "gcs://_ray_pkg_x.zip"]
    assert env["pip"] == ["pandas"]
    # the user's value wins
    assert env["env_vars"] == {
        **STOP_WAIT,
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
        "HOROVOD_CYCLE_TIME": "5",
        "MODE": "fast",
    }
    assert user["py_modules"] == [str(tmp_path), "gcs://_ray_pkg_x.zip"]  # not changed in place


def test_the_provider_folder_is_this_package():
    folder = provider_folder()
    assert os.path.basename(folder) == "airflow_provider_horovod"
    assert os.path.samefile(os.path.join(folder, "__init__.py"), airflow_provider_horovod.__file__)


@pytest.mark.parametrize(
    "api, flag", [("legacy", {"RAY_TRAIN_V2_ENABLED": "0"}), ("v2", {"RAY_TRAIN_V2_ENABLED": "1"}), ("auto", {})]
)
def test_horovod_env_and_the_train_version_an_explicit_api_needs(api, flag):
    made = request(trainer_api=api)
    # Train V2's print patch would put every line a worker prints in the job's log twice.
    assert made.runtime_env["env_vars"] == {
        **STOP_WAIT,
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
        "HOROVOD_CYCLE_TIME": "1",
        **flag,
    }


def test_the_print_patch_can_be_turned_back_on():
    made = request(runtime_env={"env_vars": {"RAY_TRAIN_ENABLE_PRINT_PATCH": "1"}})
    assert made.runtime_env["env_vars"]["RAY_TRAIN_ENABLE_PRINT_PATCH"] == "1"


def test_metadata_names_the_task_run_and_the_attempt():
    s = spec()
    assert request().metadata == {
        **TASK_RUN.metadata(),
        META_KIND: "train",
        META_STORAGE_URI: s.storage_uri,
        META_ATTEMPT: "2",
        META_RESULT_URI: s.storage_uri + "/attempt-2/result.json",
        META_NUM_WORKERS: "3",
        META_RESOURCES: json.dumps({"CPU": 6.0}),
        META_WORKER_RESOURCES: json.dumps({"CPU": 2.0}),
    }
    assert all(isinstance(v, str) for v in request().metadata.values())


def test_job_tags_and_prices_travel_in_the_metadata_the_tags_as_they_are():
    from airflow_provider_horovod.contract import META_PRICES, META_TAGS, job_tags_of

    tags = {"team": "ranking", "cost_centre": "cc-4711"}
    metadata = request(1, job_tags=tags, prices={"cpu_hour": 0.05, "currency": "USD"}).metadata
    assert metadata["team"] == "ranking"
    assert metadata["cost_centre"] == "cc-4711"  # what Ray's APIs filter on
    assert json.loads(metadata[META_TAGS]) == ["cost_centre", "team"]
    assert job_tags_of(metadata) == tags
    assert json.loads(metadata[META_PRICES]) == {"cpu_hour": 0.05, "currency": "USD"}
    assert metadata["airflow_task_id"] == TASK_RUN.task_id  # the provider's keys stay its own


def test_payload_files_include_the_spec_of_the_attempt():
    made = request(3)
    assert set(made.files) == {"train_fn.pkl", SPEC_FILE}
    assert made.files["train_fn.pkl"] == PICKLE
    sent = TrainingSpec.from_json(made.files[SPEC_FILE].decode())
    assert sent == dataclasses.replace(plan().spec, submission_id=TASK_RUN.submission_id(3), attempt=3)


def test_a_resumed_attempt_lists_the_earlier_attempts_newest_first():
    made = plan().request(3, resume=True)
    sent = TrainingSpec.from_json(made.files[SPEC_FILE].decode())
    storage = TASK_RUN.storage_uri(ROOT)
    assert sent.resume_from == [f"{storage}/attempt-2", f"{storage}/attempt-1"]
    assert spec(3).resume_from == []


def test_extra_files_travel_in_the_payload_only():
    made = plan().request(1, extra_files={"aws_session.json": b"{}"})
    assert made.files["aws_session.json"] == b"{}"
    assert "aws_session.json" not in made.dry_run().split('"payload"')[0]


def test_payload_module_name_follows_the_content():
    files = {"a": b"1", "b": b"2"}
    assert payload_module(files) == payload_module(dict(reversed(list(files.items()))))
    assert payload_module(files) != payload_module({"a": b"1", "b": b"3"})
    assert payload_module(files) != payload_module({"a": b"1", "c": b"2"})
    assert payload_module({"ab": b""}) != payload_module({"a": b"b"})
    assert request().payload_module == request().payload_module
    assert request().payload_module != request(3).payload_module


def test_dry_run_hides_env_values_and_file_bytes():
    made = request(runtime_env={"env_vars": {"MODE": "visible-only-as-stars"}})
    shown = made.dry_run()
    data = json.loads(shown)
    assert data["runtime_env"]["env_vars"] == {
        "RAY_JOB_STOP_WAIT_TIME_S": "***",
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "***",
        "HOROVOD_CYCLE_TIME": "***",
        "MODE": "***",
    }
    assert data["payload"]["train_fn.pkl"] == f"{len(PICKLE)} bytes"
    assert data["entrypoint"] == made.entrypoint
    assert data["metadata"] == made.metadata
    assert "visible-only-as-stars" not in shown
    assert "pickled-function-bytes" not in shown
    assert "pickled-function-bytes" not in repr(made)


def test_write_payload_writes_an_importable_package(tmp_path, monkeypatch):
    made = request()
    folder = made.write_payload(str(tmp_path))
    assert folder == str(tmp_path / made.payload_module)
    assert sorted(os.listdir(folder)) == sorted(["__init__.py", "train_fn.pkl", SPEC_FILE])
    monkeypatch.syspath_prepend(str(tmp_path))
    package = importlib.import_module(made.payload_module)
    try:
        from importlib import resources

        assert resources.files(package).joinpath("train_fn.pkl").read_bytes() == PICKLE
    finally:
        sys.modules.pop(made.payload_module, None)


def test_write_payload_refuses_paths_as_file_names(tmp_path):
    bad = JobRequest("sid", "python -m x", {}, {}, "ahp_payload_x", files={"../escape": b"x"})
    with pytest.raises(ValueError, match="plain file name"):
        bad.write_payload(str(tmp_path))
    assert not (tmp_path / "escape").exists()


def test_a_task_request_runs_the_function_in_the_driver():
    task_run = TaskRun("dag", "evaluate", "manual__1")
    op = RayTaskOperator(
        task_id="evaluate",
        python_callable="json:dumps",
        op_args=[1],
        num_cpus=2,
        resources={"accel": 1},
        runtime_env={"env_vars": {"MODE": "x"}},
        storage_path="/s",
    )
    made_plan = task_plan(task_run, op.parameters.checked(op))
    made = made_plan.request(1)
    assert made.entrypoint == f"python -m airflow_provider_horovod.runtime.entrypoint task {made.payload_module}"
    assert made.driver_resources == {"num_cpus": 2, "resources": {"accel": 1.0}}
    assert made.metadata[META_KIND] == "task"
    assert made.metadata[META_RESULT_URI] == task_run.storage_uri("/s") + "/attempt-1/result.json"
    assert json.loads(made.metadata[META_RESOURCES]) == {"num_cpus": 2, "resources": {"accel": 1.0}}
    assert made.runtime_env["py_modules"] == [provider_folder()]
    assert made.runtime_env["env_vars"] == {
        **STOP_WAIT,
        "MODE": "x",
    }
    assert TaskSpec.from_json(made.files[SPEC_FILE].decode()) == made_plan.spec
    assert json.loads(made.dry_run())["driver_resources"] == made.driver_resources
    assert not made_plan.check_cluster_resources


# --- MLflow tracking -------------------------------------------------------------------------------


def test_without_mlflow_the_spec_has_no_tracking():
    assert plan().spec.tracking is None


def test_tracking_names_the_server_the_experiment_the_run_and_the_airflow_identifiers():
    mapped = TaskRun("dag", "train", "manual__1", 3)
    tracked = training(mapped, mlflow_tracking_uri="http://mlflow:5000", try_number=2)
    assert tracked.spec.tracking == {
        "tracking_uri": "http://mlflow:5000",
        "experiment_name": "dag",
        "run_name": "train[3] manual__1",
        "run_key": mapped.base_id,
        "tags": {
            "airflow.dag_id": "dag",
            "airflow.task_id": "train",
            "airflow.run_id": "manual__1",
            "airflow.map_index": "3",
            "airflow.try_number": "2",
        },
    }
    named = plan(mlflow_tracking_uri="http://mlflow:5000", mlflow_experiment_name="retraining")
    assert named.spec.tracking["experiment_name"] == "retraining"
    # Every attempt of the task run carries the same key: a retry finds the run by it.
    assert json.loads(named.request(3, resume=True).files[SPEC_FILE])["tracking"]["run_key"] == TASK_RUN.base_id


def test_an_mlflow_connections_credentials_travel_in_the_payload_only():
    secret = "mlflow-token-0123"
    tracked = training(mlflow_tracking_uri="http://mlflow:5000", mlflow_auth={"token": secret})
    req = tracked.request(1)
    assert json.loads(req.files[MLFLOW_AUTH_FILE]) == {"token": secret}
    assert secret not in json.dumps(req.runtime_env) + json.dumps(req.metadata) + req.entrypoint + req.dry_run()
    assert secret not in req.files[SPEC_FILE].decode()
    untracked = training(mlflow_auth={"token": secret})
    assert MLFLOW_AUTH_FILE not in untracked.files  # no tracking, no credentials


def test_a_bad_tracking_uri_fails_the_plan():
    with pytest.raises(InvalidParameterError, match="mlflow_tracking_uri"):
        plan(mlflow_tracking_uri="mlflow:5000")


@pytest.mark.parametrize(
    "datasets, readers",
    [
        ({"train": "s3://b/day/train.parquet", "valid": "/data/valid.PARQUET"}, "1"),
        ({"train": "s3://b/day/train.parquet", "extra": "s3://b/day/extra.csv"}, "1"),
        ({"train": "s3://b/day/train/"}, None),  # a folder: its files' footers read in parallel
        ({"train": "s3://b/day/train.parquet", "more": "s3://b/day/more"}, None),
        ({"train": "s3://b/day/train.parquet", "built": "json:loads"}, None),  # a function may read a folder
        ({"train": "/data/train.csv"}, None),  # no parquet: nothing to size
        (None, None),
    ],
)
def test_parquet_datasets_that_name_one_file_each_get_one_footer_reader(datasets, readers):
    env = request(datasets=datasets).runtime_env["env_vars"]
    assert env.get("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS") == readers


def test_the_users_runtime_env_sets_the_footer_readers_it_wants():
    made = request(
        datasets={"train": "s3://b/train.parquet"},
        runtime_env={"env_vars": {"RAY_DATA_PARQUET_FOOTER_NUM_ACTORS": "8"}},
    )
    assert made.runtime_env["env_vars"]["RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"] == "8"
