"""The operators' shared flow, one Ray job per task run, top-down: a finished plan (checks that raise,
then what the connection and the cluster add), start the job (``jobs.submit``), wait in the worker or
deferred to the triggerer (``jobs.wait``), finish (``jobs.finish``), push XCom (``xcoms``); and stop
the job when the task is killed."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from airflow.sdk import BaseOperator

from airflow_provider_horovod import airflow_compat, checks, runtime_env_checks
from airflow_provider_horovod.contract import (
    DEFERRABLE,
    PENDING_TIMEOUT_S,
    POLL_INTERVAL_S,
    RESUME_GUARD_S,
    STALL_TIMEOUT_S,
    XCOM_LOG_CURSOR,
    JobStatus,
    TaskRun,
)
from airflow_provider_horovod.exceptions import HorovodProviderError, TaskKilledError
from airflow_provider_horovod.hooks.ray import RayHook, WithRayHook
from airflow_provider_horovod.links.ray import RayJobLink
from airflow_provider_horovod.parameters import Declaration, Param

if TYPE_CHECKING:
    from airflow.sdk import BaseOperatorLink, Context

    from airflow_provider_horovod.jobs.events import JobEvent
    from airflow_provider_horovod.jobs.logs import LogCursor
    from airflow_provider_horovod.jobs.wait import Running, WaitPolicy
    from airflow_provider_horovod.plan import JobPlan
    from airflow_provider_horovod.storage import Storage

log = logging.getLogger(__name__)


# The parameters the sensor shares with the operators, declared once.
RAY_CONN_ID = Param(
    "Ray connection; without a `ray_default` connection, an embedded local Ray cluster is started.",
    templated=True,
    check=checks.check_ray_conn_id,
)
AWS_CONN_ID = Param(
    "AWS connection (Amazon provider) the Airflow side reads S3 storage with; None: the worker's own AWS environment.",
    templated=True,
)
PENDING_TIMEOUT_SECONDS = Param(
    "Fail (and stop the job) when it waits longer than this for resources: the job's driver (the "
    "job PENDING) or a training's workers (the job RUNNING, its worker group not started). None: "
    "wait without limit.",
    check=functools.partial(checks.check_positive, allow_none=True),
)
RETRY_ON_USER_ERROR = Param(
    "False: a failure of the user's code or configuration fails the task at once, whatever "
    "`retries` says; lost workers, nodes, capacity and storage are retried. True: those are "
    "retried too (docs/reliability.md).",
    check=checks.check_bool,
)


class BaseRayJobOperator(WithRayHook, BaseOperator):
    """Base of the provider's operators: one Ray job per task run, waited for and finished.

    With the ``[openlineage]`` extra, the OpenLineage listener reads the task's lineage from it
    (``lineage``: ``inlets``/``outlets`` Assets with URIs count too), and the job gets the task's
    OpenLineage run as ``OPENLINEAGE_PARENT_ID``/``OPENLINEAGE_ROOT_PARENT_ID`` (docs/lineage.md).
    Its parameters, shared by every operator of the provider, are declared in ``__init__``'s signature
    (``parameters``).
    """

    operator_extra_links: tuple[BaseOperatorLink, ...] = (RayJobLink(),)
    # How long a deferrable task follows its job in the worker before it defers; None: [horovod] defer_after_seconds.
    sync_wait_before_defer_s: float | None = None

    if TYPE_CHECKING:
        # Each declared parameter is an attribute of its name (``Declaration.store``), which mypy reads as
        # Any; the signature types the calls, the checks the values.
        def __getattr__(self, name: str) -> Any: ...

    def __init__(
        self,
        *,
        ray_conn_id: Annotated[
            str,
            RAY_CONN_ID,
        ] = RayHook.default_conn_name,
        deferrable: Annotated[
            bool,
            Param(
                "Wait in the triggerer, freeing the worker slot, after `[horovod] defer_after_seconds` in the "
                "worker (a task with a task-level limit waits there: docs/backfills.md). False: wait in the "
                "worker.",
                check=checks.check_bool,
            ),
        ] = DEFERRABLE,
        wait_for_completion: Annotated[
            bool,
            Param(
                "False: submit, push the submission id and return (a `RayJobSensor` waits).",
                check=checks.check_bool,
            ),
        ] = True,
        poll_interval_seconds: Annotated[
            float,
            Param(
                "Seconds between polls of the job's status and log: a line reaches the task log at the next "
                "poll (docs/reliability.md).",
                check=checks.check_positive,
            ),
        ] = POLL_INTERVAL_S,
        pending_timeout_seconds: Annotated[
            float | None,
            PENDING_TIMEOUT_SECONDS,
        ] = PENDING_TIMEOUT_S,
        stall_timeout_seconds: Annotated[
            float | None,
            Param(
                "Fail (and stop the job) when, running, it shows no progress for longer than this: no new line "
                "in its log (Ray Train logs every `ray.train.report`). The task's retry then runs the next "
                "attempt, resuming from the last checkpoint. None: no limit.",
                check=functools.partial(checks.check_positive, allow_none=True),
            ),
        ] = STALL_TIMEOUT_S,
        storage_path: Annotated[
            str | None,
            Param(
                "Root of the job's records and checkpoints: `s3://bucket/prefix`, or a local path shared by "
                "every Ray node and Airflow worker (docs/storage.md). None: `$AIRFLOW_HOME/horovod-storage`.",
                templated=True,
            ),
        ] = None,
        aws_conn_id: Annotated[
            str | None,
            AWS_CONN_ID,
        ] = None,
        retry_on_user_error: Annotated[
            bool,
            RETRY_ON_USER_ERROR,
        ] = False,
        job_tags: Annotated[
            dict[str, str] | None,
            Param(
                'Who the job is for, e.g. `{"team": "ranking", "cost_centre": "cc-4711"}`: set as the Ray '
                "job's metadata and returned in XCom (`job_tags`); `ahp_*` and `airflow_*` keys are the "
                "provider's.",
                templated=True,
                check=checks.check_job_tags,
            ),
        ] = None,
        prices: Annotated[
            dict[str, Any] | None,
            Param(
                'What the cluster\'s resources cost, `{"cpu_hour": 0.048, "gpu_hour": 2.45, "currency": '
                "\"USD\"}`: the task's `cost` then carries an `amount`. None: the connection's, else seconds "
                "only.",
                check=checks.check_prices,
            ),
        ] = None,
        runtime_env: Annotated[
            dict[str, Any] | None,
            Param(
                "Extra Ray runtime env (pip, working_dir, env_vars), merged over the connection's default. No "
                "secrets: Ray shows it to every dashboard reader.",
                templated=True,
                renderer="json",
                check=runtime_env_checks.check_runtime_env,
            ),
        ] = None,
        smoke_run: Annotated[
            bool | None,
            Param(
                "Run the job as a smoke run, the quick end-to-end check of a DAG in CI (docs/ci.md). None: "
                "Airflow's `[horovod] smoke_run` option decides."
            ),
        ] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.parameters.store(self, locals())
        # Kept on the instance in case the task gets killed; the "Ray job" link reads the URL.
        self.submission_id: str | None = None
        self.dashboard_url: str | None = None
        # The finished job's result, for OpenLineage: set where the task completes, so the resumed
        # instance of a deferred task (the one the listener sees) has it.
        self.job_result: dict[str, Any] | None = None
        self._killed: threading.Event | None = None  # made in execute: operators get copied

    parameters: ClassVar[Declaration] = Declaration.of(__init__)
    template_fields: Sequence[str] = parameters.template_fields
    template_fields_renderers = parameters.template_fields_renderers
    __doc__ = parameters.docstring(__doc__)

    # --- what a subclass provides: pure, and checked before anything is submitted ---------------

    def plan(self, task_run: TaskRun, policy: WaitPolicy, given: dict[str, Any], *, try_number: int | None) -> JobPlan:
        """The task run's job. ``given``: every declared parameter's value, each through its own check
        (``parameters``); the plan checks the others with those they depend on."""
        raise NotImplementedError

    def task_result(self, context: Context, result: dict[str, Any]) -> Any:
        """What the task returns, from ``jobs.finish.finish``'s result (its XComs by key are pushed)."""
        raise NotImplementedError

    # --- the flow -------------------------------------------------------------------------------

    @functools.cached_property
    def storage(self) -> Storage:
        # One S3 client a task process: a killed task's on_kill has 5 s until SIGKILL, no time for a new one.
        from airflow_provider_horovod.storage import Storage

        return Storage(self.aws_conn_id)

    def wait_policy(self) -> WaitPolicy:
        from airflow_provider_horovod.jobs.wait import WaitPolicy

        return WaitPolicy(self.poll_interval_seconds, self.pending_timeout_seconds, self.stall_timeout_seconds)

    def checked_plan(self, task_run: TaskRun, policy: WaitPolicy, *, try_number: int | None = None) -> JobPlan:
        """The plan from the parameters alone, each checked (nothing asked of the cluster yet)."""
        from airflow_provider_horovod import smoke_plan
        from airflow_provider_horovod.storage import check_aws_conn_id

        given = self.parameters.checked(self)
        plan = self.plan(task_run, policy, given, try_number=try_number)
        if smoke_plan.enabled(self.smoke_run):
            plan = smoke_plan.as_smoke(plan, smoke_plan.rows(given.get("smoke_rows")))
        # A missing AWS connection would otherwise show only after the job ended, when reading its result.
        check_aws_conn_id(self.aws_conn_id)
        return plan

    def finished_plan(self, context: Context, policy: WaitPolicy) -> JobPlan:
        """The task run's job, every decision made: the checked plan, its OpenLineage run, the cluster's part."""
        from airflow_provider_horovod import smoke_plan

        ti = context["ti"]
        plan = self.checked_plan(TaskRun.of(ti), policy, try_number=getattr(ti, "try_number", None))
        plan = with_parent_run(plan, context)
        cluster = self.hook.get_cluster_resources() if plan.spec.smoke_run else None
        plan, said = smoke_plan.for_cluster(plan, prices=self.hook.endpoint.prices, cluster=cluster)
        for line in said:
            self.log.info("%s", line)
        return plan

    def execute(self, context: Context) -> Any:
        from airflow_provider_horovod.jobs.events import JobEvent
        from airflow_provider_horovod.jobs.logs import LogCursor
        from airflow_provider_horovod.jobs.submit import start
        from airflow_provider_horovod.jobs.wait import follow_before_defer_s
        from airflow_provider_horovod.xcoms import push_job

        self._killed = killed = threading.Event()
        policy = self.wait_policy()
        follow_s = follow_before_defer_s() if self.sync_wait_before_defer_s is None else self.sync_wait_before_defer_s
        plan = self.finished_plan(context, policy)
        job = start(self.hook, plan, self.storage, logger=self.log, stopped=killed.is_set)
        sid = self.submission_id = job["submission_id"]
        if killed.is_set():
            # Killed while the job was being submitted (Airflow's SIGTERM handler runs on_kill and lets the
            # task go on): on_kill had no job to stop yet, so it is stopped here, and nothing waits for it.
            self.stop_killed_job(sid)
            raise TaskKilledError(
                f"Task killed while Ray job {sid} was being submitted; the job was stopped.",
                submission_id=sid,
                status=JobStatus.STOPPED.value,
            )
        self.dashboard_url = job["dashboard_url"]
        push_job(context["ti"], job)
        self.log.info("Ray job %s: %s", sid, job["dashboard_url"])
        if not self.wait_for_completion:
            return job
        cursor = LogCursor.from_dict(airflow_compat.state_get(context, XCOM_LOG_CURSOR), sid)
        if cursor.lines:
            self.log.info("The job's log up to line %s is in the task log of an earlier try.", cursor.lines)
        within_s = None  # not deferrable: wait here until the job ends
        if self.deferrable and (limit := self.slot_limit()):
            self.log.info(
                "%s: waiting for the job in this worker, not deferred, since a resumed task would wait for a "
                "slot behind the task instances of this limit. To defer, limit max_active_runs instead "
                "(docs/backfills.md).",
                limit,
            )
        elif self.deferrable:
            within_s = follow_s  # a job that ends within it never defers
        outcome = self.wait(context, sid, policy, cursor, within_s=within_s)
        if isinstance(outcome, JobEvent):
            return self.complete(context, outcome)
        self.log.info("The job runs on after %g s followed here ([horovod] defer_after_seconds): deferred.", within_s)
        self.defer_to_trigger(context, sid, policy, outcome)

    def slot_limit(self) -> str | None:
        """The task-level concurrency limit set on this task, as ``name=value`` (None without one)."""
        for name in ("max_active_tis_per_dag", "max_active_tis_per_dagrun"):
            if (value := getattr(self, name, None)) is not None:
                return f"{name}={value}"
        return None

    def defer_to_trigger(self, context: Context, sid: str, policy: WaitPolicy, running: Running) -> None:
        """Hand the job, still running, to the triggerer (``RayJobTrigger``); the task resumes in
        ``execute_complete``. The log cursor is in XCom too, where a restarted trigger reads it."""
        from airflow_provider_horovod.triggers.ray import RayJobTrigger

        context["ti"].xcom_push(key=XCOM_LOG_CURSOR, value=running.cursor.to_dict())
        self.defer(
            trigger=RayJobTrigger(
                submission_id=sid,
                ray_conn_id=self.ray_conn_id,
                policy=policy.to_dict(),
                log_cursor=running.cursor.to_dict(),
                not_before=time.time() + RESUME_GUARD_S,
                aws_conn_id=self.aws_conn_id,
            ),
            method_name="execute_complete",
            timeout=self.execution_timeout,
        )

    def wait(
        self, context: Context, sid: str, policy: WaitPolicy, cursor: LogCursor, *, within_s: float | None = None
    ) -> JobEvent | Running:
        """The wait in the worker, the job's log streamed into the task log: the job's event (an error's
        when the wait could not go on, as the trigger's), or ``Running`` when ``within_s`` ran out."""
        from airflow_provider_horovod import failures
        from airflow_provider_horovod.jobs.events import JobEvent
        from airflow_provider_horovod.jobs.wait import follow

        killed = self._killed
        where = cursor

        async def run() -> JobEvent | Running:
            nonlocal where
            try:
                async with contextlib.aclosing(
                    follow(self.hook, sid, policy=policy, cursor=cursor, within_s=within_s)
                ) as updates:
                    async for update in updates:
                        if update.lines:
                            airflow_compat.state_set(context, XCOM_LOG_CURSOR, update.cursor.to_dict())
                            for level, line in update.lines:
                                self.log.log(level, line)
                        where = update.cursor
                        if update.end is not None:
                            return update.end
                        if killed is not None and killed.is_set():
                            raise TaskKilledError(
                                f"Task killed; Ray job {sid} was stopped.",
                                submission_id=sid,
                                status=JobStatus.STOPPED.value,
                            )
            finally:
                await self.hook.aclose()
            raise AssertionError("follow ends with an update that says how it ended")

        try:
            return asyncio.run(run())
        except TaskKilledError:
            raise
        except HorovodProviderError as err:
            return JobEvent.error(
                sid, str(err), log_cursor=where.to_dict(), failure_class=failures.class_of_provider_error(err)
            )

    def execute_complete(self, context: Context, event: dict) -> Any:
        """Resume after the trigger's event (a new operator instance: everything comes from the event)."""
        from airflow_provider_horovod.jobs.events import JobEvent

        job_event = JobEvent.from_dict(event)
        self.submission_id = job_event.submission_id
        self.dashboard_url = self.hook.get_job_url(job_event.submission_id)
        if job_event.log_cursor:
            airflow_compat.state_set(context, XCOM_LOG_CURSOR, job_event.log_cursor)
        return self.complete(context, job_event)

    def complete(self, context: Context, event: JobEvent) -> Any:
        from airflow_provider_horovod.jobs.finish import finish
        from airflow_provider_horovod.xcoms import push_result

        with airflow_compat.failing_for_good(self.retry_on_user_error):
            result = finish(
                event,
                dashboard_url=self.hook.get_job_url(event.submission_id),
                storage=self.storage,
                try_number=getattr(context["ti"], "try_number", None),
            )
        self.job_result = result
        push_result(context["ti"], result)
        return self.task_result(context, result)

    # --- OpenLineage (the [openlineage] extra; only its listener calls these) --------------------

    def lineage(self, result: dict[str, Any] | None) -> Any:
        """The task's ``OperatorLineage``; ``result``: the finished job's (None: not finished)."""
        raise NotImplementedError

    def get_openlineage_facets_on_start(self) -> Any:
        return self.lineage(None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return self.lineage(self.job_result)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return self.lineage(None)

    def on_kill(self) -> None:
        # The signal handler must not raise: stop the job, and let the wait loop notice.
        if self._killed is not None:
            self._killed.set()
        if self.submission_id:
            self.stop_killed_job(self.submission_id)

    def stop_killed_job(self, sid: str) -> None:
        """Stop the job of a killed task, keeping its record if it had not started (never raises)."""
        from airflow_provider_horovod.jobs.stop import stop_killed

        stop_killed(self.hook, self.storage, sid, logger=self.log)


def with_parent_run(plan: JobPlan, context: Context) -> JobPlan:
    """The plan with the task's OpenLineage run in the job's environment (``OPENLINEAGE_PARENT_ID``,
    ``OPENLINEAGE_ROOT_PARENT_ID``), so lineage emitted inside the job links to the task. Unchanged
    without the [openlineage] extra (nothing of it is imported then) or with OpenLineage off."""
    import dataclasses
    import importlib.util

    if importlib.util.find_spec("airflow.providers.openlineage") is None:
        return plan
    from airflow.providers.openlineage import conf

    if conf.is_disabled():
        return plan
    from airflow_provider_horovod.lineage import parent_run_env

    try:
        env = parent_run_env(context["ti"])
    except Exception as err:  # lineage informs; it never fails a training
        log.warning("The task's OpenLineage run could not be passed to the job: %s", err)
        return plan
    return dataclasses.replace(plan, env_vars={**plan.env_vars, **env}) if env else plan
