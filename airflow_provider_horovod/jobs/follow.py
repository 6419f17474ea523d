"""The wait around the pure step: poll the job's status, read what is new in its log, write it, and
end with the job's event. The trigger awaits it; the operator's synchronous wait runs it in an event
loop of its own, so both wait the same way."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from airflow_provider_horovod.exceptions import HorovodProviderError, RayJobError
from airflow_provider_horovod.jobs.logs import LogCursor, lines_after
from airflow_provider_horovod.jobs.protocol import LOG_TAIL_LINES, JobEvent, JobStatus, reason_in
from airflow_provider_horovod.jobs.wait import Poll, WaitPolicy, step

if TYPE_CHECKING:
    from airflow_provider_horovod.hooks.ray import RayHook


async def follow_job(hook: RayHook, submission_id: str, *, policy: WaitPolicy, cursor: LogCursor,
                     poll_interval_s: float, write: Callable[[str], None],
                     save_cursor: Callable[[LogCursor], Awaitable[None]], stream_logs: bool = True,
                     stopped: Callable[[], bool] = lambda: False) -> JobEvent:
    """Wait for the job to end, writing its log after ``cursor`` with ``write``; its final event.

    ``save_cursor`` is awaited before new lines are written: a crash in between may skip a batch of
    lines in the task log, never repeat one. ``stopped``: the task was killed; the wait raises.
    """
    from airflow_provider_horovod.hooks.ray_logs import LogReader

    reader = LogReader(submission_id)
    reason = ""
    while True:
        info = await hook.a_get_job_info(submission_id)
        status = JobStatus.of((info or {}).get("status"))
        ended = status is not None and status.is_terminal
        fresh: list[str] = []
        now = time.time()
        # A quiet log is read less often; always at the end, and before a stall is called.
        if stream_logs and (ended or reader.due(now) or policy.stalled(cursor, now)):
            fresh = await _read(hook, reader, info, cursor, ended, write)
            reader.schedule(len(fresh), now, poll_interval_s)
        elif ended and status is not JobStatus.SUCCEEDED:
            await _read(hook, reader, info, LogCursor(submission_id), True, write, last_only=True)
        reason = reason_in(fresh, reason)
        result = step(policy, cursor, Poll(info, now, fresh, tail=reader.last_lines, reason=reason))
        if result.lines:
            await save_cursor(result.cursor)
            for line in result.lines:
                write(f"[ray] {line}")
        cursor = result.cursor
        if result.timeout is not None:
            await hook.a_stop_job(submission_id)
            cluster = None
            if not result.timeout.stalled:
                try:
                    cluster = await hook.a_get_cluster_resources()
                except HorovodProviderError:
                    pass
            return result.timeout.event(cluster, cursor)
        if result.event is not None:
            return result.event
        if stopped():
            raise RayJobError(f"Task killed; Ray job {submission_id} was stopped.", submission_id=submission_id,
                              status="STOPPED")
        await asyncio.sleep(poll_interval_s)


async def _read(hook: RayHook, reader, info: dict | None, cursor: LogCursor, ended: bool,
                write: Callable[[str], None], last_only: bool = False) -> list[str]:
    """What is new in the log. When it cannot be read (its node gone), one line says so, and once the
    job has ended its whole log is read once for the rest."""
    if reader.gap is None:
        try:
            if last_only:
                reader.last_lines = await reader.last(hook, info)
                return []
            return await reader.read(hook, info, cursor, final=ended)
        except HorovodProviderError as err:
            reader.gap = str(err)
            write(f"The job's log cannot be read from line {cursor.lines + 1} on ({err}); its rest is read once "
                  "the job ends.")
    if not ended:
        return []
    try:
        text = await hook.a_get_job_logs(reader.submission_id)
    except HorovodProviderError as err:
        write(f"The job's log from line {cursor.lines + 1} on cannot be read: {err}")
        return []
    reader.last_lines = text.splitlines()[-LOG_TAIL_LINES:]
    return [] if last_only else lines_after(text, cursor.lines)
