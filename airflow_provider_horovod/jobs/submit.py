"""One Ray job per task run: find the attempts an earlier try started, re-attach to a running or
succeeded one, and otherwise submit the plan's next attempt (resuming after a failed or vanished one).
An attempt number is used once: its submission is noted in storage just before it is sent."""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_horovod import failures
from airflow_provider_horovod.checks import check_ray_features
from airflow_provider_horovod.contract import (
    SESSION_FILE,
    JobStatus,
    attempt_uri,
    consumed_uri,
    result_uri,
    submitted_uri,
)
from airflow_provider_horovod.documents import SubmittedJob, TaskRecord
from airflow_provider_horovod.exceptions import InvalidParameterError, RayJobPendingTimeoutError, TaskKilledError

if TYPE_CHECKING:
    from airflow_provider_horovod.jobs.api import RayJobsApi
    from airflow_provider_horovod.plan import JobPlan, JobRequest
    from airflow_provider_horovod.storage import Storage

log = logging.getLogger(__name__)


class Logger(Protocol):
    """A task's logger (Airflow's) or a standard one: the steps only say what they do."""

    def info(self, msg: Any, /, *args: Any) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Attempt:
    """The attempt a try works with. ``info`` is its job info when it already existed."""

    number: int
    submission_id: str
    info: dict | None = None
    resume: bool = False

    @property
    def reattached(self) -> bool:
        return self.info is not None


def start(
    hook: RayJobsApi,
    plan: JobPlan,
    storage: Storage,
    *,
    logger: Logger = log,
    stopped: Callable[[], bool] = lambda: False,
) -> SubmittedJob:
    """The task run's job: re-attached, or submitted from the plan after the checks that need the
    cluster or the storage (they run only when something is to be submitted). ``stopped``: the task was
    killed meanwhile; nothing is submitted then (``TaskKilledError``)."""
    check_storage_is_shared(hook, plan)
    check_embedded_cluster_is_not_spread(hook, plan, configured_executors())
    attempt = find_attempt(hook, plan, storage, logger=logger)
    if attempt.reattached:
        logger.info(
            "Re-attaching to Ray job %s (%s) of this task run.",
            attempt.submission_id,
            (attempt.info or {}).get("status"),
        )
    else:
        check_cluster_resources(hook, plan)
        check_ray_features(hook.ray_version(), plan.spec)
        storage.check_bucket(plan.storage_uri)
        request = plan.request(
            attempt.number,
            resume=attempt.resume,
            extra_files=forwarded_credentials(plan, logger),
            mark_token=secrets.token_hex(8),
        )
        logger.info("Submitting Ray job %s (dry run of the request):\n%s", request.submission_id, request.dry_run())
        if stopped():
            raise TaskKilledError(
                f"Task killed before Ray job {request.submission_id} was submitted; nothing was submitted."
            )
        storage.write_json(
            submitted_uri(plan.storage_uri, attempt.number),
            {"submission_id": attempt.submission_id, "submitted_at": time.time()},
        )
        submit(hook, request)
    return SubmittedJob(
        submission_id=attempt.submission_id,
        dashboard_url=hook.get_job_url(attempt.submission_id),
        storage_uri=plan.storage_uri,
        attempt=attempt.number,
        kind=plan.kind.value,
        checkpoint_score_attribute=getattr(plan.spec, "checkpoint_score_attribute", None),
        aws_conn_id=storage.aws_conn_id,
        job_tags=dict(plan.job_tags),
    )


def find_attempt(hook: RayJobsApi, plan: JobPlan, storage: Storage, *, logger: Logger = log) -> Attempt:
    """The attempt to work with: the latest one if it runs, or succeeded and was not consumed by an
    earlier try; else a new one (``resume`` after a failed, stopped or vanished one).

    An attempt the cluster does not know, whose submission was noted in storage, vanished (its Ray head
    was replaced, or the job deleted): it counts as failed, as infrastructure (``keep_vanished``), and is
    never submitted again under its id. Storage is asked only where the latest known attempt has ended:
    re-attaching to a running job needs the cluster alone."""
    task_run, latest, info = plan.task_run, 0, None
    while True:
        found = hook.get_job_info(task_run.submission_id(latest + 1))
        if found is None and not (has_ended(info) and was_submitted(storage, plan, latest + 1)):
            break
        latest, info = latest + 1, found
    if latest == 0:
        return Attempt(1, task_run.submission_id(1))
    if info is None:
        keep_vanished(storage, plan, latest, logger=logger)
        logger.info(
            "Attempt %s (Ray job %s) was submitted, but the Ray cluster does not know it: it vanished with its "
            "head (or was deleted). Submitting attempt %s, resuming from its last checkpoint.",
            latest,
            task_run.submission_id(latest),
            latest + 1,
        )
        return Attempt(latest + 1, task_run.submission_id(latest + 1), resume=True)
    status = JobStatus.of(info.get("status"))
    if not status.is_terminal:
        return Attempt(latest, task_run.submission_id(latest), info)
    if status is JobStatus.SUCCEEDED:
        if not storage.exists(consumed_uri(plan.storage_uri, latest)):
            return Attempt(latest, task_run.submission_id(latest), info)
        # The task was cleared after it had succeeded: the user asks for a new run.
        logger.info("Attempt %s already gave this task its result; running again as attempt %s.", latest, latest + 1)
        return Attempt(latest + 1, task_run.submission_id(latest + 1))
    logger.info(
        "Attempt %s ended %s; submitting attempt %s, resuming from its last checkpoint.",
        latest,
        status.value,
        latest + 1,
    )
    return Attempt(latest + 1, task_run.submission_id(latest + 1), resume=True)


def has_ended(info: dict | None) -> bool:
    """Whether a later attempt may exist after this one: it ended, vanished (None), or there is none yet."""
    return info is None or JobStatus.of(info.get("status")).is_terminal


def was_submitted(storage: Storage, plan: JobPlan, attempt: int) -> bool:
    """Whether the attempt's submission was noted (``submitted_uri``), the bucket checked first so that a
    missing or unreachable one fails fast and says so."""
    storage.check_bucket(plan.storage_uri)
    return storage.exists(submitted_uri(plan.storage_uri, attempt))


def keep_vanished(storage: Storage, plan: JobPlan, attempt: int, *, logger: Logger = log) -> None:
    """The record of an attempt that vanished from the cluster, unless its driver left one: class
    infrastructure, so that the reason outlives the cluster as for any failed attempt. Best effort."""
    uri = result_uri(plan.storage_uri, attempt)
    sid = plan.task_run.submission_id(attempt)
    try:
        if storage.exists(uri):
            return
        failure = failures.Failure(
            failures.FailureClass.INFRASTRUCTURE,
            f"Ray job {sid} vanished: the Ray cluster no longer knows it (its head was replaced, or the job was "
            "deleted), and its driver left no record",
        )
        record = TaskRecord(
            submission_id=sid,
            attempt=attempt,
            storage_uri=plan.storage_uri,
            run_uri=attempt_uri(plan.storage_uri, attempt),
            failure=failure.to_dict(),
        )
        storage.write_json(uri, json.loads(record.to_json()))
    except Exception as err:  # the next attempt matters more than the record of this one
        logger.info("Could not keep the record of vanished attempt %s at %s: %s", attempt, uri, err)


def check_storage_is_shared(hook: RayJobsApi, plan: JobPlan) -> None:
    """A local storage path must be one the cluster and Airflow share: the records and the
    checkpoints are written on the Ray nodes and read here."""
    if plan.storage_uri.startswith("s3://") or hook.endpoint.shared_storage:
        return
    conn_id = plan.ray_conn_id
    raise InvalidParameterError(
        "storage_path",
        plan.storage_root,
        f"the Ray cluster of connection {conn_id!r} is not the embedded local one, so a local path is written on its "
        "nodes, where Airflow cannot read the result. Use s3://bucket/prefix; or, if this path is on a filesystem "
        f'shared by every Ray node and the Airflow workers, set the extra {{"shared_storage": true}} on connection '
        f"{conn_id!r}.",
    )


# Executors that run every task on the scheduler's machine; any other may run a task's tries, and its
# resumption after a deferral, on other machines than the one that submitted it.
ONE_MACHINE_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor"})


def configured_executors() -> list[str]:
    """The class names of Airflow's ``[core] executor`` (``LocalExecutor``, ``alias:module.Class``, ...); none
    under ``airflow dags test``, which runs every task on this machine whatever the executor."""
    from airflow.configuration import conf

    from airflow_provider_horovod.airflow_compat import in_dag_test

    if in_dag_test():
        return []

    text = conf.get("core", "executor", fallback="") or ""
    return [name.strip().split(":")[-1].rsplit(".", 1)[-1] for name in text.split(",") if name.strip()]


def check_embedded_cluster_is_not_spread(hook: RayJobsApi, plan: JobPlan, executors: list[str]) -> None:
    """The embedded cluster, and the local storage path it shares, live on the worker's own disk and
    processes: a triggerer or a later try on another machine would find another cluster and no records."""
    if not hook.endpoint.embedded:
        return
    spread = [name for name in executors if name not in ONE_MACHINE_EXECUTORS]
    if not spread:
        return
    raise InvalidParameterError(
        "ray_conn_id",
        plan.ray_conn_id,
        f"the embedded local Ray cluster runs on this worker's machine, and writes the records of storage_path "
        f"{plan.storage_root!r} there, but the {spread[0]} runs a task's next try, and the triggerer its wait, on "
        "other machines, which would find another cluster and none of this attempt's records. Give a connection "
        "to a Ray cluster (its host and port) and an s3://bucket/prefix storage_path.",
    )


def check_cluster_resources(hook: RayJobsApi, plan: JobPlan) -> None:
    """Fail before submitting when the cluster has none of a resource the job asks for."""
    if not plan.check_cluster_resources:
        return
    asked, cluster = plan.resources, hook.get_cluster_resources()
    if missing := sorted(name for name in asked if cluster.get(name, 0.0) <= 0.0):
        raise RayJobPendingTimeoutError(
            f"The workers ask for {json.dumps(asked, sort_keys=True)} but the cluster has none of {missing} (it "
            f"has {json.dumps(cluster, sort_keys=True)}). Use use_gpu=False or a cluster with such nodes; for an "
            "autoscaling cluster set check_cluster_resources=False.",
            status="NOT_SUBMITTED",
        )


def forwarded_credentials(plan: JobPlan, logger: Logger) -> dict[str, bytes]:
    """The payload file of forwarded AWS session credentials, when the plan asks for them."""
    if plan.forward_aws is None:
        return {}
    from airflow_provider_horovod.credentials import session_credentials

    aws_conn_id, ttl_s = plan.forward_aws
    session = session_credentials(aws_conn_id, ttl_s)
    logger.info(
        "Forwarding AWS session credentials of connection %r, valid until %s.", aws_conn_id, session["expiration"]
    )
    return {SESSION_FILE: json.dumps(session).encode()}


def submit(hook: RayJobsApi, request: JobRequest) -> str:
    """Submit the request, its payload package written to a temporary folder for the upload."""
    with tempfile.TemporaryDirectory(prefix="ahp-payload-") as parent:
        folder = request.write_payload(parent)
        runtime_env = {**request.runtime_env, "py_modules": [*request.runtime_env.get("py_modules", []), folder]}
        resources = request.driver_resources
        return hook.submit_job(
            entrypoint=request.entrypoint,
            submission_id=request.submission_id,
            runtime_env=runtime_env,
            metadata=request.metadata,
            entrypoint_num_cpus=resources.get("num_cpus"),
            entrypoint_num_gpus=resources.get("num_gpus"),
            entrypoint_memory=resources.get("memory"),
            entrypoint_resources=resources.get("resources"),
        )
