"""The documents that cross the boundary: the spec and the records as versioned JSON, read by a newer
or older provider (unknown fields ignored, another format refused); a spec's resources and paths; and the
result a task returns, built from its attempt's record."""

import json

import pytest

from airflow_provider_horovod.contract import (
    FORMAT,
    attempt_uri,
    consumed_uri,
    result_uri,
)
from airflow_provider_horovod.documents import ResultRecord, TaskRecord, TaskSpec, TrainingSpec, training_result


def spec(**kwargs) -> TrainingSpec:
    values = {
        "submission_id": "ahp-d-t-0123456789-a1",
        "train_fn": {"import": "pkg.mod:fn"},
        "storage_uri": "s3://b/p/d/t/r-abcdef",
    }
    return TrainingSpec(**{**values, **kwargs})


def record(**kwargs) -> ResultRecord:
    values = {
        "submission_id": "sid-a1",
        "attempt": 1,
        "storage_uri": "/s",
        "run_uri": "/s/attempt-1",
        "checkpoint_uri": "/s/attempt-1/checkpoint_000001",
        "best_checkpoint_uri": None,
        "metrics": {"loss": 0.5},
        "world_size": 2,
        "trainer_api": "v2",
    }
    return ResultRecord(**{**values, **kwargs})


def test_spec_round_trip():
    original = spec(
        attempt=3,
        train_loop_config={"lr": 0.1, "layers": [1, 2]},
        datasets={"train": {"uri": "s3://b/x/", "format": "parquet"}, "gen": {"pickle": "dataset_gen.pkl"}},
        num_workers=4,
        use_gpu=True,
        resources_per_worker={"CPU": 2.0, "GPU": 1.0},
        trainer_api="legacy",
        horovod_nics=["eth0"],
        horovod_env={"HOROVOD_CYCLE_TIME": "1"},
        resume_from=["s3://b/p/attempt-2"],
        pending_timeout_s=60.0,
        python_version="3.11",
    )
    text = original.to_json()
    json.loads(text)
    assert TrainingSpec.from_json(text) == original


def test_spec_ignores_fields_it_does_not_know():
    data = json.loads(spec().to_json())
    data["added_by_a_newer_provider"] = {"x": 1}
    assert TrainingSpec.from_json(json.dumps(data)) == spec()


@pytest.mark.parametrize("version", [FORMAT + 1, None, "1"])
def test_spec_of_another_version_is_refused(version):
    data = json.loads(spec().to_json())
    data["version"] = version
    with pytest.raises(ValueError, match=f"TrainingSpec of format {version!r} is not {FORMAT}.*resubmit"):
        TrainingSpec.from_json(json.dumps(data))


def test_result_record_round_trip_and_version():
    original = record(
        best_checkpoint_uri="/s/attempt-1/checkpoint_000000", resumed_from="/s/attempt-0/c", timings={"train_s": 1.5}
    )
    assert ResultRecord.from_json(original.to_json()) == original
    data = json.loads(original.to_json())
    data["unknown"] = 1
    assert ResultRecord.from_json(json.dumps(data)) == original
    data["version"] = 99
    with pytest.raises(ValueError, match="ResultRecord of format 99"):
        ResultRecord.from_json(json.dumps(data))


@pytest.mark.parametrize(
    "use_gpu, resources, per_worker",
    [
        (False, None, {"CPU": 1.0}),
        (True, None, {"GPU": 1.0}),
        (False, {"CPU": 2}, {"CPU": 2.0}),
        (False, {"CPU": 2, "GPU": 0, "memory": 0}, {"CPU": 2.0}),
        (True, {"CPU": 2}, {"CPU": 2.0, "GPU": 1.0}),
        (True, {"CPU": 1, "GPU": 2}, {"CPU": 1.0, "GPU": 2.0}),
        (True, {"GPU": 0.5}, {"GPU": 0.5}),
        (False, {"custom": 1}, {"custom": 1.0}),
        (True, {"CPU": 0}, {"GPU": 1.0}),
    ],
)
def test_worker_resources_follow_ray_scaling_config(use_gpu, resources, per_worker):
    assert spec(use_gpu=use_gpu, resources_per_worker=resources).worker_resources() == per_worker


def test_total_resources_multiply_by_the_workers():
    assert spec(num_workers=3, resources_per_worker={"CPU": 2, "GPU": 0}).total_resources() == {"CPU": 6.0}
    assert spec(num_workers=2, use_gpu=True).total_resources() == {"GPU": 2.0}


def test_an_elastic_range_counts_its_minimum_and_survives_json():
    elastic = spec(num_workers=[2, 4], resources_per_worker={"CPU": 1})
    assert (elastic.elastic, elastic.min_workers, elastic.max_workers) == (True, 2, 4)
    assert elastic.total_resources() == {"CPU": 2.0}  # what the run needs to start
    assert TrainingSpec.from_json(elastic.to_json()) == elastic
    assert (spec(num_workers=3).elastic, spec(num_workers=3).min_workers, spec(num_workers=3).max_workers) == (
        False,
        3,
        3,
    )


def test_paths_of_an_attempt():
    s = spec(storage_uri="s3://b/p/", attempt=2)
    assert attempt_uri("s3://b/p/", 2) == "s3://b/p/attempt-2" == s.run_uri
    assert result_uri("s3://b/p", 2) == "s3://b/p/attempt-2/result.json" == s.result_uri
    assert consumed_uri("/x/", 1) == "/x/attempt-1/consumed.json"


def test_pickled_files_by_parameter():
    s = spec(
        train_fn={"pickle": "train_fn.pkl"},
        datasets={"a": {"uri": "s3://b/a"}, "b": {"pickle": "dataset_b.pkl"}, "c": {"import": "m:f"}},
    )
    assert s.pickled_files() == {"train_fn": "train_fn.pkl", "datasets['b']": "dataset_b.pkl"}
    assert spec().pickled_files() == {}


def test_task_spec_and_record():
    task = TaskSpec(
        submission_id="sid-a2",
        function={"pickle": "function.pkl"},
        storage_uri="/s",
        attempt=2,
        args=["s3://b/m"],
        kwargs={"t": 0.5},
        python_version="3.11",
    )
    assert TaskSpec.from_json(task.to_json()) == task
    assert (task.run_uri, task.result_uri) == ("/s/attempt-2", "/s/attempt-2/result.json")
    assert task.pickled_files() == {"python_callable": "function.pkl"}
    assert TaskSpec(submission_id="x", function={"import": "m:f"}, storage_uri="/s").pickled_files() == {}
    record = TaskRecord(
        submission_id="sid-a2",
        attempt=2,
        storage_uri="/s",
        run_uri="/s/attempt-2",
        return_value={"acc": [0.9]},
        timings={"total_s": 1.0},
    )
    data = json.loads(record.to_json())
    data["new_field"] = 1
    assert TaskRecord.from_json(json.dumps(data)) == record


def test_a_training_result_is_built_from_its_record():
    rec = record(best_checkpoint_uri=None, return_value={"loss": 0.1}, timings={"fit_s": 2.0})
    result = training_result(rec, dashboard_url="http://ray/#/jobs/sid-a1")
    assert result["checkpoint_uri"] == result["best_checkpoint_uri"] == rec.checkpoint_uri
    assert result["submission_id"] == "sid-a1"
    assert result["dashboard_url"] == "http://ray/#/jobs/sid-a1"
    assert result["return_value"] == {"loss": 0.1}
    assert result["world_size"] == 2
    assert result["attempt"] == 1
    assert json.loads(json.dumps(result)) == result


def test_a_training_result_carries_the_segments_of_its_run():
    ran = [
        {"started_at": 1.0, "world_size": 4, "reason": "start"},
        {"started_at": 9.0, "world_size": 2, "reason": "node lost"},
    ]
    rec = record(segments=ran, world_size=2)
    assert ResultRecord.from_json(rec.to_json()).segments == ran
    result = training_result(rec, dashboard_url="http://ray/#/jobs/sid-a1")
    assert result["segments"] == ran
    assert result["world_size"] == 2
