"""Exceptions raised by the provider. Messages name the bad value and say how to fix it.

Importable on the Ray cluster too: standard library only.
"""

from __future__ import annotations


class HorovodProviderError(Exception):
    """Base class of the provider's errors."""


class InvalidParameterError(HorovodProviderError, ValueError):
    """A parameter of an operator, sensor or trigger is invalid. Raised before anything is submitted."""

    def __init__(self, parameter: str, value: object, fix: str):
        self.parameter = parameter
        self.value = value
        self.fix = fix
        super().__init__(f"Invalid {parameter}={value!r}: {fix}")


class RayConnectionConfigError(HorovodProviderError, ValueError):
    """The Ray connection's fields or extras are malformed."""


class RayClusterUnreachableError(HorovodProviderError, ConnectionError):
    """The Ray dashboard did not answer after bounded retries."""


class RayAuthenticationError(HorovodProviderError, PermissionError):
    """The Ray dashboard refused the token (missing or wrong)."""


class RayVersionMismatchError(HorovodProviderError, RuntimeError):
    """The cluster runs another Ray version than this client."""


class RayJobError(HorovodProviderError, RuntimeError):
    """A Ray job ended FAILED or STOPPED, or could not be submitted."""

    def __init__(
        self,
        message: str,
        *,
        submission_id: str | None = None,
        status: str | None = None,
        error_type: str | None = None,
    ):
        self.submission_id = submission_id
        self.status = status
        self.error_type = error_type
        super().__init__(message)


class TaskKilledError(RayJobError):
    """The task was killed (its ``on_kill`` ran: a user's kill, the task marked failed or skipped, its DAG
    run timed out) while the operator submitted or waited for its job: the job, if any, was stopped, and
    nothing more is submitted. The task's state is Airflow's already; this only ends the try."""


class UnknownJobStatusError(RayJobError):
    """Ray reported a job status the provider does not know (a Ray version it does not support)."""


class JobFailure(RayJobError):
    """A failed attempt of a task run's job, of one of six classes (``failures.FailureClass``), each
    its own subclass below, so that except clauses and Airflow 3.3's ``retry_policy`` (``RetryRule``)
    can match them. ``failure``: the attempt's failure as a dict (class, rank, exception, the
    traceback trimmed to the user's own frames, what to do)."""

    def __init__(
        self,
        message: str,
        *,
        failure: dict | None = None,
        submission_id: str | None = None,
        status: str | None = None,
        error_type: str | None = None,
    ):
        super().__init__(message, submission_id=submission_id, status=status, error_type=error_type)
        self.failure = failure or {}


class UserCodeError(JobFailure):
    """The training function (or a ``@task.ray`` function) raised on some rank. Not retried."""


class ConfigurationError(JobFailure):
    """The job could not start because of what the task asked for (a runtime_env package that does not
    exist, an import path that does not resolve on the cluster, a Ray or Python version). Not retried."""


class InfrastructureError(JobFailure):
    """A worker or a node died, the kernel's OOM killer struck, a rendezvous or a collective timed out,
    the job's supervisor or driver was lost, or the dashboard went away. Retried."""


class PreemptionError(JobFailure):
    """A node was drained or preempted. Retried, without using up ``max_failures``."""


class CapacityError(JobFailure):
    """The workers never got their resources within ``pending_timeout_seconds``. Retried."""


class StorageError(JobFailure):
    """Checkpoints or the attempt's record could not be written or read. Retried."""


class RayJobPendingTimeoutError(CapacityError):
    """The workers ask for resources no node of the cluster has (checked before submitting)."""


class TrainingResultError(StorageError):
    """The job succeeded but its result record or checkpoint is missing or unreadable."""


class MissingExtraError(HorovodProviderError, ImportError):
    """A feature needs an extra of the package (``[amazon]``, ``[cluster]``) that is not installed."""


# --- raised on the cluster, by the runtime (their class names decide a failure's class: failures.py) ---


class SmokeRunDone(BaseException):
    """Raised out of ``ray.train.report`` on every rank once a checkpoint is reported; the provider's wrapper
    of the training function catches it and returns. A BaseException, so that a user's ``except Exception``
    around the training loop does not swallow it."""


class HorovodNetworkError(HorovodProviderError, RuntimeError):
    """Horovod's ranks cannot reach each other, or a host has no interface to use."""


class PendingTimeoutError(HorovodProviderError, RuntimeError):
    """The workers' resources were not available within the pending timeout."""


class RayIncompatibleError(HorovodProviderError, RuntimeError):
    """The cluster's Ray cannot run what the job asks for: the message names the version and the fix."""


class ScriptExitError(HorovodProviderError, RuntimeError):
    """A rank's script exited with a non-zero code (``sys.exit(n)``)."""


class ScriptRaisedError(HorovodProviderError, RuntimeError):
    """A rank's script raised, in its own process: the exception's class and message, with the failure as
    classed there (``ahp_user_error``: the user's own frames)."""


class ScriptRankLostError(HorovodProviderError, RuntimeError):
    """A rank's script failed in a collective because a peer was lost (Gloo, a connection): infrastructure,
    as in the rank's process."""


class ScriptMissingError(HorovodProviderError, FileNotFoundError):
    """The script is not in the job's ``working_dir`` on a node: what the task asked for, not the cluster."""


class ScriptEndedEarlyError(HorovodProviderError, RuntimeError):
    """A rank waited in a collective after another rank's script had ended."""


# --- storage, and building Horovod -----------------------------------------------------------------


class StorageUnavailableError(HorovodProviderError, ConnectionError):
    """The storage cannot be used: the S3 endpoint does not answer, the bucket does not exist, or
    the credentials are refused."""


class BuildError(HorovodProviderError):
    """A step failed; the message says which and what to do."""


class SourceChanged(BuildError):
    """Horovod's sdist is not the one the edits were written for."""
