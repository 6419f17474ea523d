"""Turning a finished Ray job into the task's outcome: the verified result dict, or a clear failure.

Shared by the operator (both wait paths) and the sensor, so all of them return the same dict.
"""

from __future__ import annotations

import logging

from airflow_provider_horovod.exceptions import RayJobError, TrainingResultError
from airflow_provider_horovod.spec import ResultRecord, consumed_uri
from airflow_provider_horovod.storage import Storage
from airflow_provider_horovod.training import META_PREFIX

log = logging.getLogger(__name__)

XCOM_CHECKPOINT_URI = "checkpoint_uri"
XCOM_SUBMISSION_ID = "submission_id"


def failure_message(submission_id: str, job_status: str | None, error_type: str | None, message: str,
                    log_tail: list[str]) -> str:
    tail = "\n".join(log_tail[-40:]) or "(no log)"
    kind = f" ({error_type})" if error_type else ""
    return (
        f"Ray job {submission_id} ended {job_status or 'in error'}{kind}: {message.strip()}\n"
        f"Last lines of the job's log:\n{tail}"
    )


def raise_for_failure(submission_id: str, job_status: str | None, error_type: str | None, message: str,
                      log_tail: list[str]) -> None:
    raise RayJobError(
        failure_message(submission_id, job_status, error_type, message, log_tail),
        submission_id=submission_id, status=job_status, error_type=error_type,
    )


def is_provider_job(metadata: dict | None) -> bool:
    return bool(metadata and metadata.get(f"{META_PREFIX}result_uri"))


def collect_result(metadata: dict, *, submission_id: str, dashboard_url: str, storage: Storage) -> dict:
    """Read the job's result record and check that its checkpoints really exist.

    Raises :class:`TrainingResultError` when the record cannot be read or a checkpoint it names is
    missing or empty: the task fails rather than hand a dangling URI downstream. A succeeded attempt
    whose checkpoint is gone is marked used up (as ``mark_consumed`` does), so the task's retry trains
    a new attempt instead of reusing it and failing again.
    """
    record_uri = metadata[f"{META_PREFIX}result_uri"]
    try:
        text = storage.read_text(record_uri)
    except Exception as err:  # storage unreachable (StorageUnavailableError), OS errors
        raise TrainingResultError(
            f"Ray job {submission_id} succeeded but its result record {record_uri} cannot be read: {err} "
            "No checkpoint URI was pushed. Once the storage answers again, retry the task: it reuses "
            "the finished job."
        ) from err
    if text is None:
        raise TrainingResultError(
            f"Ray job {submission_id} succeeded but wrote no result record at {record_uri}. "
            "The training function may have ended without ray.train.report(...)."
        )
    record = ResultRecord.from_json(text)
    if not record.checkpoint_uri:
        raise TrainingResultError(
            f"Ray job {submission_id} succeeded without a checkpoint: call ray.train.report(metrics, "
            "checkpoint=Checkpoint.from_directory(...)) on rank 0 at least once."
        )
    for uri in dict.fromkeys([record.checkpoint_uri, record.best_checkpoint_uri or record.checkpoint_uri]):
        try:
            present = storage.folder_has_files(uri)
        except Exception as err:
            raise TrainingResultError(
                f"Ray job {submission_id} succeeded but its checkpoint {uri} cannot be checked: {err} "
                "No checkpoint URI was pushed. Once the storage answers again, retry the task: it "
                "reuses the finished job."
            ) from err
        if not present:
            retry = _retire_attempt(storage, record, submission_id, uri)
            raise TrainingResultError(
                f"Ray job {submission_id} succeeded and reported checkpoint {uri}, but it is missing or "
                "empty in storage: it may have been deleted (lifecycle rule, cleanup job) after training. "
                f"No checkpoint URI was pushed. {retry}"
            )
    return {
        "checkpoint_uri": record.checkpoint_uri,
        "best_checkpoint_uri": record.best_checkpoint_uri or record.checkpoint_uri,
        "metrics": record.metrics,
        "submission_id": submission_id,
        "dashboard_url": dashboard_url,
        "storage_uri": record.storage_uri,
        "run_uri": record.run_uri,
        "world_size": record.world_size,
        "attempt": record.attempt,
        "trainer_api": record.trainer_api,
        "resumed_from": record.resumed_from,
        "timings": record.timings,
    }


def _retire_attempt(storage: Storage, record: ResultRecord, submission_id: str, missing_uri: str) -> str:
    """Mark an attempt whose checkpoint vanished as used up; say what a retry of the task does."""
    try:
        storage.write_json(consumed_uri(record.storage_uri, record.attempt),
                           {"submission_id": submission_id, "checkpoint_missing": missing_uri})
    except Exception as err:  # best effort: the error above is what matters
        log.warning("Could not mark attempt %s as used up: %s", record.attempt, err)
        return (f"Marking the attempt used up failed ({err}), so a retry would reuse this job and fail "
                "again: give Airflow write access to the storage, then retry or clear the task.")
    return ("Retry or clear the task to train again (as a new attempt), and keep the storage's lifecycle "
            "rules away from checkpoints the next tasks still read.")


def mark_consumed(storage: Storage, result: dict, *, try_number: int | None) -> None:
    """Remember that a task try finished with this attempt: clearing the task later trains anew."""
    storage.write_json(
        consumed_uri(result["storage_uri"], result["attempt"]),
        {"submission_id": result["submission_id"], "try_number": try_number},
    )


def push_result(context, result: dict) -> dict:
    context["ti"].xcom_push(key=XCOM_CHECKPOINT_URI, value=result["checkpoint_uri"])
    return result
