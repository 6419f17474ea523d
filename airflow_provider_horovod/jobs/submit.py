"""One Ray job per task run: find the attempts an earlier try started, re-attach to a running or
succeeded one, and submit the next attempt otherwise (resuming after a failed one)."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_provider_horovod.ids import TaskRun
from airflow_provider_horovod.jobs.protocol import JobStatus
from airflow_provider_horovod.jobs.request import JobRequest, write_payload
from airflow_provider_horovod.spec import consumed_uri

if TYPE_CHECKING:
    from airflow_provider_horovod.hooks.ray import RayHook
    from airflow_provider_horovod.storage import Storage

log = logging.getLogger(__name__)


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


def find_attempt(hook: RayHook, task_run: TaskRun, *, consumed: Callable[[int], bool] = lambda n: False,
                 logger: logging.Logger = log) -> Attempt:
    """The attempt to work with: the latest one if it runs, or succeeded and was not consumed by an
    earlier try; else a new one (``resume`` after a failed or stopped one)."""
    latest, info = 0, None
    while (found := hook.get_job_info(task_run.submission_id(latest + 1))) is not None:
        latest, info = latest + 1, found
    if info is None:
        return Attempt(1, task_run.submission_id(1))
    status = JobStatus.of(info.get("status"))
    if status is not None and not status.is_terminal:
        return Attempt(latest, task_run.submission_id(latest), info)
    if status is JobStatus.SUCCEEDED:
        if not consumed(latest):
            return Attempt(latest, task_run.submission_id(latest), info)
        # The task was cleared after it had succeeded: the user asks for a new run.
        logger.info("Attempt %s already gave this task its result; running again as attempt %s.", latest, latest + 1)
        return Attempt(latest + 1, task_run.submission_id(latest + 1))
    logger.info("Attempt %s ended %s; submitting attempt %s, resuming from its last checkpoint.",
                latest, info.get("status"), latest + 1)
    return Attempt(latest + 1, task_run.submission_id(latest + 1), resume=True)


def consumed_in(storage: Storage, storage_uri: str) -> Callable[[int], bool]:
    """Whether an attempt's result was already handed to a task try (its marker in storage)."""
    return lambda attempt: storage.exists(consumed_uri(storage_uri, attempt))


def submit(hook: RayHook, request: JobRequest) -> str:
    """Submit the request, its payload package written to a temporary folder for the upload."""
    with tempfile.TemporaryDirectory(prefix="ahp-payload-") as parent:
        folder = write_payload(request, parent)
        runtime_env = {**request.runtime_env, "py_modules": [*request.runtime_env.get("py_modules", []), folder]}
        resources = request.driver_resources
        return hook.submit_job(entrypoint=request.entrypoint, submission_id=request.submission_id,
                               runtime_env=runtime_env, metadata=request.metadata,
                               entrypoint_num_cpus=resources.get("num_cpus"),
                               entrypoint_num_gpus=resources.get("num_gpus"),
                               entrypoint_memory=resources.get("memory"),
                               entrypoint_resources=resources.get("resources"))


def find_or_submit(hook: RayHook, task_run: TaskRun, make_request: Callable[[Attempt], JobRequest], *,
                   consumed: Callable[[int], bool] = lambda n: False, before_submit: Callable[[JobRequest], None]
                   = lambda request: None, logger: logging.Logger = log) -> Attempt:
    """The task run's job: re-attached, or submitted from ``make_request(attempt)`` (called only then)."""
    attempt = find_attempt(hook, task_run, consumed=consumed, logger=logger)
    if attempt.reattached:
        logger.info("Re-attaching to Ray job %s (%s) of this task run.", attempt.submission_id,
                    attempt.info.get("status"))
        return attempt
    request = make_request(attempt)
    before_submit(request)
    logger.info("Submitting Ray job %s (dry run of the request):\n%s", request.submission_id, request.dry_run())
    submit(hook, request)
    return attempt
