"""An attempt's files as the plugin reads them, on local disk and on S3 (moto's server)."""

from __future__ import annotations

import json

from airflow_provider_horovod.plugins.data import AttemptFiles

HISTORY = [{"report": 1, "time": 1.0, "metrics": {"loss": 1.0}, "checkpoint": "checkpoint_000000"}]


def test_local_files_the_live_history_the_record_and_the_checkpoints_that_hold_files(tmp_path):
    files = AttemptFiles(str(tmp_path), 3)
    assert (files.folder, files.history(), files.record(), files.folders_with_files()) == (
        f"{tmp_path}/attempt-3",
        None,
        None,
        set(),
    )
    folder = tmp_path / "attempt-3"
    (folder / "checkpoint_000001" / "nested").mkdir(parents=True)
    (folder / "checkpoint_000001" / "nested" / "model.pt").write_text("w")
    (folder / "checkpoint_000000").mkdir()  # emptied: Ray deleted it, or is still writing it
    (folder / "metrics_history.json").write_text(json.dumps(HISTORY))
    (folder / "result.json").write_text(json.dumps({"history": HISTORY}))
    assert files.history() == HISTORY and files.record() == {"history": HISTORY}
    assert files.folders_with_files() == {"checkpoint_000001"}
    assert files.checkpoint_uri("checkpoint_000001") == f"{tmp_path}/attempt-3/checkpoint_000001"


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
    files = AttemptFiles(base, 1)
    assert files.folders_with_files() == {"checkpoint_000002"}
    assert files.history() == HISTORY and files.record() is None
    assert AttemptFiles(f"s3://{bucket}/nothing", 1).folders_with_files() == set()
