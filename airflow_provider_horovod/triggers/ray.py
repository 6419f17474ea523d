"""RayJobTrigger: waits for a Ray job in the triggerer, streaming its log into the task log."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_horovod import airflow_compat, failures
from airflow_provider_horovod.contract import XCOM_LOG_CURSOR, TaskRun
from airflow_provider_horovod.exceptions import HorovodProviderError, InvalidParameterError
from airflow_provider_horovod.hooks.ray import RayHook, WithRayHook
from airflow_provider_horovod.jobs.events import JobEvent
from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.stop import a_stop_killed
from airflow_provider_horovod.jobs.wait import WaitPolicy, follow
from airflow_provider_horovod.storage import Storage

# Seconds of writing to the task log between yields to the event loop.
WRITE_SLICE_S = 0.01
# How long a trigger in a triggerer lets pass between writing the job's last lines and its event (see
# run()): ten times the lag seen between the two (docker/README.md), and longer after a burst of lines, which
# the triggerer takes longer to file; counted from the last write. Airflow's trigger runner then passes the
# event on at its next loop, up to a second later.
LOG_SETTLE_S = 0.2
LOG_SETTLE_PER_LINE_S = 0.002
LOG_SETTLE_MAX_S = 1.0


class RayJobTrigger(WithRayHook, BaseTrigger):
    """Poll a Ray job until it ends; yield exactly one event (a ``JobEvent`` as a dict).

    :param submission_id: the Ray job's submission id.
    :param ray_conn_id: the Ray connection (the embedded local cluster when it does not exist).
    :param policy: the ``WaitPolicy`` as a dict (poll interval, pending and stall timeouts), as the
        operator or the sensor made it; the pending timeout is measured from the job's own start
        time, so a triggerer restart does not reset it.
    :param log_cursor: how far the job's log is already in the task log; only later lines are streamed.
    :param stream_logs: stream the job's log into the task log (read at every poll; see ``jobs.logs``).
    :param not_before: the earliest time (epoch seconds) the event may be yielded in a triggerer: the
        deferral's time plus ``RESUME_GUARD_S``, so that Airflow has seen the deferring worker exit
        when it resumes the task (a job ending right after the deferral waits that much longer).
    :param aws_conn_id: the task's AWS connection, for the record of an attempt killed before its driver
        started (``jobs.stop``).
    """

    def __init__(
        self,
        *,
        submission_id: str,
        ray_conn_id: str = RayHook.default_conn_name,
        policy: dict | None = None,
        log_cursor: dict | None = None,
        stream_logs: bool = True,
        not_before: float | None = None,
        aws_conn_id: str | None = None,
    ):
        super().__init__()
        if not isinstance(submission_id, str) or not submission_id:
            raise InvalidParameterError("submission_id", submission_id, "give the Ray job's submission id.")
        self.submission_id = submission_id
        self.ray_conn_id = ray_conn_id
        self.policy = WaitPolicy.from_dict(policy or {})
        self.log_cursor = LogCursor.from_dict(log_cursor, submission_id).to_dict()
        self.stream_logs = stream_logs
        self.not_before = not_before
        self.aws_conn_id = aws_conn_id
        # When the last lines were written to the task log (monotonic; None: none yet), and how many.
        self._written_at: float | None = None
        self._written_lines = 0

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "submission_id": self.submission_id,
                "ray_conn_id": self.ray_conn_id,
                "policy": self.policy.to_dict(),
                "log_cursor": self.log_cursor,
                "stream_logs": self.stream_logs,
                "not_before": self.not_before,
                "aws_conn_id": self.aws_conn_id,
            },
        )

    def _task_ids(self) -> dict[str, Any] | None:
        """The task instance's dag_id, task_id, run_id and map_index, when a triggerer runs this trigger."""
        ti = self.task_instance
        return None if ti is None else dataclasses.asdict(TaskRun.of(ti))

    async def _saved_cursor(self) -> LogCursor:
        """How far this trigger (an earlier run of it, before a triggerer restart) streamed the log."""
        cursor = LogCursor.from_dict(self.log_cursor, self.submission_id)
        if (ids := self._task_ids()) is None:
            return cursor
        try:
            saved = await airflow_compat.trigger_xcom_get(XCOM_LOG_CURSOR, **ids)
        except Exception:  # no Airflow API here (a bare test): nothing was saved
            self.log.warning("Could not read the log cursor; the job's log is streamed from line %s.", cursor.lines)
            return cursor
        return cursor.furthest(LogCursor.from_dict(saved, self.submission_id))

    async def _save_cursor(self, cursor: LogCursor) -> None:
        if (ids := self._task_ids()) is None:
            return
        try:
            await airflow_compat.trigger_xcom_set(XCOM_LOG_CURSOR, cursor.to_dict(), **ids)
        except Exception:
            self.log.warning("Could not save the log cursor; a triggerer restart may repeat log lines.")

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # The wait finishes (and closes its HTTP client) before the one event is yielded.
        event = await self.wait()
        early = self.guard_left_s()
        if early > LOG_SETTLE_S:
            self.log.info(
                "The job ended right after the task deferred: the task resumes in %.1f s, once Airflow "
                "has seen its worker exit.",
                early,
            )
        if (pause := max(early, self.settle_left_s())) > 0:
            await asyncio.sleep(pause)
        yield TriggerEvent(event.to_dict())

    # Only a triggerer (which sets task_instance) races the deferring worker's exit or closes the task's log
    # file on the event; `airflow dags test` runs the trigger inline, in the worker itself.

    def guard_left_s(self) -> float:
        """Seconds until ``not_before`` (the deferral's guard), in a triggerer."""
        if self.task_instance is None or self.not_before is None:
            return 0.0
        return self.not_before - time.time()

    def settle_left_s(self) -> float:
        """Seconds until the settle has passed since the last lines were written, in a triggerer: the lines
        logged just before the event travel apart from it, and could miss the closed file."""
        if self.task_instance is None or self._written_at is None:
            return 0.0
        settle = min(LOG_SETTLE_MAX_S, LOG_SETTLE_S + LOG_SETTLE_PER_LINE_S * self._written_lines)
        return settle - (time.monotonic() - self._written_at)

    async def wait(self) -> JobEvent:
        """Follow the job until it ends, streaming its log; the event the wait ended with."""
        sid = self.submission_id
        cursor = await self._saved_cursor()
        async with self.hook as hook:
            try:
                async with contextlib.aclosing(
                    follow(hook, sid, policy=self.policy, cursor=cursor, stream_logs=self.stream_logs)
                ) as updates:
                    async for update in updates:
                        if update.lines:
                            await self._save_cursor(update.cursor)
                            await self._write(update.lines)
                        cursor = update.cursor
                        if isinstance(update.end, JobEvent):
                            return update.end
            except HorovodProviderError as err:
                return JobEvent.error(
                    sid, str(err), log_cursor=cursor.to_dict(), failure_class=failures.class_of_provider_error(err)
                )
            except asyncio.CancelledError:
                # Before Airflow 3.3 no on_kill is called: a cancel whose task is no longer deferred is a kill.
                if not airflow_compat.trigger_on_kill_supported() and (ids := self._task_ids()) is not None:
                    try:
                        if await airflow_compat.task_was_killed(**ids):
                            await a_stop_killed(hook, Storage(self.aws_conn_id), sid, logger=self.log)
                    except Exception:
                        self.log.exception("Could not tell whether the task was killed; Ray job %s goes on.", sid)
                raise
        raise AssertionError("follow ends with an event when it is given no time limit")

    async def _write(self, lines: list[tuple[int, str]]) -> None:
        """The lines into the task log, leaving the event loop to the other triggers every ``WRITE_SLICE_S``:
        a poll may bring thousands of lines (a job's start), and a loaded machine logs each slower."""
        since = time.monotonic()
        for level, line in lines:
            self.log.log(level, line)
            if time.monotonic() - since > WRITE_SLICE_S:
                await asyncio.sleep(0)
                since = time.monotonic()
        self._written_at, self._written_lines = time.monotonic(), len(lines)

    async def on_kill(self) -> None:
        # Only a user's kill lands here (not a triggerer restart): the job must not outlive the task.
        async with self.hook as hook:
            await a_stop_killed(hook, Storage(self.aws_conn_id), self.submission_id, logger=self.log)
