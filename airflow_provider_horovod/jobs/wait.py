"""The one wait step: given what one poll saw (the job's info, the log lines that arrived, the
clock), decide which lines to write, whether the wait is over, and whether the job must be stopped.

The operator's synchronous loop, the trigger and the sensor's poke are thin I/O shells around
``step``: they fetch, call it, write the lines and act on its verdict. Pure, standard library only.
"""

from __future__ import annotations

import dataclasses
import json

from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.protocol import META_RESOURCES, JobEvent, JobStatus, reason_in


@dataclasses.dataclass(frozen=True)
class WaitPolicy:
    """:param pending_timeout_s: fail (and stop the job) when it stays PENDING longer; None: no limit.
    :param stall_timeout_s: fail (and stop the job) when, running, it shows no progress (no new line
        in its log; Ray Train logs every report) for longer; None: no limit."""

    pending_timeout_s: float | None = None
    stall_timeout_s: float | None = None

    def stalled(self, cursor: LogCursor, now: float) -> bool:
        """Whether the job has shown no progress for longer than the stall timeout."""
        return bool(self.stall_timeout_s and cursor.progress_at and now - cursor.progress_at > self.stall_timeout_s)


@dataclasses.dataclass(frozen=True)
class Poll:
    """What one poll saw. ``info`` None: the job does not exist. ``lines``: the log's lines that are
    new since the last poll (all of them once the job has ended). ``tail``: the log's last lines,
    for a failure's message."""

    info: dict | None
    now: float
    lines: list[str] = dataclasses.field(default_factory=list)
    tail: list[str] = dataclasses.field(default_factory=list)
    reason: str = ""  # the runtime's one-line failure reason, when it printed one


@dataclasses.dataclass(frozen=True)
class Timeout:
    """The job waited too long for its resources, or stalled: the shell stops it (and, for the
    resources, asks what the cluster has)."""

    submission_id: str
    status: str
    waited_s: float
    asked: dict
    info: dict
    stalled: bool = False

    def event(self, cluster: dict | None, cursor: LogCursor) -> JobEvent:
        message = (stall_message(self.submission_id, self.waited_s) if self.stalled else
                   pending_timeout_message(self.submission_id, self.status, self.waited_s, self.asked, cluster))
        return JobEvent.error(self.submission_id, message, info=self.info, log_cursor=cursor.to_dict())


@dataclasses.dataclass(frozen=True)
class Step:
    """``lines`` to write; then ``event`` (the wait is over), or ``timeout`` (stop the job first)."""

    cursor: LogCursor
    lines: list[str]
    event: JobEvent | None = None
    timeout: Timeout | None = None


def step(policy: WaitPolicy, cursor: LogCursor, poll: Poll) -> Step:
    sid = cursor.submission_id
    cursor = cursor.advanced(poll.lines, poll.now)
    info = poll.info
    if info is None:
        return Step(cursor, poll.lines, JobEvent.error(
            sid, f"Ray job {sid} does not exist on the cluster (deleted, or the cluster was replaced).",
            log_cursor=cursor.to_dict()))
    status = JobStatus.of(info.get("status"))
    if status is not None and status.is_terminal:
        failure_tail = list(poll.tail) if status is not JobStatus.SUCCEEDED else []
        return Step(cursor, poll.lines, JobEvent.from_info(sid, info, log_tail=failure_tail,
                                                           log_cursor=cursor.to_dict(),
                                                           reason=reason_in(failure_tail, poll.reason)))
    if status is JobStatus.PENDING and policy.pending_timeout_s:
        waited = poll.now - (info.get("start_time") or poll.now * 1000) / 1000
        if waited > policy.pending_timeout_s:
            return Step(cursor, poll.lines, timeout=Timeout(sid, status.value, waited, requested_resources(info), info))
    if status is JobStatus.RUNNING and policy.stall_timeout_s:
        if not cursor.progress_at:  # the stall clock starts when the job is first seen running
            cursor = dataclasses.replace(cursor, progress_at=poll.now)
        if policy.stalled(cursor, poll.now):
            quiet = poll.now - cursor.progress_at
            return Step(cursor, poll.lines, timeout=Timeout(sid, status.value, quiet, {}, info, stalled=True))
    return Step(cursor, poll.lines)


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


def stall_message(submission_id: str, quiet_s: float) -> str:
    return (
        f"Ray job {submission_id} showed no progress for {quiet_s:.0f} s (stall_timeout_seconds): no new line in "
        "its log, where Ray Train logs every report. The job was stopped; the task's retry runs the next attempt, "
        "resuming from the last checkpoint. Raise stall_timeout_seconds if a step of the training runs that long "
        "quietly."
    )
