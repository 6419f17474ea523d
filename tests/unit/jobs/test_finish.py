"""The finish step against real storage (a local folder) and a real result record: the verified
result dict, or a failure that names what is wrong; the consumed marker only after a success (or
when a vanished checkpoint retires the attempt). A failed job's finish is tested in
test_finish_failures.py."""

import json
import os

import pytest

from airflow_provider_horovod.contract import (
    META_ATTEMPT,
    META_KIND,
    META_PRICES,
    META_RESULT_URI,
    META_STORAGE_URI,
    META_TAGS,
    META_WORKER_RESOURCES,
    consumed_uri,
    result_uri,
    worker_groups_uri,
)
from airflow_provider_horovod.documents import ResultRecord
from airflow_provider_horovod.exceptions import (
    InfrastructureError,
    TrainingResultError,
    UserCodeError,
)
from airflow_provider_horovod.failures import Failure, FailureClass
from airflow_provider_horovod.jobs.events import JobEvent
from airflow_provider_horovod.jobs.finish import finish
from airflow_provider_horovod.storage import Storage

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
        values = {
            "submission_id": SID,
            "attempt": self.attempt,
            "storage_uri": self.storage_uri,
            "run_uri": self.run_uri,
            "checkpoint_uri": self.checkpoint,
            "best_checkpoint_uri": self.best,
            "metrics": {"loss": 0.25, "epoch": 2},
            "world_size": 2,
            "trainer_api": "v2",
            "timings": {"train_s": 3.5},
        }
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
        return JobEvent.from_info(
            SID,
            {
                "status": "SUCCEEDED",
                "metadata": {META_RESULT_URI: result_uri(self.storage_uri, self.attempt), META_KIND: kind},
            },
        )

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
        "checkpoint_uri": run.checkpoint,
        "best_checkpoint_uri": run.best,
        "metrics": {"loss": 0.25, "epoch": 2},
        "submission_id": SID,
        "dashboard_url": URL,
        "storage_uri": run.storage_uri,
        "run_uri": run.run_uri,
        "world_size": 2,
        "attempt": 1,
        "trainer_api": "v2",
        "resumed_from": "/elsewhere/attempt-0/checkpoint_000009",
        "timings": {"train_s": 3.5},
        "timeline_uri": None,  # no Horovod timeline was asked for
        "checkpoint_score_attribute": None,
        "smoke_run": False,  # a real run
    }
    assert {k: result[k] for k in expected} == expected
    assert set(result) - set(expected) <= {"return_value", "attempts", "cost", "job_tags", "segments", "mlflow"}
    assert result["attempts"] == []
    assert result["job_tags"] == {}
    json.dumps(result)
    assert run.marker() == {"submission_id": SID, "try_number": 3}


class Counting(Storage):
    """Storage that notes every read and write, by file."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def read_text(self, uri):
        self.calls.append(("read", os.path.relpath(uri, self.root)))
        return super().read_text(uri)

    def write_bytes(self, uri, body):
        self.calls.append(("write", os.path.relpath(uri, self.root)))
        return super().write_bytes(uri, body)

    def folder_has_files(self, uri):
        self.calls.append(("check", os.path.relpath(uri, self.root)))
        return super().folder_has_files(uri)


def test_each_file_is_read_once_then_what_was_decided_is_written_once(tmp_path):
    run = Run(tmp_path, attempt=2)
    Storage().write_json(result_uri(run.storage_uri, 1), {"submission_id": "ahp-x-a1", "failure": {}})
    run.write()
    storage = Counting()
    storage.root = run.storage_uri
    done(run, storage=storage)
    assert storage.calls == [
        ("read", "attempt-1/result.json"),
        ("read", "attempt-1/worker_groups.json"),
        ("read", "attempt-2/result.json"),
        ("read", "attempt-2/worker_groups.json"),
        ("check", "attempt-2/checkpoint_000002"),
        ("check", "attempt-2/checkpoint_000001"),
        ("write", "attempt-2/result.json"),  # with the cost
        ("write", "attempt-2/consumed.json"),
    ]


def test_best_checkpoint_defaults_to_the_last(tmp_path):
    run = Run(tmp_path)
    run.write(run.record(best_checkpoint_uri=None), checkpoints=("checkpoint",))
    assert done(run)["best_checkpoint_uri"] == run.checkpoint


def test_a_success_after_failed_attempts_lists_them_with_their_classes(tmp_path):
    run = Run(tmp_path, attempt=3)
    for number, failure in (
        (1, Failure(FailureClass.INFRASTRUCTURE, "a worker died")),
        (2, Failure(FailureClass.PREEMPTION, "node drained")),
    ):
        Storage().write_json(
            result_uri(run.storage_uri, number), {"submission_id": f"ahp-x-a{number}", "failure": failure.to_dict()}
        )
    run.write()
    result = done(run)
    assert result["attempts"] == [
        {"attempt": 1, "submission_id": "ahp-x-a1", "failure_class": "infrastructure", "summary": "a worker died"},
        {"attempt": 2, "submission_id": "ahp-x-a2", "failure_class": "preemption", "summary": "node drained"},
    ]


def test_the_cost_counts_the_failed_attempt_and_is_kept_in_xcom_and_both_records(tmp_path):
    """Attempt 1 fails (its cost kept in its record, from Ray's times); attempt 2 succeeds: the result's
    cost has both, the failed one marked, and the succeeded attempt's record keeps it too."""
    run = Run(tmp_path, attempt=2)
    metadata = {
        META_STORAGE_URI: run.storage_uri,
        META_WORKER_RESOURCES: '{"CPU": 1.0}',
        META_PRICES: '{"cpu_hour": 3.6, "currency": "USD"}',
        META_TAGS: '["team"]',
        "team": "ranking",
    }
    first_uri = result_uri(run.storage_uri, 1)
    Storage().write_json(
        first_uri,
        {
            "submission_id": "ahp-x-a1",
            "attempt": 1,
            "storage_uri": run.storage_uri,
            "run_uri": f"{run.storage_uri}/attempt-1",
            "timings": {"started_at": 1002.0, "finished_at": 1030.0},
        },
    )
    Storage().write_json(worker_groups_uri(f"{run.storage_uri}/attempt-1"), [{"started_at": 1010.0, "world_size": 2}])
    failed = JobEvent.from_info(
        "ahp-x-a1",
        {
            "status": "FAILED",
            "start_time": 1000_000,
            "end_time": 1031_000,
            "metadata": {**metadata, META_RESULT_URI: first_uri, META_ATTEMPT: "1"},
        },
    )
    with pytest.raises(InfrastructureError):
        finish(failed, dashboard_url=URL, storage=Storage(), try_number=1)
    kept = Storage().read_json(first_uri)["cost"]
    assert kept["attempts"][0]["failed"]
    assert kept["attempts"][0]["worker_s"] == 40.0  # 2 x (1030 - 1010)

    run.write(run.record(timings={"started_at": 1100.0, "finished_at": 1150.0}))
    Storage().write_json(worker_groups_uri(run.run_uri), [{"started_at": 1105.0, "world_size": 2}])
    event = JobEvent.from_info(
        SID,
        {
            "status": "SUCCEEDED",
            "start_time": 1095_000,
            "end_time": 1151_500,
            "metadata": {
                **metadata,
                META_RESULT_URI: result_uri(run.storage_uri, 2),
                META_KIND: "train",
                META_ATTEMPT: "2",
            },
        },
    )
    result = finish(event, dashboard_url=URL, storage=Storage(), try_number=2)
    cost = result["cost"]
    assert [(a["attempt"], a["failed"], a["worker_s"]) for a in cost["attempts"]] == [(1, True, 40.0), (2, False, 90.0)]
    assert cost["attempts"][1]["wall_s"] == 56.5
    assert cost["attempts"][1]["queued_s"] == 10.0
    assert cost["total"]["worker_s"] == 130.0
    assert cost["total"]["failed_worker_s"] == 40.0
    assert cost["total"]["amount"] == pytest.approx(0.13)
    assert cost["prices"]["currency"] == "USD"
    assert result["job_tags"] == {"team": "ranking"}
    assert Storage().read_json(result_uri(run.storage_uri, 2))["cost"] == cost
    json.dumps(result)


def test_a_missing_record(tmp_path):
    run = Run(tmp_path)
    with pytest.raises(UserCodeError) as err:
        done(run)
    assert f"wrote no result record at {result_uri(run.storage_uri, 1)}" in str(err.value)
    assert not os.path.exists(run.consumed)


def test_a_record_without_a_checkpoint(tmp_path):
    run = Run(tmp_path)
    run.write(run.record(checkpoint_uri=None, best_checkpoint_uri=None), checkpoints=())
    with pytest.raises(UserCodeError, match="succeeded without a checkpoint.*ray.train.report"):
        done(run)
    assert not os.path.exists(run.consumed)


@pytest.mark.parametrize(
    "written, missing",
    [
        ((), "checkpoint"),  # no checkpoint folder at all
        (("best",), "checkpoint"),  # the last one vanished
        (("checkpoint",), "best"),  # the best one vanished
    ],
)
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
        "submission_id": "raysubmit_abc",
        "status": "SUCCEEDED",
        "dashboard_url": URL,
        "metadata": {"owner": "team"},
        "job_tags": {},
    }


def test_a_task_job_returns_its_functions_value(tmp_path):
    from airflow_provider_horovod.documents import TaskRecord

    run = Run(tmp_path)
    record = TaskRecord(
        submission_id=SID,
        attempt=1,
        storage_uri=run.storage_uri,
        run_uri=run.run_uri,
        return_value={"accuracy": 0.9, "rows": [1, 2]},
        timings={"run_s": 1.0, "started_at": 10.0, "finished_at": 13.0},
    )
    Storage().write_bytes(result_uri(run.storage_uri, 1), record.to_json().encode())
    event = JobEvent.from_info(
        SID,
        {
            "status": "SUCCEEDED",
            "start_time": 9000,
            "end_time": 14000,
            "metadata": {
                META_RESULT_URI: result_uri(run.storage_uri, 1),
                META_KIND: "task",
                META_WORKER_RESOURCES: '{"GPU": 1.0}',
            },
        },
    )
    result = finish(event, dashboard_url=URL, storage=Storage(), try_number=2)
    cost = result.pop("cost")
    assert result == {
        "return_value": {"accuracy": 0.9, "rows": [1, 2]},
        "submission_id": SID,
        "dashboard_url": URL,
        "storage_uri": run.storage_uri,
        "attempt": 1,
        "job_tags": {},
        "timings": {"run_s": 1.0, "started_at": 10.0, "finished_at": 13.0},
    }
    # The driver is the task's one worker: it held its GPU from its start to its end.
    (spent,) = cost["attempts"]
    assert (spent["wall_s"], spent["queued_s"], spent["worker_s"], spent["gpu_s"]) == (5.0, 1.0, 3.0, 3.0)
    assert run.marker() == {"submission_id": SID, "try_number": 2}
