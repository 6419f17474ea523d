"""The training spec and the result record: versioned JSON, read by a newer or older provider."""

import json

import pytest

from airflow_provider_horovod.spec import (
    RAY_VERSIONS,
    SPEC_VERSION,
    ResultRecord,
    TrainingSpec,
    attempt_dir,
    check_ray_version,
    consumed_uri,
    result_uri,
)


def spec(**kwargs) -> TrainingSpec:
    values = {"submission_id": "ahp-d-t-0123456789-a1", "train_fn": {"import": "pkg.mod:fn"},
              "storage_uri": "s3://b/p/d/t/r-abcdef"}
    return TrainingSpec(**{**values, **kwargs})


def record(**kwargs) -> ResultRecord:
    values = {"submission_id": "sid-a1", "attempt": 1, "storage_uri": "/s", "run_uri": "/s/attempt-1",
              "checkpoint_uri": "/s/attempt-1/checkpoint_000001", "best_checkpoint_uri": None,
              "metrics": {"loss": 0.5}, "world_size": 2, "trainer_api": "v2"}
    return ResultRecord(**{**values, **kwargs})


def test_spec_round_trip():
    original = spec(attempt=3, train_loop_config={"lr": 0.1, "layers": [1, 2]},
                    datasets={"train": {"uri": "s3://b/x/", "format": "parquet"}, "gen": {"pickle": "dataset_gen.pkl"}},
                    num_workers=4, use_gpu=True, resources_per_worker={"CPU": 2.0, "GPU": 1.0}, trainer_api="legacy",
                    horovod_nics=["eth0"], horovod_env={"HOROVOD_CYCLE_TIME": "1"},
                    resume_from=["s3://b/p/attempt-2"], pending_timeout_s=60.0, python_version="3.11")
    text = original.to_json()
    json.loads(text)
    assert TrainingSpec.from_json(text) == original


def test_spec_ignores_fields_it_does_not_know():
    data = json.loads(spec().to_json())
    data["added_by_a_newer_provider"] = {"x": 1}
    assert TrainingSpec.from_json(json.dumps(data)) == spec()


@pytest.mark.parametrize("version", [SPEC_VERSION + 1, None, "1"])
def test_spec_of_another_version_is_refused(version):
    data = json.loads(spec().to_json())
    data["version"] = version
    with pytest.raises(ValueError, match=f"Training spec version {version!r} is not {SPEC_VERSION}.*resubmit"):
        TrainingSpec.from_json(json.dumps(data))


def test_result_record_round_trip_and_version():
    original = record(best_checkpoint_uri="/s/attempt-1/checkpoint_000000", resumed_from="/s/attempt-0/c",
                      timings={"train_s": 1.5})
    assert ResultRecord.from_json(original.to_json()) == original
    data = json.loads(original.to_json())
    data["unknown"] = 1
    assert ResultRecord.from_json(json.dumps(data)) == original
    data["version"] = 99
    with pytest.raises(ValueError, match="Result record version 99"):
        ResultRecord.from_json(json.dumps(data))


@pytest.mark.parametrize("use_gpu, resources, per_worker", [
    (False, None, {"CPU": 1.0}),
    (True, None, {"GPU": 1.0}),
    (False, {"CPU": 2}, {"CPU": 2.0}),
    (False, {"CPU": 2, "GPU": 0, "memory": 0}, {"CPU": 2.0}),
    (True, {"CPU": 2}, {"CPU": 2.0, "GPU": 1.0}),
    (True, {"CPU": 1, "GPU": 2}, {"CPU": 1.0, "GPU": 2.0}),
    (True, {"GPU": 0.5}, {"GPU": 0.5}),
    (False, {"custom": 1}, {"custom": 1.0}),
    (True, {"CPU": 0}, {"GPU": 1.0}),
])
def test_worker_resources_follow_ray_scaling_config(use_gpu, resources, per_worker):
    assert spec(use_gpu=use_gpu, resources_per_worker=resources).worker_resources() == per_worker


def test_total_resources_multiply_by_the_workers():
    assert spec(num_workers=3, resources_per_worker={"CPU": 2, "GPU": 0}).total_resources() == {"CPU": 6.0}
    assert spec(num_workers=2, use_gpu=True).total_resources() == {"GPU": 2.0}


def test_paths_of_an_attempt():
    s = spec(storage_uri="s3://b/p/", attempt=2)
    assert attempt_dir("s3://b/p/", 2) == "s3://b/p/attempt-2" == s.run_uri
    assert result_uri("s3://b/p", 2) == "s3://b/p/attempt-2/result.json" == s.result_uri
    assert consumed_uri("/x/", 1) == "/x/attempt-1/consumed.json"


def test_pickled_files_by_parameter():
    s = spec(train_fn={"pickle": "train_fn.pkl"},
             datasets={"a": {"uri": "s3://b/a"}, "b": {"pickle": "dataset_b.pkl"}, "c": {"import": "m:f"}})
    assert s.pickled_files() == {"train_fn": "train_fn.pkl", "datasets['b']": "dataset_b.pkl"}
    assert spec().pickled_files() == {}


def test_task_spec_and_record():
    from airflow_provider_horovod.spec import TaskRecord, TaskSpec

    task = TaskSpec(submission_id="sid-a2", function={"pickle": "function.pkl"}, storage_uri="/s", attempt=2,
                    args=["s3://b/m"], kwargs={"t": 0.5}, python_version="3.11")
    assert TaskSpec.from_json(task.to_json()) == task
    assert (task.run_uri, task.result_uri) == ("/s/attempt-2", "/s/attempt-2/result.json")
    assert task.pickled_files() == {"python_callable": "function.pkl"}
    assert TaskSpec(submission_id="x", function={"import": "m:f"}, storage_uri="/s").pickled_files() == {}
    record = TaskRecord(submission_id="sid-a2", attempt=2, storage_uri="/s", run_uri="/s/attempt-2",
                        return_value={"acc": [0.9]}, timings={"total_s": 1.0})
    data = json.loads(record.to_json())
    data["new_field"] = 1
    assert TaskRecord.from_json(json.dumps(data)) == record


@pytest.mark.parametrize("version", ["2.60.0", "2.60.1", "2.60.0rc1", "2.60"])
def test_supported_ray_versions(version):
    assert check_ray_version(version) is None


@pytest.mark.parametrize("version", ["2.59.0", "2.61.0", "3.0.0", "1.60.0", None, "", "nightly"])
def test_other_ray_versions_are_refused_with_the_range_and_the_fix(version):
    problem = check_ray_version(version)
    (low, high) = RAY_VERSIONS
    wanted = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    assert problem is not None and f"supports Ray {wanted}" in problem
    assert f"ray[default,train]{wanted}" in problem
    assert (f"it runs Ray {version}," if version else "of an unknown version") in problem
