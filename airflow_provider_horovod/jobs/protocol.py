"""The job protocol: Ray's job states, the metadata keys the provider sets on its jobs, and the
one event a wait ends with (the trigger's event, the sync loop's outcome alike).

Standard library only: it is imported at DAG parse time (by the trigger's module) and must stay cheap.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class JobStatus(str, enum.Enum):
    """Ray's ``JobStatus``: a str, so it goes into JSON (trigger events, XCom) as it is."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED)

    @classmethod
    def of(cls, value: Any) -> JobStatus | None:
        try:
            return cls(value)
        except ValueError:
            return None


# Job metadata keys. Ray shows metadata to every dashboard reader: names and paths only, no secrets.
META_PREFIX = "ahp_"
META_STORAGE_URI = f"{META_PREFIX}storage_uri"
META_ATTEMPT = f"{META_PREFIX}attempt"
META_RESULT_URI = f"{META_PREFIX}result_uri"
META_NUM_WORKERS = f"{META_PREFIX}num_workers"
META_RESOURCES = f"{META_PREFIX}resources"
META_KIND = f"{META_PREFIX}kind"

# XCom keys the provider pushes.
XCOM_CHECKPOINT_URI = "checkpoint_uri"
XCOM_SUBMISSION_ID = "submission_id"

# How many of the job's last log lines a failure shows.
LOG_TAIL_LINES = 40
# The line the provider's runtime ends a failed job with: its one-line reason.
ERROR_MARK = "AHP_ERROR "


def reason_in(lines: list[str], reason: str = "") -> str:
    """The last failure reason the runtime printed among ``lines`` (else ``reason``)."""
    for line in lines:
        if ERROR_MARK in line:
            reason = line.split(ERROR_MARK, 1)[1].strip()
    return reason


class Outcome(str, enum.Enum):
    SUCCESS = "success"
    ERROR = "error"


@dataclasses.dataclass(frozen=True)
class JobEvent:
    """How a wait ended: enough to finish the task without asking Ray again.

    ``log_cursor`` is how far the job's log was streamed into the task log (see ``jobs.logs``).
    """

    outcome: Outcome
    submission_id: str
    job_status: JobStatus | None = None
    error_type: str | None = None
    message: str = ""
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)
    log_tail: list[str] = dataclasses.field(default_factory=list)
    log_cursor: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The job's own one-line reason (its AHP_ERROR line), wherever it is in the log.
    reason: str = ""

    @property
    def succeeded(self) -> bool:
        return self.outcome is Outcome.SUCCESS

    @classmethod
    def from_info(cls, submission_id: str, info: dict, *, log_tail: list[str] | None = None,
                  log_cursor: dict | None = None, reason: str = "") -> JobEvent:
        """The event of a job that reached a terminal state, from its job info."""
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
        )

    @classmethod
    def error(cls, submission_id: str, message: str, *, info: dict | None = None,
              log_cursor: dict | None = None, job_status: JobStatus | None = None) -> JobEvent:
        """A wait that ended without the job succeeding: missing, timed out, unreachable."""
        info = info or {}
        return cls(outcome=Outcome.ERROR, submission_id=submission_id,
                   job_status=job_status or JobStatus.of(info.get("status")),
                   error_type=info.get("error_type"), message=message,
                   metadata=dict(info.get("metadata") or {}), log_cursor=dict(log_cursor or {}))

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
        values["job_status"] = JobStatus.of(values.get("job_status"))
        return cls(**values)
