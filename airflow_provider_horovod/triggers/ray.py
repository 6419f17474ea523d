"""RayJobTrigger: waits for a Ray job in the triggerer, streaming its log into the task log."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_horovod.exceptions import HorovodProviderError, InvalidParameterError
from airflow_provider_horovod.training import META_PREFIX, TERMINAL_STATES

LOG_TAIL_LINES = 40
# The task's XCom that remembers how far the job's log was streamed, so a trigger restarted by the
# triggerer (which gets its kwargs as they were at defer time) repeats no line in the task log.
XCOM_LOG_OFFSET = "ray_log_offset"


def job_event(info: dict | None, submission_id: str, *, status: str, message: str, log_tail: list[str],
              log_offset: int) -> dict[str, Any]:
    """The one event a trigger yields: JSON-safe, enough to finish the task without asking Ray again."""
    info = info or {}
    return {
        "status": status,  # "success" or "error"
        "submission_id": submission_id,
        "job_status": info.get("status"),
        "error_type": info.get("error_type"),
        "message": message,
        "metadata": info.get("metadata") or {},
        "log_tail": log_tail,
        "log_offset": log_offset,
    }


def pending_timeout_message(submission_id: str, waited_s: float, asked: dict, cluster: dict | None) -> str:
    have = json.dumps(cluster, sort_keys=True) if cluster is not None else "unknown"
    return (
        f"Ray job {submission_id} stayed PENDING for {waited_s:.0f} s (pending_timeout_seconds). "
        f"Its workers ask for {json.dumps(asked, sort_keys=True)}; the cluster has {have}. "
        "Give the cluster those resources, lower num_workers/resources_per_worker, or raise "
        "pending_timeout_seconds. The job was stopped."
    )


class RayJobTrigger(BaseTrigger):
    """Poll a Ray job until it ends; yield exactly one event.

    :param submission_id: the Ray job's submission id.
    :param ray_conn_id: the Ray connection (the embedded local cluster when it does not exist).
    :param poll_interval_seconds: seconds between status polls.
    :param pending_timeout_seconds: fail (and stop the job) when it stays PENDING longer than this,
        measured from the job's own start time so a triggerer restart does not reset it. None: no limit.
    :param log_offset: log lines already shown in the task log; only later ones are streamed.
    :param stream_logs: stream the job's log into the task log.
    """

    def __init__(self, *, submission_id: str, ray_conn_id: str = "ray_default",
                 poll_interval_seconds: float = 1.0, pending_timeout_seconds: float | None = 600.0,
                 log_offset: int = 0, stream_logs: bool = True):
        super().__init__()
        if not isinstance(submission_id, str) or not submission_id:
            raise InvalidParameterError("submission_id", submission_id, "give the Ray job's submission id.")
        if not isinstance(poll_interval_seconds, (int, float)) or poll_interval_seconds <= 0:
            raise InvalidParameterError("poll_interval_seconds", poll_interval_seconds, "give a number > 0.")
        if pending_timeout_seconds is not None and (
            not isinstance(pending_timeout_seconds, (int, float)) or pending_timeout_seconds <= 0
        ):
            raise InvalidParameterError("pending_timeout_seconds", pending_timeout_seconds, "give a number > 0 or None.")
        self.submission_id = submission_id
        self.ray_conn_id = ray_conn_id
        self.poll_interval_seconds = poll_interval_seconds
        self.pending_timeout_seconds = pending_timeout_seconds
        self.log_offset = int(log_offset)
        self.stream_logs = stream_logs

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "submission_id": self.submission_id,
                "ray_conn_id": self.ray_conn_id,
                "poll_interval_seconds": self.poll_interval_seconds,
                "pending_timeout_seconds": self.pending_timeout_seconds,
                "log_offset": self.log_offset,
                "stream_logs": self.stream_logs,
            },
        )

    def _hook(self):
        from airflow_provider_horovod.hooks.ray import RayHook

        return RayHook(ray_conn_id=self.ray_conn_id)

    def _xcom_key(self) -> dict | None:
        ti = self.task_instance
        if ti is None:
            return None
        return {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id,
                "map_index": getattr(ti, "map_index", -1)}

    async def _streamed_offset(self) -> int:
        """How far an earlier run of this trigger streamed the log (0 when none did)."""
        if (key := self._xcom_key()) is None:
            return 0
        try:
            from airflow.sdk.execution_time.xcom import XCom

            saved = await XCom.aget_one(key=XCOM_LOG_OFFSET, **key)
        except Exception:  # no Airflow API here (e.g. a bare test): nothing was saved
            self.log.warning("Could not read the log offset; the job's log is streamed from line %s.",
                             self.log_offset)
            self._xcom_key = lambda: None
            return 0
        return int(saved.get("offset", 0)) if isinstance(saved, dict) and saved.get("submission_id") == \
            self.submission_id else 0

    async def _save_offset(self, offset: int) -> None:
        if (key := self._xcom_key()) is None:
            return
        try:
            from airflow.sdk.execution_time.xcom import XCom

            await XCom.aset(key=XCOM_LOG_OFFSET, value={"submission_id": self.submission_id, "offset": offset},
                            **key)
        except Exception:
            self.log.warning("Could not save the log offset; a triggerer restart may repeat log lines.")
            self._xcom_key = lambda: None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        offset = max(self.log_offset, await self._streamed_offset())
        sid = self.submission_id
        try:
            while True:
                info = await hook.a_get_job_info(sid)
                if info is None:
                    yield TriggerEvent(job_event(None, sid, status="error", log_tail=[], log_offset=offset,
                                                 message=f"Ray job {sid} does not exist on the cluster."))
                    return
                state = info.get("status")
                terminal = state in TERMINAL_STATES
                if self.stream_logs:
                    lines, new_offset = await hook.a_get_job_logs_since(sid, offset, final=terminal)
                    if lines:
                        # Saved before the lines are written: a restart may skip a batch, never repeat one.
                        await self._save_offset(new_offset)
                    offset = new_offset
                    for line in lines:
                        self.log.info("[ray] %s", line)
                if terminal:
                    tail: list[str] = []
                    if state != "SUCCEEDED":
                        tail = (await hook.a_get_job_logs(sid)).splitlines()[-LOG_TAIL_LINES:]
                    yield TriggerEvent(job_event(
                        info, sid, status="success" if state == "SUCCEEDED" else "error",
                        message=info.get("message") or "", log_tail=tail, log_offset=offset))
                    return
                if state == "PENDING" and self.pending_timeout_seconds:
                    waited = time.time() - (info.get("start_time") or time.time() * 1000) / 1000
                    if waited > self.pending_timeout_seconds:
                        await hook.a_stop_job(sid)
                        asked = json.loads((info.get("metadata") or {}).get(f"{META_PREFIX}resources", "{}"))
                        try:
                            cluster = await hook.a_get_cluster_resources()
                        except HorovodProviderError:
                            cluster = None
                        yield TriggerEvent(job_event(
                            info, sid, status="error", log_tail=[], log_offset=offset,
                            message=pending_timeout_message(sid, waited, asked, cluster)))
                        return
                await asyncio.sleep(self.poll_interval_seconds)
        except HorovodProviderError as err:
            yield TriggerEvent(job_event(None, sid, status="error", message=str(err), log_tail=[],
                                         log_offset=offset))

    async def on_kill(self) -> None:
        # Only a user's kill lands here (not a triggerer restart): the job must not outlive the task.
        self.log.info("Task killed: stopping Ray job %s", self.submission_id)
        await self._hook().a_stop_job(self.submission_id)
