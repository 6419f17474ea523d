"""One Ray job per task run: find the attempts an earlier try started, re-attach to a running or
succeeded one, and otherwise submit the plan's next attempt (resuming after a failed one)."""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_horovod.checks import check_ray_features
from airflow_provider_horovod.contract import SESSION_FILE, JobStatus, SubmittedJob, consumed_uri
from airflow_provider_horovod.exceptions import InvalidParameterError, RayJobPendingTimeoutError

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


def start(hook: RayJobsApi, plan: JobPlan, storage: Storage, *, logger: Logger = log) -> SubmittedJob:
    """The task run's job: re-attached, or submitted from the plan after the checks that need the
    cluster or the storage (they run only when something is to be submitted)."""
    check_storage_is_shared(hook, plan)
    if plan.prices is None and hook.endpoint.prices:  # the connection's, for tasks that give none
        plan = dataclasses.replace(plan, prices=dict(hook.endpoint.prices))
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
        request = plan.request(attempt.number, resume=attempt.resume, extra_files=forwarded_credentials(plan, logger))
        logger.info("Submitting Ray job %s (dry run of the request):\n%s", request.submission_id, request.dry_run())
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
    earlier try; else a new one (``resume`` after a failed or stopped one)."""
    task_run, latest, info = plan.task_run, 0, None
    while (found := hook.get_job_info(task_run.submission_id(latest + 1))) is not None:
        latest, info = latest + 1, found
    if info is None:
        return Attempt(1, task_run.submission_id(1))
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
