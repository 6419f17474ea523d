"""One attempt's files read at once into a snapshot, on local disk and on S3 (moto's server): what is
there, what is not yet, and what could not be read, said rather than raised."""

from __future__ import annotations

import json

from airflow_provider_horovod.attempts import AttemptFiles, read_attempt
from airflow_provider_horovod.storage import Storage

HISTORY = [{"report": 1, "time": 1.0, "metrics": {"loss": 1.0}, "checkpoint": "checkpoint_000000"}]
GROUPS = [{"started_at": 10.0, "world_size": 2, "reason": "start"}]


def everything(storage: Storage, storage_uri: str, attempt: int) -> AttemptFiles:
    return read_attempt(storage, storage_uri, attempt, worker_groups=True, history=True, checkpoints=True)


def test_local_files_the_record_the_worker_groups_the_history_and_the_checkpoints_that_hold_files(tmp_path):
    before = everything(Storage(), str(tmp_path), 3)
    assert before == AttemptFiles(str(tmp_path), 3)  # nothing yet: no record, no history, nothing listed
    assert (before.folder, before.record_uri) == (f"{tmp_path}/attempt-3", f"{tmp_path}/attempt-3/result.json")
    folder = tmp_path / "attempt-3"
    (folder / "checkpoint_000001" / "nested").mkdir(parents=True)
    (folder / "checkpoint_000001" / "nested" / "model.pt").write_text("w")
    (folder / "checkpoint_000000").mkdir()  # emptied: Ray deleted it, or is still writing it
    (folder / "metrics_history.json").write_text(json.dumps(HISTORY))
    (folder / "result.json").write_text(json.dumps({"history": HISTORY, "unknown_field": 1}))
    (folder / "worker_groups.json").write_text(json.dumps(GROUPS))
    files = everything(Storage(), str(tmp_path), 3)
    assert files.record == {"history": HISTORY, "unknown_field": 1}  # as written, what this version ignores too
    assert (files.history, files.worker_groups, files.checkpoints) == (HISTORY, GROUPS, {"checkpoint_000001"})
    assert files.unread == {}
    assert files.checkpoint_uri("checkpoint_000001") == f"{tmp_path}/attempt-3/checkpoint_000001"
    only_the_record = read_attempt(Storage(), str(tmp_path), 3)
    assert only_the_record.record == files.record
    assert only_the_record.history is None
    assert only_the_record.worker_groups == []
    assert only_the_record.checkpoints is None


def test_the_folders_are_listed_only_when_a_report_named_a_checkpoint(tmp_path):
    class Counting(Storage):
        listings = 0

        def folders_with_files(self, uri):
            Counting.listings += 1
            return super().folders_with_files(uri)

    (tmp_path / "attempt-1").mkdir()
    (tmp_path / "attempt-1" / "metrics_history.json").write_text(json.dumps([{"report": 1, "checkpoint": None}]))
    assert everything(Counting(), str(tmp_path), 1).checkpoints is None
    assert Counting.listings == 0
    (tmp_path / "attempt-1" / "metrics_history.json").write_text(json.dumps(HISTORY))
    assert everything(Counting(), str(tmp_path), 1).checkpoints == frozenset()
    assert Counting.listings == 1


def test_what_cannot_be_read_is_said_in_the_snapshot_not_raised(tmp_path):
    class HistoryDown(Storage):
        def read_text(self, uri):
            if uri.endswith("metrics_history.json"):
                raise ConnectionError("the S3 endpoint does not answer")
            return super().read_text(uri)

    (tmp_path / "attempt-2").mkdir()
    (tmp_path / "attempt-2" / "result.json").write_text('{"cut sh')  # a file cut short
    files = everything(HistoryDown(), str(tmp_path), 2)
    assert set(files.unread) == {"record", "history"}
    assert files.record is None
    assert files.history is None
    assert str(files.unread["history"]) == "the S3 endpoint does not answer"
    assert isinstance(files.unread["record"], ValueError)


def test_s3_one_listing_finds_the_checkpoints_and_a_folder_marker_alone_is_no_checkpoint(s3):
    bucket = s3.bucket()
    client = s3.client()
    base = f"s3://{bucket}/runs/train"
    for key in (
        "runs/train/attempt-1/checkpoint_000002/model.pt",
        "runs/train/attempt-1/checkpoint_000002/",
        "runs/train/attempt-1/checkpoint_000001/",  # what a deleted checkpoint can leave
        "runs/train/attempt-1/metrics_history.json",
        "runs/train/attempt-10/checkpoint_000009/model.pt",
    ):
        client.put_object(Bucket=bucket, Key=key, Body=json.dumps(HISTORY).encode())
    files = everything(Storage(), base, 1)
    assert files.checkpoints == {"checkpoint_000002"}
    assert files.history == HISTORY
    assert files.record is None
    assert files.unread == {}
    assert everything(Storage(), f"s3://{bucket}/nothing", 1) == AttemptFiles(f"s3://{bucket}/nothing", 1)
