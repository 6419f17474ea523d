"""The finish step against real storage (a local folder) and a real result record: the verified
result dict, or a failure that names what is wrong; the consumed marker only after a success (or
when a vanished checkpoint retires the attempt)."""

import json
import os

import pytest

from airflow_provider_horovod.contract import (
    META_KIND,
    META_RESULT_URI,
    XCOM_CHECKPOINT_URI,
    ResultRecord,
    consumed_uri,
    result_uri,
)
from airflow_provider_horovod.exceptions import RayJobError, TrainingResultError
from airflow_provider_horovod.jobs.finish import finish, push_result
from airflow_provider_horovod.jobs.wait import JobEvent
from airflow_provider_horovod.storage import Storage
from unit.fakes import FakeTI

SID = "ahp-dag-train-0123456789-a1"
URL = "http://ray:8265/#/jobs/" + SID


class Run:
    """A finished attempt's storage folder, as the runtime leaves it."""

    def __init__(self, root, attempt=1):
        self.storage_uri = str(root / "dag" / "train" / "run-abcdef")
        self.attempt = attempt
        self.run_uri = f"{self.storage_uri}/attempt-{attempt}"
        self.checkpoint = f"{self.run_uri}/checkpoint_000002"
        self.best = f"{self.run_uri}/checkpoint_000001"

    def record(self, **kwargs) -> ResultRecord:
        values = {"submission_id": SID, "attempt": self.attempt, "storage_uri": self.storage_uri,
                  "run_uri": self.run_uri, "checkpoint_uri": self.checkpoint, "best_checkpoint_uri": self.best,
                  "metrics": {"loss": 0.25, "epoch": 2}, "world_size": 2, "trainer_api": "v2",
                  "timings": {"train_s": 3.5}}
        return ResultRecord(**{**values, **kwargs})

    def write(self, record=None, checkpoints=("checkpoint", "best")):
        record = record or self.record()
        for name in checkpoints:
            folder = getattr(self, name)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "model.pt"), "wb") as f:
                f.write(b"weights")
        Storage().write_bytes(result_uri(self.storage_uri, self.attempt), record.to_json().encode())
        return record

    def event(self, kind="train") -> JobEvent:
        return JobEvent.from_info(SID, {"status": "SUCCEEDED", "metadata": {
            META_RESULT_URI: result_uri(self.storage_uri, self.attempt), META_KIND: kind}})

    @property
    def consumed(self) -> str:
        return consumed_uri(self.storage_uri, self.attempt)

    def marker(self):
        return Storage().read_json(self.consumed)


def done(run, storage=None, try_number=3):
    return finish(run.event(), dashboard_url=URL, storage=storage or Storage(), try_number=try_number)


def test_success_returns_the_documented_dict_and_marks_the_attempt_consumed(tmp_path):
    run = Run(tmp_path)
    run.write(run.record(resumed_from="/elsewhere/attempt-0/checkpoint_000009"))
    result = done(run)
    expected = {
        "checkpoint_uri": run.checkpoint, "best_checkpoint_uri": run.best, "metrics": {"loss": 0.25, "epoch": 2},
        "submission_id": SID, "dashboard_url": URL, "storage_uri": run.storage_uri, "run_uri": run.run_uri,
        "world_size": 2, "attempt": 1, "trainer_api": "v2", "resumed_from": "/elsewhere/attempt-0/checkpoint_000009",
        "timings": {"train_s": 3.5}, "timeline_uri": None,  # no Horovod timeline was asked for
    }
    assert {k: result[k] for k in expected} == expected
    assert set(result) - set(expected) <= {"return_value"}
    json.dumps(result)
    assert run.marker() == {"submission_id": SID, "try_number": 3}


def test_best_checkpoint_defaults_to_the_last(tmp_path):
    run = Run(tmp_path)
    run.write(run.record(best_checkpoint_uri=None), checkpoints=("checkpoint",))
    assert done(run)["best_checkpoint_uri"] == run.checkpoint


@pytest.mark.parametrize("status, error_type", [("FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR"), ("STOPPED", None)])
def test_a_failed_job_raises_with_its_status_type_and_log_tail(tmp_path, status, error_type):
    run = Run(tmp_path)
    event = JobEvent.from_info(SID, {"status": status, "error_type": error_type, "message": "driver exited 1 ",
                                     "metadata": {META_RESULT_URI: result_uri(run.storage_uri, 1)}},
                               log_tail=["Traceback:", "ValueError: bad shape"])
    with pytest.raises(RayJobError) as err:
        finish(event, dashboard_url=URL, storage=Storage(), try_number=1)
    message = str(err.value)
    assert f"Ray job {SID} ended {status}" in message and "driver exited 1\n" in message
    assert message.endswith("Last lines of the job's log:\nTraceback:\nValueError: bad shape")
    assert (err.value.status, err.value.error_type, err.value.submission_id) == (status, error_type, SID)
    if error_type:
        assert f"({error_type})" in message
    assert not os.path.exists(run.consumed)


def test_an_error_event_without_a_status(tmp_path):
    with pytest.raises(RayJobError, match=r"ended in error: .*gone.*\n.*\n\(no log\)") as err:
        finish(JobEvent.error(SID, "gone"), dashboard_url=URL, storage=Storage(), try_number=1)
    assert err.value.status is None


def test_a_missing_record(tmp_path):
    run = Run(tmp_path)
    with pytest.raises(TrainingResultError) as err:
        done(run)
    assert f"wrote no result record at {result_uri(run.storage_uri, 1)}" in str(err.value)
    assert not os.path.exists(run.consumed)


def test_a_record_without_a_checkpoint(tmp_path):
    run = Run(tmp_path)
    run.write(run.record(checkpoint_uri=None, best_checkpoint_uri=None), checkpoints=())
    with pytest.raises(TrainingResultError, match="succeeded without a checkpoint.*ray.train.report"):
        done(run)
    assert not os.path.exists(run.consumed)


@pytest.mark.parametrize("written, missing", [
    ((), "checkpoint"),          # no checkpoint folder at all
    (("best",), "checkpoint"),   # the last one vanished
    (("checkpoint",), "best"),   # the best one vanished
])
def test_a_vanished_checkpoint_fails_and_retires_the_attempt(tmp_path, written, missing):
    run = Run(tmp_path)
    run.write(checkpoints=written)
    with pytest.raises(TrainingResultError) as err:
        done(run)
    uri = getattr(run, missing)
    assert f"reported checkpoint {uri}, but it is missing or empty" in str(err.value)
    assert "Retry or clear the task to train again" in str(err.value)
    assert run.marker() == {"submission_id": SID, "checkpoint_missing": uri}


def test_an_empty_checkpoint_folder_counts_as_missing(tmp_path):
    run = Run(tmp_path)
    run.write(checkpoints=("best",))
    os.makedirs(os.path.join(run.checkpoint, "empty_subfolder"))
    with pytest.raises(TrainingResultError, match=f"checkpoint {run.checkpoint}, but it is missing or empty"):
        done(run)
    assert run.marker()["checkpoint_missing"] == run.checkpoint


class ReadOnly(Storage):
    def write_bytes(self, uri, body):
        raise PermissionError("read-only storage")


def test_when_retiring_fails_the_message_says_a_retry_would_fail_again(tmp_path):
    run = Run(tmp_path)
    run.write(checkpoints=())
    with pytest.raises(TrainingResultError, match=r"Marking the attempt used up failed \(read-only storage\)"):
        done(run, storage=ReadOnly())
    assert not os.path.exists(run.consumed)


class Unreachable(Storage):
    def read_text(self, uri):
        raise ConnectionError("endpoint down")

    def folder_has_files(self, uri):
        raise ConnectionError("endpoint down")


def test_unreadable_storage_fails_without_retiring(tmp_path):
    run = Run(tmp_path)
    run.write()
    with pytest.raises(TrainingResultError, match="result record .* cannot be read: endpoint down.*retry the task"):
        done(run, storage=Unreachable())

    class RecordOnly(Unreachable):
        read_text = Storage.read_text

    with pytest.raises(TrainingResultError, match=f"checkpoint {run.checkpoint} cannot be checked: endpoint down"):
        done(run, storage=RecordOnly())
    assert not os.path.exists(run.consumed)


class NoStorage(Storage):
    def __getattribute__(self, name):
        if name in ("read_text", "write_bytes", "write_json", "folder_has_files", "exists"):
            raise AssertionError(f"storage.{name} used for a job that is not the provider's")
        return super().__getattribute__(name)


def test_a_job_that_is_not_the_providers():
    event = JobEvent.from_info("raysubmit_abc", {"status": "SUCCEEDED", "metadata": {"owner": "team"}})
    assert finish(event, dashboard_url=URL, storage=NoStorage(), try_number=1) == {
        "submission_id": "raysubmit_abc", "status": "SUCCEEDED", "dashboard_url": URL, "metadata": {"owner": "team"}}


def test_a_task_job_returns_its_functions_value(tmp_path):
    from airflow_provider_horovod.contract import TaskRecord

    run = Run(tmp_path)
    record = TaskRecord(submission_id=SID, attempt=1, storage_uri=run.storage_uri, run_uri=run.run_uri,
                        return_value={"accuracy": 0.9, "rows": [1, 2]}, timings={"run_s": 1.0})
    Storage().write_bytes(result_uri(run.storage_uri, 1), record.to_json().encode())
    result = finish(run.event("task"), dashboard_url=URL, storage=Storage(), try_number=2)
    assert result == {"return_value": {"accuracy": 0.9, "rows": [1, 2]}, "submission_id": SID, "dashboard_url": URL,
                      "storage_uri": run.storage_uri, "attempt": 1, "timings": {"run_s": 1.0}}
    assert run.marker() == {"submission_id": SID, "try_number": 2}


def test_push_result_pushes_the_checkpoint_uri():
    ti = FakeTI()
    result = {"checkpoint_uri": "s3://b/c", "metrics": {}}
    assert push_result({"ti": ti}, result) is result
    assert ti.xcoms == {XCOM_CHECKPOINT_URI: "s3://b/c"}
    ti = FakeTI()
    push_result({"ti": ti}, {"submission_id": "x", "status": "SUCCEEDED"})
    assert ti.xcoms == {}
