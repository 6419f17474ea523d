"""The finish step: a finished Ray job as the task's outcome, the verified result or a clear failure
of one of six classes (``failures``), its post-mortem kept beside the attempt's checkpoints. The
operator (both wait paths), the sensor and the decorators finish through ``finish``."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_horovod import cost, failures
from airflow_provider_horovod.contract import (
    LOG_TAIL_LINES,
    META_ATTEMPT,
    META_KIND,
    META_PRICES,
    META_RESULT_URI,
    META_STORAGE_URI,
    META_WORKER_RESOURCES,
    XCOM_CHECKPOINT_URI,
    Cost,
    JobKind,
    ResultRecord,
    TaskRecord,
    attempt_uri,
    consumed_uri,
    job_tags_of,
    result_uri,
    training_result,
    worker_groups_uri,
)
from airflow_provider_horovod.exceptions import JobFailure, TrainingResultError, UserCodeError

if TYPE_CHECKING:
    from airflow_provider_horovod.jobs.wait import JobEvent
    from airflow_provider_horovod.storage import Storage

log = logging.getLogger(__name__)


def finish(event: JobEvent, *, dashboard_url: str, storage: Storage, try_number: int | None) -> dict[str, Any]:
    """What a finished job gives its task, or the task's failure. For the provider's own jobs the
    attempt's record is read (a training's checkpoint checked), and the attempt is marked consumed
    (clearing the task later runs it anew): a training's result (``TrainingResult``), or a task's
    ``{"return_value", ...}``. Any other job gives its id, status and metadata."""
    if not event.succeeded:
        raise failed(event, storage)
    sid, metadata = event.submission_id, event.metadata
    tags = job_tags_of(metadata)
    if not metadata.get(META_RESULT_URI):
        status = event.job_status.value if event.job_status else None
        return {
            "submission_id": sid,
            "status": status,
            "dashboard_url": dashboard_url,
            "metadata": metadata,
            "job_tags": tags,
        }
    result: dict[str, Any]
    record: TaskRecord
    if metadata.get(META_KIND) == JobKind.TASK.value:
        record = read_record(storage, metadata[META_RESULT_URI], sid, TaskRecord)
        spent = keep_cost(storage, event, record, earlier_records(storage, record.storage_uri, record.attempt))
        result = {
            "return_value": record.return_value,
            "submission_id": sid,
            "dashboard_url": dashboard_url,
            "storage_uri": record.storage_uri,
            "attempt": record.attempt,
            "timings": record.timings,
            "cost": spent,
            "job_tags": tags,
        }
    else:
        training = read_record(storage, metadata[META_RESULT_URI], sid, ResultRecord)
        check_checkpoints(storage, training)
        earlier = earlier_records(storage, training.storage_uri, training.attempt)
        spent = keep_cost(storage, event, training, earlier)
        result = dict(
            training_result(
                training, dashboard_url=dashboard_url, attempts=earlier_attempts(earlier), cost=spent, job_tags=tags
            )
        )
        record = training
    storage.write_json(
        consumed_uri(record.storage_uri, record.attempt), {"submission_id": sid, "try_number": try_number}
    )
    return result


def push_result(context: Any, result: dict[str, Any]) -> dict[str, Any]:
    """Push ``checkpoint_uri`` under its own key (for templates); the return value carries the rest."""
    if result.get("checkpoint_uri"):
        context["ti"].xcom_push(key=XCOM_CHECKPOINT_URI, value=result["checkpoint_uri"])
    return result


def failed(event: JobEvent, storage: Storage) -> JobFailure:
    """The failure of a job that did not succeed: its class decided once (``failures.of_job``, from the
    runtime's verdict and Ray's job info), its post-mortem kept beside the attempt's checkpoints."""
    runtime = failures.Failure.from_dict(event.failure) if event.failure else None
    info = {
        "status": event.job_status.value if event.job_status else None,
        "error_type": event.error_type,
        "driver_exit_code": event.driver_exit_code,
        "message": event.message,
    }
    failure = failures.of_job(info, runtime, provider_job=bool(event.metadata.get(META_RESULT_URI)))
    failure = failures.with_network_reason(failure, event.log_tail)
    keep_post_mortem(storage, event, failure)
    return failure.failure_class.error(
        failure_message(event, failure),
        failure=failure.to_dict(),
        submission_id=event.submission_id,
        status=event.job_status.value if event.job_status else None,
        error_type=event.error_type,
    )


def failure_message(event: JobEvent, failure: failures.Failure) -> str:
    """What the task's log ends with: how the job ended, the log's last lines where the runtime gave no
    verdict of its own (a killed driver), then the answer: class, rank, exception, frames, what to do."""
    kind = f" ({event.error_type})" if event.error_type else ""
    status = event.job_status.value if event.job_status else "in error"
    head = f"Ray job {event.submission_id} ended {status}{kind}: {event.message.strip() or failure.summary}"
    if not event.failure and event.log_tail:
        head += "\nLast lines of the job's log:\n" + "\n".join(event.log_tail[-LOG_TAIL_LINES:])
    return f"{head}\n{failure.explain()}"


def keep_post_mortem(storage: Storage, event: JobEvent, failure: failures.Failure) -> None:
    """Complete the failed attempt's record with the final class and the log's last lines (or write it,
    when the runtime could not): a platform team reads why a run failed after the cluster is gone."""
    uri, attempt = event.metadata.get(META_RESULT_URI), event.metadata.get(META_ATTEMPT)
    if not uri or not attempt:
        return
    try:
        written = storage.read_json(uri) or {}
        storage_uri = event.metadata.get(META_STORAGE_URI) or ""
        record = {
            "submission_id": event.submission_id,
            "attempt": int(attempt),
            "storage_uri": storage_uri,
            "run_uri": attempt_uri(storage_uri, int(attempt)),
            **written,
            "failure": failure.to_dict(),
            "log_tail": list(event.log_tail[-LOG_TAIL_LINES:]),
        }
        spent = run_cost(storage, event, record, earlier_records(storage, storage_uri, int(attempt)))
        storage.write_json(uri, {**record, "cost": spent})
        log.info("%s (this failed attempt included)", cost.summary(spent))
    except Exception as err:  # the failure itself is what the task must say
        log.warning("Could not keep the failed attempt's record at %s: %s", uri, err)


def earlier_records(storage: Storage, storage_uri: str, attempt: int) -> list[dict[str, Any]]:
    """The records of the task run's attempts before ``attempt`` (``{"attempt": n}`` where none can be read)."""
    found = []
    for number in range(1, attempt):
        try:
            record = storage.read_json(result_uri(storage_uri, number)) or {}
        except Exception:  # an earlier attempt's record only informs; it never fails the task
            record = {}
        found.append({"attempt": number, **record})
    return found


def earlier_attempts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The attempts before this one, with why each failed (from their records)."""
    found = []
    for record in records:
        failure = record.get("failure") or {}
        found.append(
            {
                "attempt": record["attempt"],
                "submission_id": record.get("submission_id"),
                "failure_class": failure.get("failure_class"),
                "summary": failure.get("summary"),
            }
        )
    return found


# --- the cost ----------------------------------------------------------------------------------------


def keep_cost(storage: Storage, event: JobEvent, record: TaskRecord, earlier: list[dict[str, Any]]) -> Cost:
    """The task run's cost up to this succeeded attempt, kept in its record too (best effort; the record
    as written, fields this version does not know included)."""
    uri = event.metadata[META_RESULT_URI]
    try:
        written = storage.read_json(uri) or dataclasses.asdict(record)
    except Exception:  # it was read a moment ago; the cost informs
        written = dataclasses.asdict(record)
    spent = run_cost(storage, event, written, earlier)
    try:
        storage.write_json(uri, {**written, "cost": spent})
    except Exception as err:  # the result stands without the cost in the record
        log.warning("Could not keep the cost in the attempt's record at %s: %s", uri, err)
    return spent


def run_cost(storage: Storage, event: JobEvent, record: dict[str, Any], earlier: list[dict[str, Any]]) -> Cost:
    """What this attempt (Ray's own times, from the event) and the earlier ones (their kept cost, else their
    records' times) held. ``record``: this attempt's record as JSON."""
    per_worker = _json_metadata(event.metadata, META_WORKER_RESOURCES) or {}
    prices = _json_metadata(event.metadata, META_PRICES)
    attempts = [earlier_cost(storage, rec, per_worker, prices) for rec in earlier]
    attempts.append(
        cost.attempt_cost(
            record,
            failed=not event.succeeded,
            submitted_at=event.start_time,
            ended_at=event.end_time,
            worker_groups=worker_groups(storage, event, record),
            per_worker=per_worker,
            prices=prices,
        )
    )
    return cost.task_run_cost(attempts, per_worker=per_worker, prices=prices)


def earlier_cost(storage: Storage, record: dict[str, Any], per_worker: dict, prices: dict | None) -> Any:
    """An earlier attempt's cost: as kept when it ended (Ray's times), else from its record."""
    kept = [a for a in (record.get("cost") or {}).get("attempts") or [] if a.get("attempt") == record["attempt"]]
    if kept:
        return kept[0]
    failed = not record.get("checkpoint_uri") or bool(record.get("failure"))
    run_uri = record.get("run_uri")
    try:
        groups: Any = (storage.read_json(worker_groups_uri(run_uri)) or []) if run_uri else []
    except Exception:  # as above: it informs
        groups = []
    return cost.attempt_cost(
        record,
        failed=failed,
        submitted_at=None,
        ended_at=None,
        worker_groups=list(groups),
        per_worker=per_worker,
        prices=prices,
    )


def worker_groups(storage: Storage, event: JobEvent, record: dict[str, Any]) -> list[dict[str, Any]]:
    """When the attempt's workers started: rank 0's notes for a training; a task job's driver is its worker."""
    if event.metadata.get(META_KIND) == JobKind.TASK.value:
        started = (record.get("timings") or {}).get("started_at")
        return [{"started_at": started, "world_size": 1}] if started else []
    try:
        return list(storage.read_json(worker_groups_uri(record["run_uri"])) or [])
    except Exception:  # the cost informs; without the notes it counts no worker-seconds
        return []


def _json_metadata(metadata: dict[str, str], key: str) -> Any:
    try:
        return json.loads(metadata[key]) if metadata.get(key) else None
    except ValueError:
        return None


def read_record(storage: Storage, record_uri: str, submission_id: str, record_class: type[Any]) -> Any:
    try:
        text = storage.read_text(record_uri)
    except Exception as err:  # storage unreachable (StorageUnavailableError), OS errors
        raise TrainingResultError(
            f"Ray job {submission_id} succeeded but its result record {record_uri} cannot be read: {err} No "
            "checkpoint URI was pushed. Once the storage answers again, retry the task: it reuses the finished job."
        ) from err
    if text is None:
        raise UserCodeError(
            f"Ray job {submission_id} succeeded but wrote no result record at {record_uri}. The training function "
            "may have ended without ray.train.report(...).",
            submission_id=submission_id,
        )
    return record_class.from_json(text)


def check_checkpoints(storage: Storage, record: ResultRecord) -> None:
    """Every checkpoint the record names exists and holds files, or the task fails (no dangling URI)."""
    sid = record.submission_id
    if not record.checkpoint_uri:
        raise UserCodeError(
            f"Ray job {sid} succeeded without a checkpoint: call ray.train.report(metrics, "
            "checkpoint=Checkpoint.from_directory(...)) on rank 0 at least once.",
            submission_id=sid,
        )
    for uri in dict.fromkeys([record.checkpoint_uri, record.best_checkpoint_uri or record.checkpoint_uri]):
        try:
            present = storage.folder_has_files(uri)
        except Exception as err:
            raise TrainingResultError(
                f"Ray job {sid} succeeded but its checkpoint {uri} cannot be checked: {err} No checkpoint "
                "URI was pushed. Once the storage answers again, retry the task: it reuses the finished job."
            ) from err
        if not present:
            retry = retire_attempt(storage, record, uri)
            raise TrainingResultError(
                f"Ray job {sid} succeeded and reported checkpoint {uri}, but it is missing or empty in "
                "storage: it may have been deleted (lifecycle rule, cleanup job) after training. No checkpoint URI "
                f"was pushed. {retry}"
            )


def retire_attempt(storage: Storage, record: ResultRecord, missing_uri: str) -> str:
    """Mark an attempt whose checkpoint vanished as used up (a retry then trains a new one); say so."""
    try:
        storage.write_json(
            consumed_uri(record.storage_uri, record.attempt),
            {"submission_id": record.submission_id, "checkpoint_missing": missing_uri},
        )
    except Exception as err:  # best effort: the error above is what matters
        log.warning("Could not mark attempt %s as used up: %s", record.attempt, err)
        return (
            f"Marking the attempt used up failed ({err}), so a retry would reuse this job and fail again: give "
            "Airflow write access to the storage, then retry or clear the task."
        )
    return (
        "Retry or clear the task to train again (as a new attempt), and keep the storage's lifecycle rules away "
        "from checkpoints the next tasks still read."
    )
