"""How a wait for a job ended (``JobEvent``): the trigger's event, the synchronous wait's and the
sensor's outcome, and what the finish step reads. It travels as a dict through the triggerer."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from airflow_provider_horovod import failures
from airflow_provider_horovod.contract import JobStatus


class Outcome(str, enum.Enum):
    SUCCESS = "success"
    ERROR = "error"


@dataclasses.dataclass(frozen=True)
class JobEvent:
    """How a wait ended (the trigger's event, the sync wait's outcome): enough to finish the task
    without asking Ray again. ``log_cursor``: how far the job's log is in the task log."""

    outcome: Outcome
    submission_id: str
    job_status: JobStatus | None = None
    error_type: str | None = None
    message: str = ""
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)
    log_tail: list[str] = dataclasses.field(default_factory=list)
    log_cursor: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The runtime's one-line reason (its AHP_ERROR line), wherever it is in the log.
    reason: str = ""
    # Why it failed, as far as the wait knows: the runtime's verdict (its AHP_FAILURE line), or the
    # wait's own (a timeout, a job gone); ``failures.Failure.to_dict()``.
    failure: dict[str, Any] = dataclasses.field(default_factory=dict)
    driver_exit_code: int | None = None
    # Ray's own timestamps of the job, in seconds: submitted, and ended (for the cost).
    start_time: float | None = None
    end_time: float | None = None

    @property
    def succeeded(self) -> bool:
        return self.outcome is Outcome.SUCCESS

    @classmethod
    def from_info(
        cls,
        submission_id: str,
        info: dict,
        *,
        log_tail: list[str] | None = None,
        log_cursor: dict | None = None,
        reason: str = "",
        failure: dict | None = None,
    ) -> JobEvent:
        """The event of a job in a terminal state, from its job info."""
        status = JobStatus.of(info.get("status"))
        return cls(
            outcome=Outcome.SUCCESS if status is JobStatus.SUCCEEDED else Outcome.ERROR,
            submission_id=submission_id,
            job_status=status,
            error_type=info.get("error_type"),
            message=info.get("message") or "",
            metadata=dict(info.get("metadata") or {}),
            log_tail=list(log_tail or []),
            log_cursor=dict(log_cursor or {}),
            reason=reason,
            failure=dict(failure or {}),
            driver_exit_code=info.get("driver_exit_code"),
            **ray_times(info),
        )

    @classmethod
    def error(
        cls,
        submission_id: str,
        message: str,
        *,
        info: dict | None = None,
        log_cursor: dict | None = None,
        failure_class: failures.FailureClass = failures.FailureClass.INFRASTRUCTURE,
    ) -> JobEvent:
        """A wait that ended without the job succeeding: missing, timed out, unreachable."""
        info = info or {}
        status = info.get("status")
        failure = failures.Failure(failure_class, failures.first_line_of(message), message=message)
        return cls(
            outcome=Outcome.ERROR,
            submission_id=submission_id,
            job_status=JobStatus.known(status),
            error_type=info.get("error_type"),
            message=message,
            metadata=dict(info.get("metadata") or {}),
            log_cursor=dict(log_cursor or {}),
            failure=failure.to_dict(),
            **ray_times(info),
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["outcome"] = self.outcome.value
        data["job_status"] = self.job_status.value if self.job_status else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobEvent:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["outcome"] = Outcome(values["outcome"])
        values["job_status"] = JobStatus.of(values["job_status"]) if values.get("job_status") else None
        return cls(**values)


def ray_times(info: dict) -> dict[str, Any]:
    """The job's start and end times from its info (Ray gives milliseconds)."""
    return {
        key: info[key] / 1000 if isinstance(info.get(key), (int, float)) and info[key] else None
        for key in ("start_time", "end_time")
    }
