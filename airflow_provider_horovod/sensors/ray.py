"""RayJobSensor: waits for a Ray job that is already running."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_provider_horovod import airflow_compat, checks
from airflow_provider_horovod.contract import (
    DEFERRABLE,
    LOG_TAIL_LINES,
    POLL_INTERVAL_S,
    RESUME_GUARD_S,
    SENSOR_PENDING_TIMEOUT_S,
    JobStatus,
)
from airflow_provider_horovod.exceptions import InvalidParameterError, RayJobError
from airflow_provider_horovod.hooks.ray import RayHook, WithRayHook
from airflow_provider_horovod.links.ray import RayJobLink
from airflow_provider_horovod.operators.base import (
    AWS_CONN_ID,
    PENDING_TIMEOUT_SECONDS,
    RAY_CONN_ID,
    RETRY_ON_USER_ERROR,
)
from airflow_provider_horovod.parameters import Declaration, Param

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_horovod.jobs.wait import WaitPolicy


class RayJobSensor(WithRayHook, BaseSensorOperator):
    """Wait for a Ray job to end; fail when it ends FAILED or STOPPED.

    For a job started by ``HorovodTrainOperator`` (e.g. with ``wait_for_completion=False``) it
    returns the same result dict as the operator, with the verified ``checkpoint_uri``, its
    ``cost`` and ``job_tags``; for any other job, its submission id, status, dashboard URL, metadata
    and ``job_tags`` (none). It takes no ``job_tags`` of its own: the job already has its metadata.
    ``poke_interval`` is the poll interval, in the triggerer too. Its parameters:
    """

    operator_extra_links = (RayJobLink(),)

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...

    def __init__(
        self,
        *,
        submission_id: Annotated[
            str,
            Param(
                "The Ray job's submission id, e.g. `\"{{ ti.xcom_pull(task_ids='train', key='submission_id') }}\"`.",
                templated=True,
                check=checks.check_submission_id,
            ),
        ],
        ray_conn_id: Annotated[str, RAY_CONN_ID] = RayHook.default_conn_name,
        aws_conn_id: Annotated[str | None, AWS_CONN_ID] = None,
        deferrable: Annotated[
            bool,
            Param(
                "Wait in the triggerer, whatever Airflow's `[operators] default_deferrable` says, as the "
                "provider's operators do.",
                check=checks.check_bool,
            ),
        ] = DEFERRABLE,
        pending_timeout_seconds: Annotated[float | None, PENDING_TIMEOUT_SECONDS] = SENSOR_PENDING_TIMEOUT_S,
        retry_on_user_error: Annotated[bool, RETRY_ON_USER_ERROR] = False,
        **kwargs: Any,
    ) -> None:
        # BaseSensorOperator refuses these here already (at parse time), in words that show neither
        # the value nor the task; the same check, with a message like the provider's others.
        for name in ("poke_interval", "timeout"):
            if name in kwargs:
                checks.check_seconds(name, kwargs[name], allow_none=name == "timeout")
        super().__init__(**kwargs)
        self.parameters.store(self, locals())
        self.dashboard_url: str | None = None  # the "Ray job" link, once known

    parameters: ClassVar[Declaration] = Declaration.of(__init__)
    template_fields: Sequence[str] = parameters.template_fields
    __doc__ = parameters.docstring(__doc__)

    def wait_policy(self) -> WaitPolicy:
        """The poke interval is the triggerer's poll interval; no stall timeout (the job is not ours)."""
        from airflow_provider_horovod.jobs.wait import WaitPolicy

        if self.deferrable and self.poke_interval <= 0:
            raise InvalidParameterError(
                "poke_interval",
                self.poke_interval,
                "in deferrable mode it is the triggerer's poll interval: give seconds greater than 0.",
            )
        return WaitPolicy(float(self.poke_interval) or POLL_INTERVAL_S, self.pending_timeout_seconds, None)

    def _check_inputs(self) -> tuple[str, WaitPolicy]:
        """Every argument, checked before the cluster is asked anything."""
        from airflow_provider_horovod.storage import check_aws_conn_id

        sid = self.parameters.checked(self)["submission_id"]
        policy = self.wait_policy()
        # A missing AWS connection would otherwise show only after the job ended, when reading its result.
        check_aws_conn_id(self.aws_conn_id)
        return sid, policy

    def execute(self, context: Context) -> Any:
        sid, policy = self._check_inputs()
        self.dashboard_url = self.hook.get_job_url(sid)
        context["ti"].xcom_push(key=RayJobLink().xcom_key, value=self.dashboard_url)
        if not self.deferrable:
            return super().execute(context)
        done = self.poke(context)
        if isinstance(done, PokeReturnValue):
            return done.xcom_value
        from airflow_provider_horovod.triggers.ray import RayJobTrigger

        self.defer(
            trigger=RayJobTrigger(
                submission_id=sid,
                ray_conn_id=self.ray_conn_id,
                policy=policy.to_dict(),
                not_before=time.time() + RESUME_GUARD_S,
                aws_conn_id=self.aws_conn_id,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def poke(self, context: Context) -> PokeReturnValue | bool:
        from airflow_provider_horovod.jobs.logs import LogCursor
        from airflow_provider_horovod.jobs.wait import Poll, step

        sid = checks.check_submission_id("submission_id", self.submission_id)
        info = self.hook.get_job_info(sid)
        if info is None:
            raise RayJobError(
                f"Ray job {sid!r} does not exist on the cluster of connection {self.ray_conn_id!r}; "
                "check submission_id and ray_conn_id.",
                submission_id=sid,
            )
        self.log.info("Ray job %s is %s", sid, info.get("status"))
        # A failure shows the log's last lines.
        status = JobStatus.known(info.get("status"))
        failed = status is not None and status.ended_without_success
        tail = self.hook.get_job_logs(sid).splitlines()[-LOG_TAIL_LINES:] if failed else []
        result = step(self.wait_policy(), LogCursor(sid), Poll(info, time.time(), tail=tail))
        if result.timeout is not None:
            self.hook.stop_job(sid)
            from airflow_provider_horovod.hooks.ray import cluster_or_none

            event = result.timeout.event(cluster_or_none(self.hook), result.cursor)
            return self.execute_complete(context, event.to_dict())
        if result.event is None:
            return False
        return PokeReturnValue(is_done=True, xcom_value=self.execute_complete(context, result.event.to_dict()))

    def execute_complete(self, context: Context, event: dict) -> Any:
        from airflow_provider_horovod.jobs.events import JobEvent
        from airflow_provider_horovod.jobs.finish import finish
        from airflow_provider_horovod.storage import Storage
        from airflow_provider_horovod.xcoms import push_result

        job_event = JobEvent.from_dict(event)
        self.dashboard_url = self.hook.get_job_url(job_event.submission_id)
        with airflow_compat.failing_for_good(self.retry_on_user_error):
            result = finish(
                job_event,
                dashboard_url=self.dashboard_url,
                storage=Storage(self.aws_conn_id),
                try_number=getattr(context["ti"], "try_number", None),
            )
        push_result(context["ti"], result)
        return result
