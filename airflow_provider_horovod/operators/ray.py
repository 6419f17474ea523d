"""The operators' shared flow, one Ray job per task run: plan (checks that raise), start the job
(``jobs.submit``), wait in the worker or deferred to the triggerer (``jobs.wait``), finish
(``jobs.finish``); and stop the job when the task is killed. ``RayTaskOperator`` runs one function."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_horovod import compat
from airflow_provider_horovod.contract import (
    DEFERRABLE,
    PENDING_TIMEOUT_S,
    POLL_INTERVAL_S,
    RESUME_GUARD_S,
    STALL_TIMEOUT_S,
    SYNC_WAIT_BEFORE_DEFER_S,
    XCOM_COST,
    XCOM_JOB,
    XCOM_LOG_CURSOR,
    XCOM_SUBMISSION_ID,
    SubmittedJob,
    TaskRun,
)
from airflow_provider_horovod.links.ray import RayJobLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperatorLink, Context

    from airflow_provider_horovod.hooks.ray import RayHook
    from airflow_provider_horovod.jobs.logs import LogCursor
    from airflow_provider_horovod.jobs.wait import JobEvent, WaitPolicy
    from airflow_provider_horovod.plan import JobPlan
    from airflow_provider_horovod.storage import Storage

log = logging.getLogger(__name__)


class BaseRayJobOperator(BaseOperator):
    """Base of the provider's operators: one Ray job per task run, waited for and finished.

    With the ``[openlineage]`` extra, the OpenLineage listener reads the task's lineage from it
    (``lineage``: ``inlets``/``outlets`` Assets with URIs count too), and the job gets the task's
    OpenLineage run as ``OPENLINEAGE_PARENT_ID``/``OPENLINEAGE_ROOT_PARENT_ID`` (README, "Lineage").

    :param ray_conn_id: Ray connection; without a ``ray_default`` connection, an embedded local Ray
        cluster is started (templated).
    :param deferrable: wait in the triggerer, freeing the worker slot (default True, whatever Airflow's
        ``[operators] default_deferrable`` says: a training waits for hours). A job that ends within
        its first seconds is finished in the worker, without a deferral; so is a task with a task-level
        limit (``max_active_tis_per_dag``, ``max_active_tis_per_dagrun``), whose resume would wait for
        a slot behind other task instances (README, "Backfills and a busy cluster"). False: wait in
        the worker.
    :param wait_for_completion: False: submit, push the submission id and return (a
        ``RayJobSensor`` waits).
    :param poll_interval_seconds: seconds between polls of the job's status and log: a line reaches
        the task log at the next poll (docs/reliability.md).
    :param pending_timeout_seconds: fail (and stop the job) when it waits longer than this for
        resources: the job's driver (the job PENDING) or a training's workers (the job RUNNING, its
        worker group not started). None: wait without limit.
    :param stall_timeout_seconds: fail (and stop the job) when, running, it shows no progress for
        longer than this: no new line in its log (Ray Train logs every ``ray.train.report``). The
        task's retry then runs the next attempt, resuming from the last checkpoint. None (default):
        no limit.
    :param storage_path: root of the job's records (and checkpoints) (templated): ``s3://bucket/prefix``,
        or an absolute local path (``file://`` too) on the embedded cluster or on a filesystem shared
        by every Ray node and the Airflow workers. Each task run writes under its own folder.
        Default: ``$AIRFLOW_HOME/horovod-storage``.
    :param aws_conn_id: AWS connection (Amazon provider) the Airflow side reads S3 storage with;
        None: the worker's own AWS environment (templated).
    :param retry_on_user_error: False (default): a failure in the user's function
        (``UserCodeError``) or in what the task asks for (``ConfigurationError``) fails the task at
        once, whatever ``retries`` says, and Ray Train does not restart the workers for it either;
        lost workers, nodes, capacity and storage are retried. True: those are retried too (and an
        Airflow 3.3 ``retry_policy`` decides them).
    :param job_tags: who the job is for, e.g. ``{"team": "ranking", "model": "ctr", "cost_centre":
        "cc-4711"}`` (templated): strings to strings, set as the Ray job's metadata (the dashboard and
        the Jobs API filter on them) and returned in XCom (``job_tags``). Keys ``ahp_*`` and the
        ``airflow_*`` ids are the provider's.
    :param prices: what the cluster's resources cost, ``{"cpu_hour": 0.048, "gpu_hour": 2.45,
        "currency": "USD"}``: the task's ``cost`` then carries an ``amount``. None: seconds only.
    """

    template_fields: Sequence[str] = ("ray_conn_id", "storage_path", "aws_conn_id", "job_tags")
    operator_extra_links: tuple[BaseOperatorLink, ...] = (RayJobLink(),)
    # How long a deferrable task follows its job in the worker before it defers.
    sync_wait_before_defer_s: float = SYNC_WAIT_BEFORE_DEFER_S

    def __init__(
        self,
        *,
        ray_conn_id: str = "ray_default",
        deferrable: bool = DEFERRABLE,
        wait_for_completion: bool = True,
        poll_interval_seconds: float = POLL_INTERVAL_S,
        pending_timeout_seconds: float | None = PENDING_TIMEOUT_S,
        stall_timeout_seconds: float | None = STALL_TIMEOUT_S,
        storage_path: str | None = None,
        aws_conn_id: str | None = None,
        retry_on_user_error: bool = False,
        job_tags: dict[str, str] | None = None,
        prices: dict[str, Any] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.job_tags = job_tags
        self.prices = prices
        self.retry_on_user_error = retry_on_user_error
        self.ray_conn_id = ray_conn_id
        self.storage_path = storage_path
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable
        self.wait_for_completion = wait_for_completion
        self.poll_interval_seconds = poll_interval_seconds
        self.pending_timeout_seconds = pending_timeout_seconds
        self.stall_timeout_seconds = stall_timeout_seconds
        # Kept on the instance in case the task gets killed; the "Ray job" link reads the URL.
        self.submission_id: str | None = None
        self.dashboard_url: str | None = None
        # The finished job's result, for OpenLineage: set where the task completes, so the resumed
        # instance of a deferred task (the one the listener sees) has it.
        self.job_result: dict[str, Any] | None = None
        self._killed: threading.Event | None = None  # made in execute: operators get copied

    # --- what a subclass provides: pure, and checked before anything is submitted ---------------

    def plan(self, task_run: TaskRun, policy: WaitPolicy) -> JobPlan:
        """The task run's job, every parameter of the subclass checked."""
        raise NotImplementedError

    def task_result(self, context: Context, result: dict[str, Any]) -> Any:
        """What the task returns, from ``jobs.finish.finish``'s result."""
        raise NotImplementedError

    # --- the flow -------------------------------------------------------------------------------

    @cached_property
    def hook(self) -> RayHook:
        from airflow_provider_horovod.hooks.ray import RayHook

        return RayHook(ray_conn_id=self.ray_conn_id)

    @property
    def storage(self) -> Storage:
        from airflow_provider_horovod.storage import Storage

        return Storage(self.aws_conn_id)

    def wait_policy(self) -> WaitPolicy:
        from airflow_provider_horovod.jobs.wait import WaitPolicy

        return WaitPolicy(self.poll_interval_seconds, self.pending_timeout_seconds, self.stall_timeout_seconds)

    def checked_plan(self, task_run: TaskRun, policy: WaitPolicy) -> JobPlan:
        from airflow_provider_horovod.checks import check_bool, check_ray_conn_id
        from airflow_provider_horovod.storage import check_aws_conn_id

        check_ray_conn_id(self.ray_conn_id)
        check_bool("deferrable", self.deferrable)
        check_bool("wait_for_completion", self.wait_for_completion)
        check_bool("retry_on_user_error", self.retry_on_user_error)
        plan = self.plan(task_run, policy)
        # A missing AWS connection would otherwise show only after the job ended, when reading its result.
        check_aws_conn_id(self.aws_conn_id)
        return plan

    def execute(self, context: Context) -> Any:
        from airflow_provider_horovod.jobs.logs import LogCursor
        from airflow_provider_horovod.jobs.submit import start

        self._killed = threading.Event()
        policy = self.wait_policy()
        plan = self.checked_plan(TaskRun.of(context["ti"]), policy)
        plan = with_parent_run(plan, context)
        job = start(self.hook, plan, self.storage, logger=self.log)
        sid = self.submission_id = job["submission_id"]
        self.dashboard_url = job["dashboard_url"]
        push_job(context, job)
        self.log.info("Ray job %s: %s", sid, job["dashboard_url"])
        if not self.wait_for_completion:
            return job
        cursor = LogCursor.from_dict(compat.state_get(context, XCOM_LOG_CURSOR), sid)
        if cursor.lines:
            self.log.info("The job's log up to line %s is in the task log of an earlier try.", cursor.lines)
        if self.deferrable and (limit := self.slot_limit()):
            self.log.info(
                "%s: waiting for the job in this worker, not deferred. A deferred task must be scheduled again "
                "to finish once its job ends, and under a task-level limit a waiting task instance may take "
                "that slot first, so the finished one would wait for its whole job. To defer, limit the DAG's "
                "runs (max_active_runs) instead; let trainings that do not fit queue on the cluster.",
                limit,
            )
        elif self.deferrable:
            return self.wait_deferred(context, sid, policy, cursor)
        event = self.wait(context, sid, policy, cursor)
        assert event is not None  # without a time limit the wait ends with the job
        return self.complete(context, event)

    def slot_limit(self) -> str | None:
        """The task-level concurrency limit set on this task (it counts deferred task instances, and a
        resume must win a slot again), as ``name=value``; None without one."""
        for name in ("max_active_tis_per_dag", "max_active_tis_per_dagrun"):
            if (value := getattr(self, name, None)) is not None:
                return f"{name}={value}"
        return None

    def wait_deferred(self, context: Context, sid: str, policy: WaitPolicy, cursor: LogCursor) -> Any:
        """Follow the job here for its first seconds, then defer to the triggerer."""
        from airflow_provider_horovod.triggers.ray import RayJobTrigger

        latest = [cursor]
        event = self.wait(context, sid, policy, cursor, within_s=self.sync_wait_before_defer_s, seen=latest.append)
        if event is not None:
            return self.complete(context, event)
        cursor = latest[-1]
        context["ti"].xcom_push(key=XCOM_LOG_CURSOR, value=cursor.to_dict())
        self.defer(
            trigger=RayJobTrigger(
                submission_id=sid,
                ray_conn_id=self.ray_conn_id,
                policy=policy.to_dict(),
                log_cursor=cursor.to_dict(),
                not_before=time.time() + RESUME_GUARD_S,
            ),
            method_name="execute_complete",
            timeout=self.execution_timeout,
        )

    def wait(
        self,
        context: Context,
        sid: str,
        policy: WaitPolicy,
        cursor: LogCursor,
        *,
        within_s: float | None = None,
        seen: Callable[[LogCursor], None] = lambda c: None,
    ) -> JobEvent | None:
        """The synchronous wait, in the worker (the trigger's, in an event loop of its own)."""
        from airflow_provider_horovod.jobs.wait import wait

        def save(latest: LogCursor) -> None:
            compat.state_set(context, XCOM_LOG_CURSOR, latest.to_dict())
            seen(latest)

        killed = self._killed
        return wait(
            self.hook,
            sid,
            policy=policy,
            cursor=cursor,
            write=self.log.log,
            save_cursor=save,
            stopped=killed.is_set if killed else lambda: False,
            within_s=within_s,
        )

    def execute_complete(self, context: Context, event: dict) -> Any:
        """Resume after the trigger's event (a new operator instance: everything comes from the event)."""
        from airflow_provider_horovod.jobs.wait import JobEvent

        job_event = JobEvent.from_dict(event)
        self.submission_id = job_event.submission_id
        self.dashboard_url = self.hook.get_job_url(job_event.submission_id)
        if job_event.log_cursor:
            compat.state_set(context, XCOM_LOG_CURSOR, job_event.log_cursor)
        return self.complete(context, job_event)

    def complete(self, context: Context, event: JobEvent) -> Any:
        from airflow_provider_horovod.jobs.finish import finish

        with compat.failing_for_good(self.retry_on_user_error):
            result = finish(
                event,
                dashboard_url=self.hook.get_job_url(event.submission_id),
                storage=self.storage,
                try_number=getattr(context["ti"], "try_number", None),
            )
        self.job_result = result
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
            self.log.info("Task killed: stopping Ray job %s", self.submission_id)
            try:
                self.hook.stop_job(self.submission_id)
            except Exception:
                self.log.exception("Could not stop Ray job %s", self.submission_id)


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


def push_job(context: Context, job: SubmittedJob) -> None:
    """The task's job, for templates, the extra link and the Training view."""
    ti = context["ti"]
    ti.xcom_push(key=RayJobLink().xcom_key, value=job["dashboard_url"])
    ti.xcom_push(key=XCOM_SUBMISSION_ID, value=job["submission_id"])
    ti.xcom_push(key=XCOM_JOB, value=dict(job))


class RayTaskOperator(BaseRayJobOperator):
    """Run one Python function as one Ray job, for work that belongs next to the model: evaluation,
    batch inference, data preparation. Its return value (JSON) is the task's XCom ``return_value``.

    The function runs in the job's driver, which Ray schedules with the resources asked for here
    (``num_gpus`` sets its ``CUDA_VISIBLE_DEVICES``). One task run is one Ray job: a retry re-attaches
    to a running job, reuses a succeeded one, and runs again after a failed one.

    :param python_callable: the function: a callable (shipped with cloudpickle; code in DAG files
        travels by value) or an import path ``"package.module:function"``.
    :param op_args: positional arguments (templated; JSON values, XComArgs included).
    :param op_kwargs: keyword arguments (templated; JSON values, XComArgs included).
    :param num_cpus: CPUs the job reserves for the function (default 1).
    :param num_gpus: GPUs it reserves (default none).
    :param memory: memory it reserves, in bytes.
    :param resources: custom Ray resources it reserves, e.g. ``{"accelerator_type:A100": 1}``.
    :param runtime_env: extra Ray runtime env (pip, working_dir, env_vars), merged over the
        connection's default (templated). No secrets: Ray shows it to every dashboard reader.
    :param storage_path, aws_conn_id, ray_conn_id, deferrable, wait_for_completion, poll_interval_seconds,
        pending_timeout_seconds, job_tags, prices: see :class:`BaseRayJobOperator` (``storage_path``
        holds the record that carries the return value). The job's cost is pushed as XCom ``cost``.
    """

    template_fields: Sequence[str] = (
        "op_args",
        "op_kwargs",
        "runtime_env",
        "storage_path",
        "ray_conn_id",
        "aws_conn_id",
        "job_tags",
    )
    template_fields_renderers = {"op_kwargs": "json", "runtime_env": "json"}

    def __init__(
        self,
        *,
        python_callable: Any,
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        num_cpus: float = 1,
        num_gpus: float | None = None,
        memory: int | None = None,
        resources: dict[str, float] | None = None,
        runtime_env: dict | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.python_callable = python_callable
        self.op_args: Collection[Any] = op_args or []
        self.op_kwargs: Mapping[str, Any] = op_kwargs or {}
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.memory = memory
        # Not `self.resources`: BaseOperator turns that attribute into Airflow's own Resources (cpus, ram, ...).
        self.ray_resources = resources
        self.runtime_env = runtime_env

    def plan(self, task_run: TaskRun, policy: WaitPolicy) -> JobPlan:
        from airflow_provider_horovod.plan import task_plan

        return task_plan(
            task_run,
            python_callable=self.python_callable,
            op_args=self.op_args,
            op_kwargs=self.op_kwargs,
            num_cpus=self.num_cpus,
            num_gpus=self.num_gpus,
            memory=self.memory,
            resources=self.ray_resources,
            runtime_env=self.runtime_env,
            storage_path=self.storage_path,
            ray_conn_id=self.ray_conn_id,
            job_tags=self.job_tags,
            prices=self.prices,
        )

    def task_result(self, context: Context, result: dict[str, Any]) -> Any:
        from airflow_provider_horovod.cost import summary

        if result.get("cost"):
            self.log.info("%s", summary(result["cost"]))
            context["ti"].xcom_push(key=XCOM_COST, value=result["cost"])
        return result["return_value"]

    def lineage(self, result: dict[str, Any] | None) -> Any:
        from airflow_provider_horovod.lineage import task_lineage

        return task_lineage(
            inlets=self.inlets,
            outlets=self.outlets,
            python_callable=self.python_callable,
            submission_id=self.submission_id,
            result=result,
        )
