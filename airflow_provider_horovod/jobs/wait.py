"""The wait for a job: one pure step that decides what a poll means, and one loop around it.

``step`` takes what one poll saw (the job's info, the log lines that arrived, the clock) and
decides which lines to write, whether the wait is over and whether the job must be stopped.
``follow`` is the loop that polls, reads the log (``jobs.logs``), writes and acts on the verdict:
the trigger awaits it, the operator's synchronous wait runs it through ``wait``, and the sensor's
poke calls ``step`` once. ``WaitPolicy`` is checked once where it is made and travels whole, as a
dict, from the operator or the sensor to the trigger.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from airflow_provider_horovod import checks, failures
from airflow_provider_horovod.contract import (
    CONFIG_SECTION,
    ERROR_MARK,
    JOB_STOP_WAIT_S,
    META_MARK_TOKEN,
    META_RESOURCES,
    PENDING_TIMEOUT_S,
    POLL_INTERVAL_S,
    RESULT_MARK,
    STALL_TIMEOUT_S,
    SYNC_WAIT_BEFORE_DEFER_S,
    JobStatus,
    marked,
)
from airflow_provider_horovod.exceptions import HorovodProviderError
from airflow_provider_horovod.jobs.events import JobEvent
from airflow_provider_horovod.jobs.logs import LogCursor, LogReader, task_log

if TYPE_CHECKING:
    from airflow_provider_horovod.jobs.api import RayJobsApi

# Once the runtime's last line is in the log (its result, or why it failed), the job ends within about
# a second (the driver's Ray shutdown): its status is then asked this often, for at most FINISHING_S,
# so the task ends about a tenth of a second after the job rather than up to a poll interval later.
FINISHING_POLL_S = 0.1
FINISHING_S = 10.0
# A poll that brings more lines than this sorts them for the task log in a worker thread: the patterns
# over thousands of lines would hold the event loop that a triggerer's other triggers share.
THREAD_LINES = 500


@dataclasses.dataclass(frozen=True)
class WaitPolicy:
    """How a job is waited for; each value checked here, before anything is submitted.

    :param poll_interval_s: seconds between status polls.
    :param pending_timeout_s: fail (and stop the job) when it waits longer for its resources; None: no limit.
    :param stall_timeout_s: fail (and stop the job) when, running, it shows no progress (no new line
        in its log; Ray Train logs every report) for longer; None: no limit.
    """

    poll_interval_s: float = POLL_INTERVAL_S
    pending_timeout_s: float | None = PENDING_TIMEOUT_S
    stall_timeout_s: float | None = STALL_TIMEOUT_S

    def __post_init__(self) -> None:
        checks.check_positive("poll_interval_seconds", self.poll_interval_s)
        checks.check_positive("pending_timeout_seconds", self.pending_timeout_s, allow_none=True)
        checks.check_positive("stall_timeout_seconds", self.stall_timeout_s, allow_none=True)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WaitPolicy:
        return cls(**data)

    def stalled(self, cursor: LogCursor, now: float) -> bool:
        """Whether the job has shown no progress for longer than the stall timeout."""
        return bool(self.stall_timeout_s and cursor.progress_at and now - cursor.progress_at > self.stall_timeout_s)


def follow_before_defer_s() -> float:
    """How long a deferrable task follows its job in the worker before it defers: Airflow's ``[horovod]
    defer_after_seconds``, checked (0: defer at once)."""
    from airflow.configuration import conf

    given: Any = conf.get(CONFIG_SECTION, "defer_after_seconds", fallback=None)
    if given is None:
        return SYNC_WAIT_BEFORE_DEFER_S
    with contextlib.suppress(ValueError):
        given = float(given)
    return checks.check_seconds("[horovod] defer_after_seconds", given) or 0.0


def mark_token(info: dict | None) -> str:
    """The token of the runtime's marked lines in this job's log (its metadata's; "" for an older job)."""
    return ((info or {}).get("metadata") or {}).get(META_MARK_TOKEN) or ""


def reason_in(lines: list[str], reason: str = "", token: str = "") -> str:
    """The last failure reason the runtime printed among ``lines``, marked with ``token`` (else ``reason``)."""
    mark = marked(ERROR_MARK, token)
    for line in lines:
        if mark in line:
            reason = line.split(mark, 1)[1].strip()
    return reason


def failure_in(lines: list[str], failure: dict | None = None, token: str = "") -> dict:
    """The runtime's last verdict on its failure among ``lines``, marked with ``token`` (else ``failure``)."""
    for line in lines:
        if (found := failures.of_line(line, token)) is not None:
            failure = found.to_dict()
    return dict(failure or {})


# --- the step ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Poll:
    """What one poll saw. ``info`` None: the job does not exist. ``lines``: the log's lines that are
    new since the last poll (all of them once the job has ended). ``tail``: the log's last lines,
    for a failure's message."""

    info: dict | None
    now: float
    lines: list[str] = dataclasses.field(default_factory=list)
    tail: list[str] = dataclasses.field(default_factory=list)
    reason: str = ""
    failure: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Timeout:
    """The job waited too long for its resources, or stalled: the loop stops it (and, for the
    resources, asks what the cluster has)."""

    submission_id: str
    status: str
    waited_s: float
    asked: dict
    info: dict
    stalled: bool = False

    def event(self, cluster: dict | None, cursor: LogCursor) -> JobEvent:
        if self.stalled:
            message = stall_message(self.submission_id, self.waited_s)
            failure_class = failures.FailureClass.INFRASTRUCTURE
        else:
            message = pending_timeout_message(self.submission_id, self.status, self.waited_s, self.asked, cluster)
            failure_class = failures.FailureClass.CAPACITY
        return JobEvent.error(
            self.submission_id, message, info=self.info, log_cursor=cursor.to_dict(), failure_class=failure_class
        )


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
        return Step(
            cursor,
            poll.lines,
            JobEvent.error(
                sid,
                f"Ray job {sid} does not exist on the cluster (deleted, or the cluster was replaced).",
                log_cursor=cursor.to_dict(),
            ),
        )
    try:
        status = JobStatus.of(info.get("status"))
    except HorovodProviderError as err:
        return Step(
            cursor,
            poll.lines,
            JobEvent.error(
                sid, str(err), info=info, log_cursor=cursor.to_dict(), failure_class=failures.FailureClass.CONFIGURATION
            ),
        )
    if status.is_terminal:
        failure_tail = list(poll.tail) if status is not JobStatus.SUCCEEDED else []
        token = mark_token(info)
        event = JobEvent.from_info(
            sid,
            info,
            log_tail=failure_tail,
            log_cursor=cursor.to_dict(),
            reason=reason_in(failure_tail, poll.reason, token),
            failure=failure_in(failure_tail, poll.failure, token),
        )
        return Step(cursor, poll.lines, event)
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
    """What the job's workers ask of the cluster, as the plan recorded it in the job's metadata."""
    try:
        return json.loads((info.get("metadata") or {}).get(META_RESOURCES) or "{}")
    except ValueError:
        return {}


def pending_timeout_message(submission_id: str, status: str, waited_s: float, asked: dict, cluster: dict | None) -> str:
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


# --- the loop -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Running:
    """The job had not ended within the seconds the wait was given (``within_s``): the operator defers
    with it. ``cursor``: where the job's log stands in the task log."""

    cursor: LogCursor


@dataclasses.dataclass(frozen=True)
class Update:
    """What one poll of ``follow`` brings: ``lines`` for the task log (level, text), the cursor after
    them, and, on the last update, ``end``: the job's event, or ``Running``. Whoever waits saves the
    cursor before it writes the lines: a crash in between may skip a batch of lines, never repeat one."""

    cursor: LogCursor
    lines: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    end: JobEvent | Running | None = None


async def follow(
    hook: RayJobsApi,
    submission_id: str,
    *,
    policy: WaitPolicy,
    cursor: LogCursor,
    stream_logs: bool = True,
    within_s: float | None = None,
) -> AsyncGenerator[Update, None]:
    """Poll the job until it ends, one ``Update`` a poll: its log after ``cursor`` (``jobs.logs.task_log``:
    the user's lines, and Ray's own folded), and its event on the last. ``within_s``: the last update
    says ``Running`` when the job has not ended that many seconds on. A job that waits for resources or
    stalls past the policy's limits is stopped here, and its update's event says why."""
    reader = LogReader(submission_id)
    reason = ""
    failure: dict[str, Any] = {}
    deadline = None if within_s is None else time.monotonic() + within_s
    finishing_until = 0.0  # set when the runtime's last line is seen: status polls come faster until then
    while True:
        finishing = time.monotonic() < finishing_until
        # Status from the loop's shared list where many jobs are waited for; a finishing job asks itself.
        info = await hook.a_get_job_info(
            submission_id, fresh_within_s=None if finishing else policy.poll_interval_s / 2
        )
        try:
            status: JobStatus | None = JobStatus.of(info["status"]) if info else None
        except HorovodProviderError:
            status = None  # the step turns it into the wait's error
        ended = status is not None and status.is_terminal
        fresh: list[str] = []
        now = time.time()
        if stream_logs:
            fresh = await reader.new_lines(hook, info, cursor, ended=ended)
        elif ended and status is not JobStatus.SUCCEEDED:
            await reader.read_last(hook, info)
        token = mark_token(info)
        reason, failure = reason_in(fresh, reason, token), failure_in(fresh, failure, token)
        last_marks = (marked(RESULT_MARK, token), marked(ERROR_MARK, token))
        if any(mark in line for line in fresh for mark in last_marks):
            finishing_until = time.monotonic() + FINISHING_S
        result = step(policy, cursor, Poll(info, now, fresh, tail=reader.tail, reason=reason, failure=failure))
        cursor = result.cursor
        to_log = (
            await asyncio.to_thread(task_log, result.lines)
            if len(result.lines) > THREAD_LINES
            else task_log(result.lines)
        )
        lines = [*reader.take_notices(), *to_log]
        if result.timeout is not None:
            yield Update(cursor, lines)
            await hook.a_stop_job(submission_id)
            await until_ended(hook, submission_id)
            cluster = None
            if not result.timeout.stalled:
                try:
                    cluster = await hook.a_get_cluster_resources()
                except HorovodProviderError:
                    pass
            yield Update(cursor, end=result.timeout.event(cluster, cursor))
            return
        if result.event is not None:
            yield Update(cursor, lines, result.event)
            return
        if deadline is not None and time.monotonic() >= deadline:
            yield Update(cursor, lines, Running(cursor))
            return
        yield Update(cursor, lines)
        await asyncio.sleep(next_poll_s(policy.poll_interval_s, finishing=time.monotonic() < finishing_until))


async def until_ended(hook: RayJobsApi, submission_id: str, within_s: float = JOB_STOP_WAIT_S + 5.0) -> None:
    """After the wait stopped the job itself: until Ray says it ended (at most ``within_s``). Its driver
    keeps the stopped attempt's record on its way out; the finish step then completes that record with
    the timeout's reason instead of racing it."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            info = await hook.a_get_job_info(submission_id, fresh_within_s=None)
            if not info or JobStatus.of(info.get("status")).is_terminal:
                return
        except HorovodProviderError:  # gone, or unreadable: nothing to wait for
            return
        await asyncio.sleep(0.5)


def next_poll_s(interval_s: float, *, finishing: bool) -> float:
    """Seconds to the next poll: the interval; less while the job is finishing. No faster while the task
    follows its job before deferring (a minute by default): each poll reads the job's status and log through
    the dashboard, CPU taken beside the ranks on a node they share (bench/results.md, figure 9)."""
    return min(interval_s, FINISHING_POLL_S) if finishing else interval_s
