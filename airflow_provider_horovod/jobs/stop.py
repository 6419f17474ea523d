"""Stopping a killed task's job, and the record of the attempt it stops.

The side that stops a job keeps the attempt's record at once, unless one is there, since the driver may
not: a PENDING job's driver (its supervisor not started yet: busy nodes, a runtime_env being set up) gets
SIGTERM before Python starts the entrypoint, and a running driver may not unwind and write within Ray's
SIGKILL grace (a busy node, storage refusing for a while). A driver that does write replaces that record
with its own, which holds its timings and metric history (``runtime.entrypoint.report_stop``).
"""

from __future__ import annotations

import asyncio
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
CONFIRM_POLL_S = 0.5


def stop_killed(
    hook: RayJobsApi, storage: Storage, sid: str, *, logger: Any = log, confirm_s: float = CONFIRM_IN_WORKER_S
) -> None:
    """Stop the job of a killed task, keep the attempt's record, and watch the job end for up to ``confirm_s``
    (asking again while it runs on); never raises (an operator's ``on_kill`` runs in a signal handler)."""
    logger.info("Task killed: stopping Ray job %s", sid)
    info = job_info(hook.get_job_info, sid)
    try:
        if hook.stop_job(sid) and ending(info):
            keep_stopped(storage, sid, info or {}, logger=logger)
        if info is not None and info is not UNREAD and not ending(info):
            return
        started = asked = time.monotonic()
        asks = 1
        while (info := job_info(hook.get_job_info, sid)) is UNREAD or ending(info):
            if time.monotonic() - started >= confirm_s:
                not_ended(sid, info, confirm_s, asks, logger)
                return
            time.sleep(CONFIRM_POLL_S)
            if time.monotonic() - asked >= ASK_AGAIN_S:
                hook.stop_job(sid)
                asked, asks = time.monotonic(), asks + 1
    except Exception:
        logger.exception("Could not stop Ray job %s", sid)


async def a_stop_killed(
    hook: RayJobsApi, storage: Storage, sid: str, *, logger: Any = log, confirm_s: float = CONFIRM_IN_TRIGGERER_S
) -> None:
    """``stop_killed`` in the triggerer's event loop (the storage's calls in a thread); raises as the stop does."""
    logger.info("Task killed: stopping Ray job %s", sid)
    info = await a_job_info(hook, sid)
    if await hook.a_stop_job(sid) and ending(info):
        await asyncio.to_thread(keep_stopped, storage, sid, info or {}, logger=logger)
    if info is not None and info is not UNREAD and not ending(info):
        return
    started = asked = time.monotonic()
    asks = 1
    while (info := await a_job_info(hook, sid)) is UNREAD or ending(info):
        if time.monotonic() - started >= confirm_s:
            not_ended(sid, info, confirm_s, asks, logger)
            return
        await asyncio.sleep(CONFIRM_POLL_S)
        if time.monotonic() - asked >= ASK_AGAIN_S:
            await hook.a_stop_job(sid)
            asked, asks = time.monotonic(), asks + 1


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
