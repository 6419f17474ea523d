"""Stopping a killed task's job, and the record of the attempt it stops.

The side that stops a job keeps the attempt's record once Ray took its stop, unless one is there, since
the driver may not: a PENDING job's driver (its supervisor not started yet: busy nodes, a runtime_env being set up) gets
SIGTERM before Python starts the entrypoint, and a running driver may not unwind and write within Ray's
SIGKILL grace (a busy node, storage refusing for a while). A driver that does write replaces that record
with its own, which holds its timings and metric history (``runtime.entrypoint.report_stop``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from airflow_provider_horovod import failures
from airflow_provider_horovod.contract import (
    JOB_STOP_WAIT_S,
    META_ATTEMPT,
    META_RESULT_URI,
    META_STORAGE_URI,
    JobStatus,
    attempt_uri,
)
from airflow_provider_horovod.documents import TaskRecord

if TYPE_CHECKING:
    from airflow_provider_horovod.jobs.api import RayJobsApi
    from airflow_provider_horovod.storage import Storage

log = logging.getLogger(__name__)

UNSTARTED_MESSAGE = (
    "the job was stopped while PENDING (its task killed or marked failed), before its driver started: Ray "
    "starts such a driver only to stop it, so nothing of the attempt ran"
)
STOPPED_MESSAGE = "the job was stopped while its driver ran (its task killed or marked failed)"
# Ray's stop is fire and forget (its job supervisor signalled if found): the side that stops watches the job
# end, asking again now and then. A worker's task process has 5 s from SIGTERM to SIGKILL; the triggerer gives
# on_kill 30 s ([triggerer] on_kill_timeout), time for Ray's SIGKILL grace (JOB_STOP_WAIT_S) and more.
CONFIRM_IN_WORKER_S = 4.0
CONFIRM_IN_TRIGGERER_S = JOB_STOP_WAIT_S + 15.0
ASK_AGAIN_S = 5.0
# A stop Ray did not take (no supervisor yet: a job submitted a moment before) is asked again sooner.
ASK_AGAIN_NOT_TAKEN_S = 1.0
CONFIRM_POLL_S = 0.5


@dataclasses.dataclass
class Watch:
    """Where the stopper stands while it watches the job end: when it began and last asked, how many times
    it asked, whether Ray took a stop, and whether the attempt's record is seen to."""

    started: float
    asked: float
    asks: int = 1
    taken: bool = False
    kept: bool = False

    def next(self, info: dict | None, now: float, confirm_s: float) -> str:
        """What to do after a read of the job: "ended", "give_up", "ask" again, or "wait"."""
        if info is not UNREAD and not ending(info):
            return "ended"
        if now - self.started >= confirm_s:
            return "give_up"
        if now - self.asked >= (ASK_AGAIN_S if self.taken else ASK_AGAIN_NOT_TAKEN_S):
            return "ask"
        return "wait"

    def asked_again(self, taken: bool, now: float) -> None:
        self.asked, self.asks, self.taken = now, self.asks + 1, self.taken or taken


def stop_killed(
    hook: RayJobsApi, storage: Storage, sid: str, *, logger: Any = log, confirm_s: float = CONFIRM_IN_WORKER_S
) -> None:
    """Stop the job of a killed task, keep the attempt's record once Ray took a stop, and watch the job end
    for up to ``confirm_s`` (asking again while it runs on); never raises (an operator's ``on_kill`` runs in
    a signal handler)."""
    logger.info("Task killed: stopping Ray job %s", sid)
    before = job_info(hook.get_job_info, sid)  # a job that had ended left its own record
    try:
        watch = Watch(started=time.monotonic(), asked=time.monotonic(), taken=hook.stop_job(sid))
        info = before
        while True:
            if watch.taken and not watch.kept and ending(before):
                keep_stopped(storage, sid, before or {}, logger=logger)
                watch.kept = True
            action = watch.next(info, time.monotonic(), confirm_s)
            if action == "ended":
                return
            if action == "give_up":
                not_ended(sid, info, confirm_s, watch.asks, logger)
                return
            if action == "ask":
                watch.asked_again(hook.stop_job(sid), time.monotonic())
            time.sleep(CONFIRM_POLL_S)
            info = job_info(hook.get_job_info, sid)
    except Exception:
        logger.exception("Could not stop Ray job %s", sid)


async def a_stop_killed(
    hook: RayJobsApi, storage: Storage, sid: str, *, logger: Any = log, confirm_s: float = CONFIRM_IN_TRIGGERER_S
) -> None:
    """``stop_killed`` in the triggerer's event loop (the storage's calls in a thread); raises as the stop does."""
    logger.info("Task killed: stopping Ray job %s", sid)
    before = await a_job_info(hook, sid)
    watch = Watch(started=time.monotonic(), asked=time.monotonic(), taken=await hook.a_stop_job(sid))
    info = before
    while True:
        if watch.taken and not watch.kept and ending(before):
            await asyncio.to_thread(keep_stopped, storage, sid, before or {}, logger=logger)
            watch.kept = True
        action = watch.next(info, time.monotonic(), confirm_s)
        if action == "ended":
            return
        if action == "give_up":
            not_ended(sid, info, confirm_s, watch.asks, logger)
            return
        if action == "ask":
            watch.asked_again(await hook.a_stop_job(sid), time.monotonic())
        await asyncio.sleep(CONFIRM_POLL_S)
        info = await a_job_info(hook, sid)


# A read of the job's info that failed: the stop goes on, and so does the watch (it does not say the job ended).
UNREAD: dict = {"status": "UNREAD"}


def job_info(get: Any, sid: str) -> dict | None:
    """Ray's info on the job (None: Ray does not know it), ``UNREAD`` when it cannot be read."""
    try:
        return get(sid)
    except Exception:
        return UNREAD


async def a_job_info(hook: RayJobsApi, sid: str) -> dict | None:
    try:
        return await hook.a_get_job_info(sid)
    except Exception:
        return UNREAD


def not_ended(sid: str, info: dict | None, waited_s: float, asks: int, logger: Any) -> None:
    status = "unreadable" if info is UNREAD else (info or {}).get("status")
    logger.warning(
        "Ray job %s was still %s %.0f s after it was asked to stop (%d times). If it goes on, stop it from a "
        "machine that reaches the cluster: ray job stop %s",
        sid,
        status,
        waited_s,
        asks,
        sid,
    )


def ending(info: dict | None) -> bool:
    """Whether Ray's job info, read before the stop, says the job had not ended (PENDING or RUNNING): one
    that had ended left its own record."""
    return info is not None and JobStatus.known(info.get("status")) in (JobStatus.PENDING, JobStatus.RUNNING)


def keep_stopped(storage: Storage, sid: str, info: dict, *, logger: Any = log) -> None:
    """The record of a provider's stopped attempt: the class of a STOPPED job (``failures.of_job``, which the
    Training view shows as a kill), unless the attempt has a record. Best effort."""
    meta = info.get("metadata") or {}
    uri, storage_uri = meta.get(META_RESULT_URI), meta.get(META_STORAGE_URI)
    if not uri or not storage_uri:
        return  # not a job of the provider's
    try:
        if storage.exists(uri):
            return
        attempt = int(meta[META_ATTEMPT])
        pending = JobStatus.known(info.get("status")) is JobStatus.PENDING
        message = UNSTARTED_MESSAGE if pending else STOPPED_MESSAGE
        failure = failures.of_job({"status": JobStatus.STOPPED.value, "message": message}, None)
        record = TaskRecord(
            submission_id=sid,
            attempt=attempt,
            storage_uri=storage_uri,
            run_uri=attempt_uri(storage_uri, attempt),
            failure=failure.to_dict(),
        )
        storage.write_json(uri, json.loads(record.to_json()))
        logger.info("Ray job %s was stopped (%s); the attempt's record: %s", sid, info.get("status"), uri)
    except Exception as err:  # the kill goes on; the record is what is lost
        logger.warning("Could not keep the record of the stopped attempt at %s: %s", uri, err)
