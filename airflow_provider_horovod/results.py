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
    """Read the job's result record and check that its checkpoint really exists."""
    record_uri = metadata[f"{META_PREFIX}result_uri"]
    try:
        text = storage.read_text(record_uri)
    except Exception as err:  # boto3/OS errors: storage unreachable
        raise TrainingResultError(
            f"Ray job {submission_id} succeeded but its result record {record_uri} cannot be read "
            f"({type(err).__name__}: {err}). Check the storage and the aws_conn_id connection."
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
    for uri in {record.checkpoint_uri, record.best_checkpoint_uri or record.checkpoint_uri}:
        if not storage.folder_has_files(uri):
            raise TrainingResultError(
                f"Ray job {submission_id} reported checkpoint {uri}, but it is missing or empty in "
                "storage. It may have been deleted (lifecycle rule, cleanup job) after training."
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


def mark_consumed(storage: Storage, result: dict, *, try_number: int | None) -> None:
    """Remember that a task try finished with this attempt: clearing the task later trains anew."""
    storage.write_json(
        consumed_uri(result["storage_uri"], result["attempt"]),
        {"submission_id": result["submission_id"], "try_number": try_number},
    )


def push_result(context, result: dict) -> dict:
    context["ti"].xcom_push(key=XCOM_CHECKPOINT_URI, value=result["checkpoint_uri"])
    return result
