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
from typing import TYPE_CHECKING, Any

from airflow_provider_horovod import failures
from airflow_provider_horovod.contract import META_ATTEMPT, META_RESULT_URI, META_STORAGE_URI, JobStatus, attempt_uri
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


def stop_killed(hook: RayJobsApi, storage: Storage, sid: str, *, logger: Any = log) -> None:
    """Stop the job of a killed task and keep the attempt's record; never raises (an operator's ``on_kill``
    runs in a signal handler)."""
    logger.info("Task killed: stopping Ray job %s", sid)
    try:
        info = hook.get_job_info(sid)
    except Exception:  # the stop matters more than the record
        info = None
    try:
        if hook.stop_job(sid) and ending(info):
            keep_stopped(storage, sid, info or {}, logger=logger)
    except Exception:
        logger.exception("Could not stop Ray job %s", sid)


async def a_stop_killed(hook: RayJobsApi, storage: Storage, sid: str, *, logger: Any = log) -> None:
    """``stop_killed`` in the triggerer's event loop (the storage's calls in a thread); raises as the stop does."""
    logger.info("Task killed: stopping Ray job %s", sid)
    try:
        info = await hook.a_get_job_info(sid)
    except Exception:  # the stop matters more than the record
        info = None
    if await hook.a_stop_job(sid) and ending(info):
        await asyncio.to_thread(keep_stopped, storage, sid, info or {}, logger=logger)


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
