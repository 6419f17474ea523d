"""The one wait step: given what one poll saw (the job's info, its log, the clock), decide which log
lines are new, whether the wait is over, and whether the job must be stopped.

The operator's synchronous loop, the trigger and the sensor's poke are thin I/O shells around
``step``: they fetch, call it, write the lines and act on its verdict. Pure, standard library only.
"""

from __future__ import annotations

import dataclasses
import json

from airflow_provider_horovod.jobs.logs import LogCursor, new_lines, tail
from airflow_provider_horovod.jobs.protocol import LOG_TAIL_LINES, META_RESOURCES, JobEvent, JobStatus


@dataclasses.dataclass(frozen=True)
class WaitPolicy:
    """:param pending_timeout_s: fail (and stop the job) when it stays PENDING longer; None: no limit."""

    pending_timeout_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Poll:
    """What one poll saw. ``info`` None: the job does not exist. ``log`` None: the log was not fetched."""

    info: dict | None
    log: str | None
    now: float


@dataclasses.dataclass(frozen=True)
class Timeout:
    """The job waited too long for its resources; the shell stops it and asks what the cluster has."""

    submission_id: str
    status: str
    waited_s: float
    asked: dict
    info: dict

    def event(self, cluster: dict | None, cursor: LogCursor) -> JobEvent:
        return JobEvent.error(self.submission_id, pending_timeout_message(
            self.submission_id, self.status, self.waited_s, self.asked, cluster),
            info=self.info, log_cursor=cursor.to_dict())


@dataclasses.dataclass(frozen=True)
class Step:
    cursor: LogCursor
    lines: list[str]
    event: JobEvent | None = None
    timeout: Timeout | None = None

    @property
    def done(self) -> bool:
        return self.event is not None or self.timeout is not None


def needs_log(info: dict | None, streaming: bool) -> bool:
    """Whether this poll should fetch the log: to stream it, or for the tail of a failure."""
    status = JobStatus.of((info or {}).get("status"))
    return info is not None and (streaming or (status is not None and status.is_terminal))


def step(policy: WaitPolicy, cursor: LogCursor, poll: Poll) -> Step:
    sid = cursor.submission_id
    info = poll.info
    if info is None:
        return Step(cursor, [], JobEvent.error(
            sid, f"Ray job {sid} does not exist on the cluster (deleted, or the cluster was replaced).",
            log_cursor=cursor.to_dict()))
    status = JobStatus.of(info.get("status"))
    terminal = status is not None and status.is_terminal
    lines: list[str] = []
    if poll.log is not None:
        lines, cursor = new_lines(poll.log, cursor, final=terminal)
    if terminal:
        failure_tail = tail(poll.log or "", LOG_TAIL_LINES) if status is not JobStatus.SUCCEEDED else []
        return Step(cursor, lines, JobEvent.from_info(sid, info, log_tail=failure_tail, log_cursor=cursor.to_dict()))
    if status is JobStatus.PENDING and policy.pending_timeout_s:
        waited = poll.now - (info.get("start_time") or poll.now * 1000) / 1000
        if waited > policy.pending_timeout_s:
            return Step(cursor, lines, timeout=Timeout(sid, status.value, waited, requested_resources(info), info))
    return Step(cursor, lines)


def requested_resources(info: dict) -> dict:
    """What the job's workers ask of the cluster, as the operator recorded it in the job's metadata."""
    try:
        return json.loads((info.get("metadata") or {}).get(META_RESOURCES) or "{}")
    except ValueError:
        return {}


def pending_timeout_message(submission_id: str, status: str, waited_s: float, asked: dict,
                            cluster: dict | None) -> str:
    have = json.dumps(cluster, sort_keys=True) if cluster is not None else "unknown"
    return (
        f"Ray job {submission_id} stayed {status} for {waited_s:.0f} s (pending_timeout_seconds). "
        f"Its workers ask for {json.dumps(asked, sort_keys=True)}; the cluster has {have}. "
        "Give the cluster those resources, lower num_workers/resources_per_worker, or raise "
        "pending_timeout_seconds. The job was stopped."
    )
