"""The finish step: a finished Ray job as the task's outcome, the verified result or a clear failure.
The operator (both wait paths), the sensor and the decorators finish through ``finish``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_horovod.contract import (
    META_KIND,
    META_RESULT_URI,
    XCOM_CHECKPOINT_URI,
    JobKind,
    ResultRecord,
    TaskRecord,
    consumed_uri,
    training_result,
)
from airflow_provider_horovod.exceptions import RayJobError, TrainingResultError

if TYPE_CHECKING:
    from airflow_provider_horovod.jobs.wait import JobEvent
    from airflow_provider_horovod.storage import Storage

log = logging.getLogger(__name__)


def finish(event: JobEvent, *, dashboard_url: str, storage: Storage, try_number: int | None) -> dict[str, Any]:
    """What a finished job gives its task, or the task's failure. For the provider's own jobs the
    attempt's record is read (a training's checkpoint checked), and the attempt is marked consumed
    (clearing the task later runs it anew): a training's result (``TrainingResult``), or a task's
    ``{"return_value", ...}``. Any other job gives its id, status and metadata."""
    raise_for_failure(event)
    sid, metadata = event.submission_id, event.metadata
    if not metadata.get(META_RESULT_URI):
        status = event.job_status.value if event.job_status else None
        return {"submission_id": sid, "status": status, "dashboard_url": dashboard_url, "metadata": metadata}
    result: dict[str, Any]
    record: TaskRecord
    if metadata.get(META_KIND) == JobKind.TASK.value:
        record = read_record(storage, metadata[META_RESULT_URI], sid, TaskRecord)
        result = {"return_value": record.return_value, "submission_id": sid, "dashboard_url": dashboard_url,
                  "storage_uri": record.storage_uri, "attempt": record.attempt, "timings": record.timings}
    else:
        training = read_record(storage, metadata[META_RESULT_URI], sid, ResultRecord)
        check_checkpoints(storage, training)
        result, record = dict(training_result(training, dashboard_url=dashboard_url)), training
    storage.write_json(consumed_uri(record.storage_uri, record.attempt), {"submission_id": sid,
                       "try_number": try_number})
    return result


def push_result(context: Any, result: dict[str, Any]) -> dict[str, Any]:
    """Push ``checkpoint_uri`` under its own key (for templates); the return value carries the rest."""
    if result.get("checkpoint_uri"):
        context["ti"].xcom_push(key=XCOM_CHECKPOINT_URI, value=result["checkpoint_uri"])
    return result


def failure_message(event: JobEvent) -> str:
    tail = "\n".join(event.log_tail[-40:]) or "(no log)"
    kind = f" ({event.error_type})" if event.error_type else ""
    status = event.job_status.value if event.job_status else "in error"
    reason = f"\nWhy: {event.reason}" if event.reason else ""
    return (f"Ray job {event.submission_id} ended {status}{kind}: {event.message.strip()}{reason}\n"
            f"Last lines of the job's log:\n{tail}")


def raise_for_failure(event: JobEvent) -> None:
    if not event.succeeded:
        raise RayJobError(failure_message(event), submission_id=event.submission_id,
                          status=event.job_status.value if event.job_status else None, error_type=event.error_type)


def read_record(storage: Storage, record_uri: str, submission_id: str, record_class: type[Any]) -> Any:
    try:
        text = storage.read_text(record_uri)
    except Exception as err:  # storage unreachable (StorageUnavailableError), OS errors
        raise TrainingResultError(
            f"Ray job {submission_id} succeeded but its result record {record_uri} cannot be read: {err} No "
            "checkpoint URI was pushed. Once the storage answers again, retry the task: it reuses the finished job."
        ) from err
    if text is None:
        raise TrainingResultError(
            f"Ray job {submission_id} succeeded but wrote no result record at {record_uri}. The training function "
            "may have ended without ray.train.report(...).")
    return record_class.from_json(text)


def check_checkpoints(storage: Storage, record: ResultRecord) -> None:
    """Every checkpoint the record names exists and holds files, or the task fails (no dangling URI)."""
    sid = record.submission_id
    if not record.checkpoint_uri:
        raise TrainingResultError(
            f"Ray job {sid} succeeded without a checkpoint: call ray.train.report(metrics, "
            "checkpoint=Checkpoint.from_directory(...)) on rank 0 at least once.")
    for uri in dict.fromkeys([record.checkpoint_uri, record.best_checkpoint_uri or record.checkpoint_uri]):
        try:
            present = storage.folder_has_files(uri)
        except Exception as err:
            raise TrainingResultError(
                f"Ray job {sid} succeeded but its checkpoint {uri} cannot be checked: {err} No checkpoint "
                "URI was pushed. Once the storage answers again, retry the task: it reuses the finished job.") from err
        if not present:
            retry = retire_attempt(storage, record, uri)
            raise TrainingResultError(
                f"Ray job {sid} succeeded and reported checkpoint {uri}, but it is missing or empty in "
                "storage: it may have been deleted (lifecycle rule, cleanup job) after training. No checkpoint URI "
                f"was pushed. {retry}")


def retire_attempt(storage: Storage, record: ResultRecord, missing_uri: str) -> str:
    """Mark an attempt whose checkpoint vanished as used up (a retry then trains a new one); say so."""
    try:
        storage.write_json(consumed_uri(record.storage_uri, record.attempt),
                           {"submission_id": record.submission_id, "checkpoint_missing": missing_uri})
    except Exception as err:  # best effort: the error above is what matters
        log.warning("Could not mark attempt %s as used up: %s", record.attempt, err)
        return (f"Marking the attempt used up failed ({err}), so a retry would reuse this job and fail again: give "
                "Airflow write access to the storage, then retry or clear the task.")
    return ("Retry or clear the task to train again (as a new attempt), and keep the storage's lifecycle rules away "
            "from checkpoints the next tasks still read.")
