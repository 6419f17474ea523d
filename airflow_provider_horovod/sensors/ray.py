"""RayJobSensor: waits for a Ray job that is already running."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf

from airflow_provider_horovod.exceptions import InvalidParameterError, RayJobError
from airflow_provider_horovod.links.ray import RayJobLink, push_job_link
from airflow_provider_horovod.results import (
    collect_result,
    is_provider_job,
    mark_consumed,
    push_result,
    raise_for_failure,
)
from airflow_provider_horovod.storage import Storage
from airflow_provider_horovod.training import TERMINAL_STATES, check_positive
from airflow_provider_horovod.triggers.ray import LOG_TAIL_LINES, RayJobTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


def check_seconds(parameter: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf:
        raise InvalidParameterError(parameter, value, "give seconds (0 or more) or a timedelta.")


class RayJobSensor(BaseSensorOperator):
    """Wait for a Ray job to end; fail when it ends FAILED or STOPPED.

    For a job started by ``HorovodTrainOperator`` (e.g. with ``wait_for_completion=False``) it
    returns the same result dict as the operator, with the verified ``checkpoint_uri``; for any
    other job, its submission id, status, dashboard URL and metadata.

    :param submission_id: the Ray job's submission id (templated), e.g.
        ``"{{ ti.xcom_pull(task_ids='train', key='submission_id') }}"``.
    :param ray_conn_id: Ray connection (templated); without ``ray_default``, the embedded local cluster.
    :param aws_conn_id: AWS connection used to read S3 storage; None: the worker's AWS environment.
    :param deferrable: wait in the triggerer (``poke_interval`` is the poll interval there).
    :param pending_timeout_seconds: in deferrable mode, fail when the job stays PENDING longer.
    """

    template_fields: Sequence[str] = ("submission_id", "ray_conn_id", "aws_conn_id")
    operator_extra_links = (RayJobLink(),)

    def __init__(
        self,
        *,
        submission_id: str,
        ray_conn_id: str = "ray_default",
        aws_conn_id: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        pending_timeout_seconds: float | None = None,
        **kwargs,
    ) -> None:
        # BaseSensorOperator refuses these here already (at parse time), in words that show neither
        # the value nor the task; the same check, with a message like the provider's others.
        for name in ("poke_interval", "timeout"):
            if name in kwargs:
                check_seconds(name, kwargs[name], allow_none=name == "timeout")
        super().__init__(**kwargs)
        self.submission_id = submission_id
        self.ray_conn_id = ray_conn_id
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable
        self.pending_timeout_seconds = pending_timeout_seconds

    def _hook(self):
        from airflow_provider_horovod.hooks.ray import RayHook

        return RayHook(ray_conn_id=self.ray_conn_id)

    def _check_submission_id(self) -> str:
        sid = self.submission_id
        if not isinstance(sid, str) or not sid.strip():
            raise InvalidParameterError(
                "submission_id", sid,
                "give the Ray job's submission id, e.g. \"{{ ti.xcom_pull(task_ids='train', key='submission_id') }}\".",
            )
        sid = sid.strip()
        if sid == "None":
            # What "{{ ti.xcom_pull(...) }}" renders to when the upstream task pushed nothing.
            raise InvalidParameterError(
                "submission_id", sid,
                "the template rendered None: the task it pulls from pushed no submission id; check task_ids "
                "and key='submission_id' in xcom_pull.",
            )
        if any(c in sid for c in "/?#") or any(c.isspace() for c in sid):
            raise InvalidParameterError(
                "submission_id", sid,
                "a Ray submission id has no spaces, '/', '?' or '#'; give the id as the Ray dashboard shows it "
                "(e.g. 'raysubmit_...', or 'ahp-...-a1' for HorovodTrainOperator's jobs).",
            )
        return sid

    def _check_inputs(self) -> str:
        """Every argument, checked before the cluster is asked anything."""
        from airflow_provider_horovod.hooks.ray import check_conn_id
        from airflow_provider_horovod.operators.horovod import check_aws_conn_id

        sid = self._check_submission_id()
        check_conn_id(self.ray_conn_id)
        if not isinstance(self.deferrable, bool):
            raise InvalidParameterError("deferrable", self.deferrable, "give True or False.")
        check_positive("pending_timeout_seconds", self.pending_timeout_seconds, allow_none=True)
        if self.deferrable and self.poke_interval <= 0:
            raise InvalidParameterError(
                "poke_interval", self.poke_interval,
                "in deferrable mode it is the triggerer's poll interval: give seconds greater than 0.",
            )
        # A missing AWS connection would otherwise show only after the job ended, when reading its result.
        check_aws_conn_id(self.aws_conn_id)
        return sid

    def execute(self, context: Context) -> Any:
        sid = self._check_inputs()
        push_job_link(context, self._hook().get_job_url(sid))
        if not self.deferrable:
            return super().execute(context)
        done = self.poke(context)
        if done:
            return done.xcom_value
        self.defer(
            trigger=RayJobTrigger(
                submission_id=sid,
                ray_conn_id=self.ray_conn_id,
                poll_interval_seconds=float(self.poke_interval),
                pending_timeout_seconds=self.pending_timeout_seconds,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def poke(self, context: Context) -> PokeReturnValue | bool:
        sid = self._check_submission_id()
        hook = self._hook()
        info = hook.get_job_info(sid)
        if info is None:
            raise RayJobError(
                f"Ray job {sid!r} does not exist on the cluster of connection {self.ray_conn_id!r}; "
                "check submission_id and ray_conn_id.", submission_id=sid)
        state = info.get("status")
        self.log.info("Ray job %s is %s", sid, state)
        if state not in TERMINAL_STATES:
            return False
        tail = [] if state == "SUCCEEDED" else hook.get_job_logs(sid).splitlines()[-LOG_TAIL_LINES:]
        result = self._outcome(context, hook, sid, state, info.get("error_type"), info.get("message") or "",
                               info.get("metadata") or {}, tail)
        return PokeReturnValue(is_done=True, xcom_value=result)

    def execute_complete(self, context: Context, event: dict) -> Any:
        return self._outcome(context, self._hook(), event["submission_id"], event.get("job_status"),
                             event.get("error_type"), event.get("message") or "", event.get("metadata") or {},
                             event.get("log_tail") or [], failed=event.get("status") != "success")

    def _outcome(self, context: Context, hook, sid: str, job_status: str | None, error_type: str | None,
                 message: str, metadata: dict, log_tail: list[str], failed: bool | None = None) -> Any:
        if failed is None:
            failed = job_status != "SUCCEEDED"
        if failed:
            raise_for_failure(sid, job_status, error_type, message, log_tail)
        url = hook.get_job_url(sid)
        if not is_provider_job(metadata):
            return {"submission_id": sid, "status": job_status, "dashboard_url": url, "metadata": metadata}
        storage = Storage(self.aws_conn_id)
        result = collect_result(metadata, submission_id=sid, dashboard_url=url, storage=storage)
        mark_consumed(storage, result, try_number=getattr(context["ti"], "try_number", None))
        return push_result(context, result)
