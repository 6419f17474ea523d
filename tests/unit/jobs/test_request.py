"""What is submitted to Ray: the entrypoint, the runtime_env, the metadata and the payload."""

import importlib
import json
import os
import sys

import pytest

import airflow_provider_horovod
from airflow_provider_horovod.ids import TaskRun
from airflow_provider_horovod.jobs.protocol import (
    META_ATTEMPT,
    META_KIND,
    META_NUM_WORKERS,
    META_RESOURCES,
    META_RESULT_URI,
    META_STORAGE_URI,
)
from airflow_provider_horovod.jobs.request import (
    JobRequest,
    payload_module,
    provider_folder,
    training_request,
    write_payload,
)
from airflow_provider_horovod.spec import SPEC_FILE, TrainingSpec

TASK_RUN = TaskRun("dag", "train", "manual__1", -1)
PICKLE = b"\x80\x05pickled-function-bytes"


def spec(**kwargs):
    values = {"submission_id": TASK_RUN.submission_id(2), "train_fn": {"pickle": "train_fn.pkl"},
              "storage_uri": "s3://b/p/dag/train/manual__1-abcdef", "attempt": 2, "num_workers": 3,
              "resources_per_worker": {"CPU": 2}, "horovod_env": {"HOROVOD_CYCLE_TIME": "1"}}
    return TrainingSpec(**{**values, **kwargs})


def request(spec_=None, runtime_env=None, files=None):
    return training_request(spec_ or spec(), {"train_fn.pkl": PICKLE} if files is None else files,
                            runtime_env or {}, TASK_RUN)


def test_entrypoint_runs_the_runtime_on_the_payload():
    made = request()
    assert made.entrypoint == f"python -m airflow_provider_horovod.runtime.job {made.payload_module}"
    assert made.payload_module.startswith("ahp_payload_") and made.payload_module.isidentifier()
    assert made.submission_id == TASK_RUN.submission_id(2)


def test_runtime_env_puts_the_provider_first_and_keeps_the_users():
    user = {"py_modules": ["/opt/mine", "gcs://_ray_pkg_x.zip"], "pip": ["pandas"],
            "env_vars": {"MODE": "fast", "HOROVOD_CYCLE_TIME": "5"}}
    made = request(runtime_env=user)
    env = made.runtime_env
    assert env["py_modules"] == [provider_folder(), "/opt/mine", "gcs://_ray_pkg_x.zip"]
    assert env["pip"] == ["pandas"]
    # the user's value wins
    assert env["env_vars"] == {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0", "HOROVOD_CYCLE_TIME": "5", "MODE": "fast"}
    assert user["py_modules"] == ["/opt/mine", "gcs://_ray_pkg_x.zip"]  # not changed in place


def test_the_provider_folder_is_this_package():
    folder = provider_folder()
    assert os.path.basename(folder) == "airflow_provider_horovod"
    assert os.path.samefile(os.path.join(folder, "__init__.py"), airflow_provider_horovod.__file__)


@pytest.mark.parametrize("api, flag", [("legacy", {"RAY_TRAIN_V2_ENABLED": "0"}), ("v2", {})])
def test_horovod_env_and_the_legacy_flag(api, flag):
    made = request(spec(trainer_api=api))
    # Train V2's print patch would put every line a worker prints in the job's log twice.
    assert made.runtime_env["env_vars"] == {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0", "HOROVOD_CYCLE_TIME": "1", **flag}


def test_the_print_patch_can_be_turned_back_on():
    made = request(runtime_env={"env_vars": {"RAY_TRAIN_ENABLE_PRINT_PATCH": "1"}})
    assert made.runtime_env["env_vars"]["RAY_TRAIN_ENABLE_PRINT_PATCH"] == "1"


def test_metadata_names_the_task_run_and_the_attempt():
    s = spec()
    assert request(s).metadata == {
        **TASK_RUN.metadata(),
        META_KIND: "train",
        META_STORAGE_URI: s.storage_uri,
        META_ATTEMPT: "2",
        META_RESULT_URI: s.storage_uri + "/attempt-2/result.json",
        META_NUM_WORKERS: "3",
        META_RESOURCES: json.dumps({"CPU": 6.0}),
    }
    assert all(isinstance(v, str) for v in request(s).metadata.values())


def test_payload_files_include_the_spec():
    s = spec()
    made = request(s)
    assert set(made.files) == {"train_fn.pkl", SPEC_FILE}
    assert made.files["train_fn.pkl"] == PICKLE
    assert TrainingSpec.from_json(made.files[SPEC_FILE].decode()) == s


def test_payload_module_name_follows_the_content():
    files = {"a": b"1", "b": b"2"}
    assert payload_module(files) == payload_module(dict(reversed(list(files.items()))))
    assert payload_module(files) != payload_module({"a": b"1", "b": b"3"})
    assert payload_module(files) != payload_module({"a": b"1", "c": b"2"})
    assert payload_module({"ab": b""}) != payload_module({"a": b"b"})
    assert request().payload_module == request().payload_module
    assert request().payload_module != request(spec(attempt=3)).payload_module


def test_dry_run_hides_env_values_and_file_bytes():
    made = request(runtime_env={"env_vars": {"MODE": "visible-only-as-stars"}})
    shown = made.dry_run()
    data = json.loads(shown)
    assert data["runtime_env"]["env_vars"] == {"RAY_TRAIN_ENABLE_PRINT_PATCH": "***", "HOROVOD_CYCLE_TIME": "***",
                                               "MODE": "***"}
    assert data["payload"]["train_fn.pkl"] == f"{len(PICKLE)} bytes"
    assert data["entrypoint"] == made.entrypoint and data["metadata"] == made.metadata
    assert "visible-only-as-stars" not in shown and "pickled-function-bytes" not in shown
    assert "pickled-function-bytes" not in repr(made)


def test_write_payload_writes_an_importable_package(tmp_path, monkeypatch):
    made = request()
    folder = write_payload(made, str(tmp_path))
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
        write_payload(bad, str(tmp_path))
    assert not (tmp_path / "escape").exists()


def test_a_task_request_runs_the_function_in_the_driver():
    from airflow_provider_horovod.jobs.request import task_request
    from airflow_provider_horovod.spec import TaskSpec

    task_run = TaskRun("dag", "evaluate", "manual__1")
    task = TaskSpec(submission_id=task_run.submission_id(1), function={"pickle": "function.pkl"},
                    storage_uri="/s/dag/evaluate/r", args=[1])
    made = task_request(task, {"function.pkl": PICKLE}, {"env_vars": {"MODE": "x"}}, task_run,
                        {"num_cpus": 2, "num_gpus": None, "memory": 0, "resources": {"accel": 1}})
    assert made.entrypoint == f"python -m airflow_provider_horovod.runtime.task {made.payload_module}"
    assert made.driver_resources == {"num_cpus": 2, "memory": 0, "resources": {"accel": 1}}
    assert made.metadata[META_KIND] == "task"
    assert made.metadata[META_RESULT_URI] == "/s/dag/evaluate/r/attempt-1/result.json"
    assert json.loads(made.metadata[META_RESOURCES]) == {"num_cpus": 2, "resources": {"accel": 1}}
    assert made.runtime_env["py_modules"] == [provider_folder()] and made.runtime_env["env_vars"] == {"MODE": "x"}
    assert TaskSpec.from_json(made.files[SPEC_FILE].decode()) == task
    assert json.loads(made.dry_run())["driver_resources"] == made.driver_resources
