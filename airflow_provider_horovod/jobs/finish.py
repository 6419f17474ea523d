"""The finish step: a finished Ray job as the task's outcome, the verified result or a clear failure
of one of six classes (``failures``), its post-mortem kept beside the attempt's checkpoints. The
operator (both wait paths), the sensor and the decorators finish through ``finish``.

Each way through reads the task run's files once (``read_task_run``: every attempt's record and
worker groups, and what the checkpoints hold), decides from them without touching storage
(``succeeded``, ``post_mortem``, ``run_cost``), then writes once (``keep``, ``keep_post_mortem``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_horovod import cost, failures
from airflow_provider_horovod.attempts import AttemptFiles, read_attempt
from airflow_provider_horovod.contract import (
    LOG_TAIL_LINES,
    META_KIND,
    META_MARK_TOKEN,
    META_PRICES,
    META_RESULT_URI,
    META_WORKER_RESOURCES,
    JobKind,
    attempt_of_record,
    consumed_uri,
    job_tags_of,
)
from airflow_provider_horovod.documents import (
    CHECKSUM,
    Cost,
    ResultRecord,
    TaskRecord,
    checksum,
    sealed,
    training_result,
)
from airflow_provider_horovod.exceptions import JobFailure, TrainingResultError, UserCodeError

if TYPE_CHECKING:
    from airflow_provider_horovod.jobs.events import JobEvent
    from airflow_provider_horovod.storage import Storage

log = logging.getLogger(__name__)


def finish(event: JobEvent, *, dashboard_url: str, storage: Storage, try_number: int | None) -> dict[str, Any]:
    """What a finished job gives its task, or the task's failure. For the provider's own jobs the
    attempt's record is read (a training's checkpoint checked), and the attempt is marked consumed
    (clearing the task later runs it anew): a training's result (``TrainingResult``), or a task's
    ``{"return_value", ...}``. Any other job gives its id, status and metadata."""
    if not event.succeeded:
        raise failed(event, storage)
    if not event.metadata.get(META_RESULT_URI):
        return {
            "submission_id": event.submission_id,
            "status": event.job_status.value if event.job_status else None,
            "dashboard_url": dashboard_url,
            "metadata": event.metadata,
            "job_tags": job_tags_of(event.metadata),
        }
    files = read_task_run(storage, event)
    done = succeeded(event, files, dashboard_url=dashboard_url, try_number=try_number)
    return keep(storage, files, done)


# --- read -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskRunFiles:
    """What the finish step reads of a task run, once: every attempt's files up to the job's (records and
    worker groups), and, for a succeeded training, whether each checkpoint its record names holds files
    (an error where that could not be checked)."""

    attempts: list[AttemptFiles]
    checkpoints: dict[str, bool | Exception] = dataclasses.field(default_factory=dict)

    @property
    def this(self) -> AttemptFiles:
        return self.attempts[-1]

    @property
    def earlier(self) -> list[AttemptFiles]:
        return self.attempts[:-1]


def is_task_job(event: JobEvent) -> bool:
    return event.metadata.get(META_KIND) == JobKind.TASK.value


def read_task_run(storage: Storage, event: JobEvent) -> TaskRunFiles:
    """The files of the job's attempt and of those before it (the job's metadata says where its record is)."""
    storage_uri, attempt = attempt_of_record(event.metadata[META_RESULT_URI])
    attempts = [read_attempt(storage, storage_uri, n, worker_groups=True) for n in range(1, attempt)]
    # A task job's driver is its one worker: its record says when it started; a training's rank 0 notes it.
    attempts.append(read_attempt(storage, storage_uri, attempt, worker_groups=not is_task_job(event)))
    record = attempts[-1].record
    if not event.succeeded or is_task_job(event) or not record or not record.get("checkpoint_uri"):
        return TaskRunFiles(attempts)
    uris = [record["checkpoint_uri"], record.get("best_checkpoint_uri") or record["checkpoint_uri"]]
    if not all(isinstance(uri, str) for uri in uris):  # an edited record: the decision refuses it by name
        return TaskRunFiles(attempts)
    present: dict[str, bool | Exception] = {}
    for uri in dict.fromkeys(uris):
        try:
            present[uri] = storage.folder_has_files(uri)
        except Exception as err:  # the decision says it could not be checked
            present[uri] = err
    return TaskRunFiles(attempts, present)


# --- decide -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Succeeded:
    """What a succeeded job's files decide: the task's ``result`` and what to keep (the attempt's
    ``record`` with its cost, the ``consumed`` marker); or a ``missing_checkpoint`` its record names."""

    submission_id: str
    result: dict[str, Any] = dataclasses.field(default_factory=dict)
    record: dict[str, Any] = dataclasses.field(default_factory=dict)
    consumed: dict[str, Any] = dataclasses.field(default_factory=dict)
    missing_checkpoint: str | None = None


def succeeded(event: JobEvent, files: TaskRunFiles, *, dashboard_url: str, try_number: int | None) -> Succeeded:
    """The task's result from a succeeded job's files; raises when they hold none."""
    sid, this = event.submission_id, files.this
    if "record" in this.unread:  # storage unreachable (StorageUnavailableError), OS errors
        err = this.unread["record"]
        raise TrainingResultError(
            f"Ray job {sid} succeeded but its result record {this.record_uri} cannot be read: {err} No "
            "checkpoint URI was pushed. Once the storage answers again, retry the task: it reuses the finished job."
        ) from err
    if this.record is None:
        raise UserCodeError(
            f"Ray job {sid} succeeded but wrote no result record at {this.record_uri}. The training function "
            "may have ended without ray.train.report(...).",
            submission_id=sid,
        )
    tags = job_tags_of(event.metadata)
    # The jobs that carry a mark token are of this provider's version, whose runtime seals its records.
    sealed_by_job = bool(event.metadata.get(META_MARK_TOKEN))
    if is_task_job(event):
        task = this_jobs_record(sid, this, TaskRecord, sealed_by_job=sealed_by_job)
        spent = run_cost(event, files, this.record)
        result = {
            "return_value": task.return_value,
            "submission_id": sid,
            "dashboard_url": dashboard_url,
            "storage_uri": task.storage_uri,
            "attempt": task.attempt,
            "timings": task.timings,
            "cost": spent,
            "job_tags": tags,
        }
    else:
        training = this_jobs_record(sid, this, ResultRecord, sealed_by_job=sealed_by_job)
        if missing := missing_checkpoint(training, files.checkpoints):
            return Succeeded(sid, missing_checkpoint=missing)
        spent = run_cost(event, files, this.record)
        attempts = earlier_attempts(files.earlier)
        result = dict(
            training_result(training, dashboard_url=dashboard_url, attempts=attempts, cost=spent, job_tags=tags)
        )
    return Succeeded(
        sid,
        result=result,
        record=sealed({**this.record, "cost": spent}),
        consumed={"submission_id": sid, "try_number": try_number},
    )


def this_jobs_record(sid: str, this: AttemptFiles, kind: type[TaskRecord], *, sealed_by_job: bool) -> Any:
    """The attempt's record as ``kind``, refused by name when it is not the one this job wrote: edited (its
    fields do not match its checksum, or have none where ``sealed_by_job``: a job of this provider's
    version seals its record), not a record, or another job's (its submission id or attempt differ:
    copied from another attempt or task run)."""
    fix = (
        f"No checkpoint URI was pushed; the record is not taken. Restore the record the job wrote, or delete Ray job "
        f"{sid} (ray job delete) and clear the task to train a new attempt."
    )
    fields = this.record or {}
    if (sealed_by_job or CHECKSUM in fields) and fields.get(CHECKSUM) != checksum(fields):
        raise TrainingResultError(
            f"Ray job {sid} succeeded but its result record {this.record_uri} does not match its checksum: it "
            f"was edited after the job wrote it. {fix}"
        )
    try:
        record = kind.from_dict(fields)
    except (TypeError, ValueError) as err:
        raise TrainingResultError(
            f"Ray job {sid} succeeded but its result record {this.record_uri} is not one: {err} {fix}"
        ) from None
    if record.submission_id != sid or record.attempt != this.attempt:
        raise TrainingResultError(
            f"Ray job {sid} succeeded but the result record {this.record_uri} is that of Ray job "
            f"{record.submission_id!r}, attempt {record.attempt!r}: it was copied or edited. {fix}"
        )
    return record


def missing_checkpoint(record: ResultRecord, present: dict[str, bool | Exception]) -> str | None:
    """The first checkpoint the record names that holds no file; raises when it names none, or when one
    could not be checked (no dangling URI either way)."""
    sid = record.submission_id
    if not record.checkpoint_uri and record.script:  # a script may leave none; the task log says so
        return None
    if not record.checkpoint_uri:
        raise UserCodeError(
            f"Ray job {sid} succeeded without a checkpoint: call ray.train.report(metrics, "
            "checkpoint=Checkpoint.from_directory(...)) on rank 0 at least once.",
            submission_id=sid,
        )
    for uri, found in present.items():
        if isinstance(found, Exception):
            raise TrainingResultError(
                f"Ray job {sid} succeeded but its checkpoint {uri} cannot be checked: {found} No checkpoint "
                "URI was pushed. Once the storage answers again, retry the task: it reuses the finished job."
            ) from found
        if not found:
            return uri
    return None


def earlier_attempts(attempts: list[AttemptFiles]) -> list[dict[str, Any]]:
    """The attempts before this one, with why each failed (from their records)."""
    found = []
    for files in attempts:
        record = files.record or {}
        failure = record.get("failure") or {}
        found.append(
            {
                "attempt": record.get("attempt", files.attempt),
                "submission_id": record.get("submission_id"),
                "failure_class": failure.get("failure_class"),
                "summary": failure.get("summary"),
            }
        )
    return found


def run_cost(event: JobEvent, files: TaskRunFiles, record: dict[str, Any]) -> Cost:
    """What this attempt (Ray's own times, from the event; ``record``: its record as JSON) and the earlier
    ones (their kept cost, else their records' times) held."""
    per_worker = _json_metadata(event.metadata, META_WORKER_RESOURCES) or {}
    prices = _json_metadata(event.metadata, META_PRICES)
    attempts = [earlier_cost(files, per_worker, prices) for files in files.earlier]
    if is_task_job(event):  # the driver is the task's one worker, from its start
        started = (record.get("timings") or {}).get("started_at")
        groups: list[dict[str, Any]] = [{"started_at": started, "world_size": 1}] if started else []
    else:
        groups = list(files.this.worker_groups)
    attempts.append(
        cost.attempt_cost(
            record,
            failed=not event.succeeded,
            submitted_at=event.start_time,
            ended_at=event.end_time,
            worker_groups=groups,
            per_worker=per_worker,
            prices=prices,
        )
    )
    return cost.task_run_cost(attempts, per_worker=per_worker, prices=prices)


def earlier_cost(files: AttemptFiles, per_worker: dict, prices: dict | None) -> Any:
    """An earlier attempt's cost: as kept when it ended (Ray's times), else from its record and worker groups."""
    record = {"attempt": files.attempt, **(files.record or {})}
    kept = [a for a in (record.get("cost") or {}).get("attempts") or [] if a.get("attempt") == record["attempt"]]
    if kept:
        return kept[0]
    return cost.attempt_cost(
        record,
        failed=not record.get("checkpoint_uri") or bool(record.get("failure")),
        submitted_at=None,
        ended_at=None,
        worker_groups=list(files.worker_groups),
        per_worker=per_worker,
        prices=prices,
    )


def _json_metadata(metadata: dict[str, str], key: str) -> Any:
    try:
        return json.loads(metadata[key]) if metadata.get(key) else None
    except ValueError:
        return None


# --- write ------------------------------------------------------------------------------------------


def keep(storage: Storage, files: TaskRunFiles, done: Succeeded) -> dict[str, Any]:
    """Write what the decision keeps, then return the task's result (or fail for a vanished checkpoint).
    The cost in the record is best effort; the consumed marker is not: without it a cleared task would
    reuse this job."""
    sid, this = done.submission_id, files.this
    if done.missing_checkpoint is not None:
        raise TrainingResultError(
            f"Ray job {sid} succeeded and reported checkpoint {done.missing_checkpoint}, but it is missing or "
            "empty in storage: it may have been deleted (lifecycle rule, cleanup job) after training. No "
            f"checkpoint URI was pushed. {retire_attempt(storage, sid, this, done.missing_checkpoint)}"
        )
    try:
        storage.write_json(this.record_uri, done.record)
    except Exception as err:  # the result stands without the cost in the record
        log.warning("Could not keep the cost in the attempt's record at %s: %s", this.record_uri, err)
    storage.write_json(consumed_uri(this.storage_uri, this.attempt), done.consumed)
    return done.result


def retire_attempt(storage: Storage, sid: str, this: AttemptFiles, missing_uri: str) -> str:
    """Mark an attempt whose checkpoint vanished as used up (a retry then trains a new one); say so."""
    try:
        storage.write_json(
            consumed_uri(this.storage_uri, this.attempt), {"submission_id": sid, "checkpoint_missing": missing_uri}
        )
    except Exception as err:  # best effort: the error above is what matters
        log.warning("Could not mark attempt %s as used up: %s", this.attempt, err)
        return (
            f"Marking the attempt used up failed ({err}), so a retry would reuse this job and fail again: give "
            "Airflow write access to the storage, then retry or clear the task."
        )
    return (
        "Retry or clear the task to train again (as a new attempt), and keep the storage's lifecycle rules away "
        "from checkpoints the next tasks still read."
    )


# --- a failed job -----------------------------------------------------------------------------------


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


def post_mortem(event: JobEvent, failure: failures.Failure, files: TaskRunFiles) -> dict[str, Any]:
    """The failed attempt's record completed with the final class, the log's last lines and the cost (or
    made, when the runtime could not write it): a platform team reads why a run failed after the cluster
    is gone."""
    this = files.this
    record = {
        "submission_id": event.submission_id,
        "attempt": this.attempt,
        "storage_uri": this.storage_uri,
        "run_uri": this.folder,
        **(this.record or {}),
        "failure": failure.to_dict(),
        "log_tail": list(event.log_tail[-LOG_TAIL_LINES:]),
    }
    return sealed({**record, "cost": run_cost(event, files, record)})


def keep_post_mortem(storage: Storage, event: JobEvent, failure: failures.Failure) -> None:
    uri = event.metadata.get(META_RESULT_URI)
    if not uri:
        return

    def keep() -> dict[str, Any]:
        files = read_task_run(storage, event)
        if "record" in files.this.unread:  # what the runtime wrote cannot be read: leave it as it is
            raise files.this.unread["record"]
        record = post_mortem(event, failure, files)
        storage.write_json(uri, record)
        return record

    try:
        record = storage.waiting(keep)  # a refusal or an outage that passes must not lose the attempt's record
        log.info("%s (this failed attempt included)", cost.summary(record["cost"]))
    except Exception as err:  # the failure itself is what the task must say
        log.warning("Could not keep the failed attempt's record at %s: %s", uri, err)
