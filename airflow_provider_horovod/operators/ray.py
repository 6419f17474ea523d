"""What every operator that runs one Ray job per task run shares: submit or re-attach, wait (in the
worker or deferred to the triggerer), stream the job's log, finish, and stop the job when killed."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import conf
from airflow.sdk import BaseOperator

from airflow_provider_horovod import compat
from airflow_provider_horovod.checks import check_bool, check_positive, check_ray_conn_id
from airflow_provider_horovod.jobs.logs import LOG_CURSOR_KEY, LogCursor
from airflow_provider_horovod.jobs.protocol import XCOM_SUBMISSION_ID, JobEvent
from airflow_provider_horovod.jobs.wait import WaitPolicy
from airflow_provider_horovod.links.ray import RayJobLink, push_job_link

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_horovod.hooks.ray import RayHook



@dataclasses.dataclass(frozen=True)
class Started:
    """The job a try works with, as ``start`` found or submitted it."""

    submission_id: str
    attempt: int
    storage_uri: str | None = None


class BaseRayJobOperator(BaseOperator):
    """Base of the provider's operators: one Ray job per task run, waited for and finished.

    :param ray_conn_id: Ray connection; without a ``ray_default`` connection, an embedded local Ray
        cluster is started (templated).
    :param deferrable: wait in the triggerer, freeing the worker slot.
    :param wait_for_completion: False: submit, push the submission id and return (a
        ``RayJobSensor`` waits).
    :param poll_interval_seconds: seconds between status polls. The log is read at each poll while it
        grows; a quiet log less often (up to 30 s or 6 polls apart, docs/reliability.md).
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
    """

    template_fields: Sequence[str] = ("ray_conn_id", "storage_path", "aws_conn_id")
    operator_extra_links = (RayJobLink(),)

    def __init__(self, *, ray_conn_id: str = "ray_default",
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 wait_for_completion: bool = True, poll_interval_seconds: float = 1.0,
                 pending_timeout_seconds: float | None = 600.0, stall_timeout_seconds: float | None = None,
                 storage_path: str | None = None, aws_conn_id: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stall_timeout_seconds = stall_timeout_seconds
        self.ray_conn_id = ray_conn_id
        self.storage_path = storage_path
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable
        self.wait_for_completion = wait_for_completion
        self.poll_interval_seconds = poll_interval_seconds
        self.pending_timeout_seconds = pending_timeout_seconds
        # Kept on the instance in case the task gets killed.
        self.submission_id: str | None = None
        self._killed: threading.Event | None = None  # made in execute: operators get copied

    # --- what a subclass provides ------------------------------------------------------------

    def start(self, context: Context, hook: RayHook) -> Started:
        """Check the input, then find this task run's job or submit it."""
        raise NotImplementedError

    def complete(self, context: Context, event: JobEvent) -> Any:
        """The task's return value from the job's final event (or its failure)."""
        raise NotImplementedError

    # --- the flow -------------------------------------------------------------------------------

    @cached_property
    def hook(self) -> RayHook:
        from airflow_provider_horovod.hooks.ray import RayHook

        return RayHook(ray_conn_id=self.ray_conn_id)

    @property
    def storage(self):
        from airflow_provider_horovod.storage import Storage

        return Storage(self.aws_conn_id)

    def check_storage(self, task_run) -> str:
        """The task run's storage folder, from the checked ``storage_path``."""
        from airflow_provider_horovod.checks import check_storage_path
        from airflow_provider_horovod.ids import default_storage_path
        from airflow_provider_horovod.storage import check_aws_conn_id, normalize_storage_path

        path = normalize_storage_path(check_storage_path(self.storage_path or default_storage_path()))
        check_aws_conn_id(self.aws_conn_id)
        return task_run.storage_uri(path)

    def check_storage_reachable(self, hook: RayHook, storage_uri: str) -> None:
        """A local storage path must be one the cluster and Airflow share: the records and the
        checkpoints are written on the Ray nodes and read here."""
        from airflow_provider_horovod.exceptions import InvalidParameterError
        from airflow_provider_horovod.storage import split_uri

        if split_uri(storage_uri)[0] == "" and not hook.endpoint.shared_storage:
            raise InvalidParameterError(
                "storage_path", self.storage_path or storage_uri.rsplit("/", 4)[0],
                f"the Ray cluster of connection {self.ray_conn_id!r} is not the embedded local one, so a local path "
                "is written on its nodes, where Airflow cannot read the result. Use s3://bucket/prefix; or, if this "
                "path is on a filesystem shared by every Ray node and the Airflow workers, set the extra "
                f'{{"shared_storage": true}} on connection {self.ray_conn_id!r}.')

    def wait_policy(self) -> WaitPolicy:
        return WaitPolicy(pending_timeout_s=self.pending_timeout_seconds, stall_timeout_s=self.stall_timeout_seconds)

    def check_wait_parameters(self) -> None:
        check_ray_conn_id(self.ray_conn_id)
        check_bool("deferrable", self.deferrable)
        check_bool("wait_for_completion", self.wait_for_completion)
        check_positive("poll_interval_seconds", self.poll_interval_seconds)
        check_positive("pending_timeout_seconds", self.pending_timeout_seconds, allow_none=True)
        check_positive("stall_timeout_seconds", self.stall_timeout_seconds, allow_none=True)

    def execute(self, context: Context) -> Any:
        self._killed = threading.Event()
        started = self.start(context, self.hook)
        sid = self.submission_id = started.submission_id
        dashboard_url = self.hook.get_job_url(sid)
        push_job_link(context, dashboard_url)
        context["ti"].xcom_push(key=XCOM_SUBMISSION_ID, value=sid)
        self.log.info("Ray job %s: %s", sid, dashboard_url)
        if not self.wait_for_completion:
            return {"submission_id": sid, "dashboard_url": dashboard_url, "storage_uri": started.storage_uri,
                    "attempt": started.attempt}
        cursor = LogCursor.from_dict(compat.state_get(context, LOG_CURSOR_KEY), sid)
        if cursor.lines:
            self.log.info("The job's log up to line %s is in the task log of an earlier try.", cursor.lines)
        if self.deferrable:
            from airflow_provider_horovod.triggers.ray import RayJobTrigger

            context["ti"].xcom_push(key=LOG_CURSOR_KEY, value=cursor.to_dict())
            self.defer(
                trigger=RayJobTrigger(submission_id=sid, ray_conn_id=self.ray_conn_id,
                                      poll_interval_seconds=self.poll_interval_seconds,
                                      pending_timeout_seconds=self.pending_timeout_seconds,
                                      stall_timeout_seconds=self.stall_timeout_seconds,
                                      log_cursor=cursor.to_dict()),
                method_name="execute_complete",
                timeout=self.execution_timeout,
            )
        return self.complete(context, self.wait(context, sid, cursor))

    def wait(self, context: Context, sid: str, cursor: LogCursor) -> JobEvent:
        """Follow the job until it ends, streaming its log into the task log (the synchronous path:
        the trigger's wait, in an event loop of this worker's own)."""
        import asyncio

        from airflow_provider_horovod.jobs.follow import follow_job

        async def save(latest: LogCursor) -> None:
            compat.state_set(context, LOG_CURSOR_KEY, latest.to_dict())

        async def follow() -> JobEvent:
            try:
                return await follow_job(self.hook, sid, policy=self.wait_policy(),
                                        cursor=cursor, poll_interval_s=self.poll_interval_seconds, write=self.log.info,
                                        save_cursor=save, stopped=self._killed.is_set if self._killed else lambda: False)
            finally:
                await self.hook.aclose()

        return asyncio.run(follow())

    def execute_complete(self, context: Context, event: dict) -> Any:
        """Resume after the trigger's event (a new operator instance: everything comes from the event)."""
        job_event = JobEvent.from_dict(event)
        self.submission_id = job_event.submission_id
        if job_event.log_cursor:
            compat.state_set(context, LOG_CURSOR_KEY, job_event.log_cursor)
        return self.complete(context, job_event)

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
        pending_timeout_seconds: see :class:`BaseRayJobOperator` (``storage_path`` holds the record
        that carries the return value).
    """

    template_fields: Sequence[str] = ("op_args", "op_kwargs", "runtime_env", "storage_path", "ray_conn_id",
                                      "aws_conn_id")
    template_fields_renderers = {"op_kwargs": "json", "runtime_env": "json"}

    def __init__(self, *, python_callable: Any, op_args: Sequence | None = None, op_kwargs: dict | None = None,
                 num_cpus: float = 1, num_gpus: float | None = None, memory: int | None = None,
                 resources: dict[str, float] | None = None, runtime_env: dict | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.python_callable = python_callable
        self.op_args = op_args
        self.op_kwargs = op_kwargs
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.memory = memory
        # Not `self.resources`: BaseOperator turns that attribute into Airflow's own Resources (cpus, ram, ...).
        self.ray_resources = resources
        self.runtime_env = runtime_env

    def check(self, task_run):
        """(spec of attempt 1, files, runtime_env, driver resources), every parameter checked."""
        from airflow_provider_horovod import checks
        from airflow_provider_horovod.functions import ship_function
        from airflow_provider_horovod.jobs.request import python_version
        from airflow_provider_horovod.spec import TaskSpec

        self.check_wait_parameters()
        runtime_env = checks.check_runtime_env(self.runtime_env)
        code_ships = any(runtime_env.get(k) for k in ("working_dir", "py_modules", "pip", "conda", "uv"))
        function, files = ship_function("python_callable", self.python_callable, "function.pkl", code_ships=code_ships)
        args = checks.check_args("op_args", self.op_args)
        driver = {
            "num_cpus": checks.check_positive("num_cpus", self.num_cpus, allow_none=True) if self.num_cpus else None,
            "num_gpus": checks.check_positive("num_gpus", self.num_gpus, allow_none=True) if self.num_gpus else None,
            "memory": checks.check_positive("memory", self.memory, allow_none=True, integer=True),
            "resources": checks.check_resources(self.ray_resources, use_gpu=True, parameter="resources"),
        }
        spec = TaskSpec(submission_id=task_run.submission_id(1), function=function,
                        storage_uri=self.check_storage(task_run), args=args,
                        kwargs=checks.check_json("op_kwargs", self.op_kwargs), python_version=python_version())
        return spec, files, runtime_env, driver

    def start(self, context: Context, hook: RayHook) -> Started:
        import dataclasses as dc

        from airflow_provider_horovod.ids import TaskRun
        from airflow_provider_horovod.jobs.request import task_request
        from airflow_provider_horovod.jobs.submit import consumed_in, find_or_submit

        task_run = TaskRun.of(context["ti"])
        spec, files, runtime_env, driver = self.check(task_run)
        self.check_storage_reachable(hook, spec.storage_uri)
        storage = self.storage

        def make_request(attempt):
            storage.check_bucket(spec.storage_uri)
            attempt_spec = dc.replace(spec, submission_id=attempt.submission_id, attempt=attempt.number)
            return task_request(attempt_spec, files, runtime_env, task_run, driver)

        attempt = find_or_submit(hook, task_run, make_request, consumed=consumed_in(storage, spec.storage_uri),
                                 logger=self.log)
        return Started(attempt.submission_id, attempt.number, spec.storage_uri)

    def complete(self, context: Context, event: JobEvent) -> Any:
        from airflow_provider_horovod.jobs.finish import finish

        result = finish(event, dashboard_url=self.hook.get_job_url(event.submission_id), storage=self.storage,
                        try_number=getattr(context["ti"], "try_number", None))
        return result["return_value"]
