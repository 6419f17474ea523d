"""Why an attempt failed, decided in one place: a class of six, from what Ray says (the job's
``error_type`` and ``driver_exit_code``; under Train V2 ``WorkerGroupError.worker_failures`` per
rank, ``ControllerError``, ``PreemptionError``; under V1 the wrapped ``RayTaskError``) and what the
runtime saw. The runtime classifies the exception it caught (``of_error``) and prints its verdict as
one ``AHP_FAILURE`` line and into the attempt's record; the Airflow side decides from it and the
job's info (``of_job``), even when the runtime could say nothing (a killed driver).

Standard library only, and no Ray import: both sides import it, and errors are told apart by their
class names and attributes, as they arrive pickled from Ray.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import json
import re
import traceback
from collections.abc import Sequence
from typing import Any

from airflow_provider_horovod import exceptions
from airflow_provider_horovod.contract import FAILURE_MARK, JobStatus, marked


class FailureClass(str, enum.Enum):
    USER_CODE = "user_code"
    CONFIGURATION = "configuration"
    INFRASTRUCTURE = "infrastructure"
    PREEMPTION = "preemption"
    CAPACITY = "capacity"
    STORAGE = "storage"

    @property
    def retryable(self) -> bool:
        """Retried by Airflow (and by Ray Train): the next attempt may go through. A user's bug or a
        wrong configuration fails the same way again."""
        return self not in (FailureClass.USER_CODE, FailureClass.CONFIGURATION)

    @property
    def error(self) -> type[exceptions.JobFailure]:
        return _ERRORS[self]


_ERRORS: dict[FailureClass, type[exceptions.JobFailure]] = {
    FailureClass.USER_CODE: exceptions.UserCodeError,
    FailureClass.CONFIGURATION: exceptions.ConfigurationError,
    FailureClass.INFRASTRUCTURE: exceptions.InfrastructureError,
    FailureClass.PREEMPTION: exceptions.PreemptionError,
    FailureClass.CAPACITY: exceptions.CapacityError,
    FailureClass.STORAGE: exceptions.StorageError,
}

# What to do, by class: the last line of the task's log.
HINTS = {
    FailureClass.USER_CODE: "fix the function or script, then clear the task. A user's error is not retried, by "
    "Airflow or by Ray Train (retry_on_user_error=True retries it).",
    FailureClass.CONFIGURATION: "fix what the task asks for (runtime_env, import paths, versions), then clear the "
    "task. It is not retried (retry_on_user_error=True retries it).",
    FailureClass.INFRASTRUCTURE: "nothing in the task: a worker, a node or the network failed. The task's retry "
    "resumes from the last checkpoint; raise max_failures to let Ray Train restart "
    "the workers within the attempt.",
    FailureClass.PREEMPTION: "nothing in the task: a node was preempted. The task's retry resumes from the last "
    "checkpoint.",
    FailureClass.CAPACITY: "give the cluster the resources the workers ask for, lower num_workers or "
    "resources_per_worker, or raise pending_timeout_seconds. The task is retried.",
    FailureClass.STORAGE: "check that the storage answers, has room, and that the cluster and Airflow may write and "
    "read it. "
    "The task is retried; a finished training is reused.",
}


@dataclasses.dataclass(frozen=True)
class Failure:
    """One failed attempt: its class, the rank and the exception where there is one, the traceback
    trimmed to the user's own frames, and a one-line summary."""

    failure_class: FailureClass
    summary: str
    rank: int | None = None
    error_type: str | None = None
    message: str = ""
    traceback: str = ""

    @property
    def hint(self) -> str:
        return HINTS[self.failure_class]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "failure_class": self.failure_class.value, "hint": self.hint}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Failure:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        return cls(**{**values, "failure_class": FailureClass(values["failure_class"])})

    def line(self, token: str = "") -> str:
        """The runtime's verdict, one line of the job's log, marked with the attempt's ``token``."""
        return marked(FAILURE_MARK, token) + json.dumps(self.to_dict(), sort_keys=True)

    def explain(self) -> str:
        """What the task's log ends with: the class, the rank, the user's exception and its own
        frames, then what to do."""
        where = f", rank {self.rank}" if self.rank is not None else ""
        text = f"{self.failure_class.value.replace('_', ' ')}{where}: {self.summary}"
        if self.traceback:
            text += f"\n{self.traceback.rstrip()}"
        return f"{text}\nWhat to do: {self.hint}"


def of_line(line: str, token: str = "") -> Failure | None:
    """The runtime's verdict from its ``AHP_FAILURE`` line marked with the attempt's ``token`` (None for
    any other line). Text that another thread of the driver wrote onto the same line (Ray forwards its
    actors' output from one) may come before the mark or after the verdict's JSON."""
    mark = marked(FAILURE_MARK, token)
    if mark not in line:
        return None
    try:
        found, _ = json.JSONDecoder().raw_decode(line.split(mark, 1)[1])
        return Failure.from_dict(found)
    except (ValueError, KeyError, TypeError):
        return None


# --- what the runtime saw ------------------------------------------------------------------------------

# Ray's own errors when an actor (a worker, the controller) or its node died.
DIED = {
    "ActorDiedError",
    "RayActorError",
    "WorkerCrashedError",
    "ActorUnavailableError",
    "NodeDiedError",
    "WorkerHealthCheckFailedError",
    "OutOfMemoryError",
    "LocalRayletDiedError",
    "ObjectLostError",
}
# Errors of the ranks' communication: a peer gone, a rendezvous or a collective timed out.
COMMUNICATION = {
    "HorovodInternalError",
    "ScriptRankLostError",
    "HostsUpdatedInterrupt",
    "GlooError",
    "DistBackendError",
    "ConnectionResetError",
    "BrokenPipeError",
    "RendezvousConnectionError",
}
COMMUNICATION_TEXT = re.compile(
    r"gloo|nccl|connection (refused|reset)|timed out waiting|rendezvous|collective", re.IGNORECASE
)
STARTUP_TIMEOUT = {"WorkerGroupStartupTimeoutError", "PendingTimeoutError"}
# Raised by the runtime itself when the job cannot run as asked.
CONFIGURATION = {"ModuleNotFoundError", "ImportError", "RuntimeEnvSetupError", "ScriptMissingError"}
STORAGE_TEXT = re.compile(r"AWS Error|S3|NoSuchBucket|storage_path|Permission denied|No space left", re.IGNORECASE)


def of_error(error: BaseException, *, user_code: bool = True) -> Failure:
    """The class of an exception the runtime caught. ``user_code``: the exception came out of the
    user's function (a ``@task.ray`` job's); a training's come out of Ray Train, its workers' user
    errors marked by the runtime (``mark_user_error``)."""
    chain = error_chain(error)
    ranked = {
        rank: worker_exception(e)
        for link in chain
        for rank, e in (getattr(link, "worker_failures", None) or {}).items()
    }
    if any(getattr(e, "preempted", False) for e in [*chain, *ranked.values()]) or any(
        type(e).__name__ == "PreemptionError" for e in chain
    ):
        return _failure(FailureClass.PREEMPTION, error, chain)
    # The backend's own check before hvd.init(): its whole message names every connection that failed.
    if network := [e for e in [*chain, *_controller_failures(chain)] if type(e).__name__ == "HorovodNetworkError"]:
        return Failure(
            FailureClass.INFRASTRUCTURE,
            str(network[0]).strip(),
            error_type="HorovodNetworkError",
            message=str(network[0]).strip(),
        )
    if any(type(e).__name__ in STARTUP_TIMEOUT for e in [*chain, *_controller_failures(chain)]):
        return _failure(FailureClass.CAPACITY, error, chain)
    for rank in sorted(ranked):
        if marked := getattr(ranked[rank], "ahp_user_error", None):
            return dataclasses.replace(Failure.from_dict(marked), rank=rank)
    for e in chain:
        if marked := getattr(e, "ahp_user_error", None):
            return Failure.from_dict(marked)
    if any(_died(e) for e in [*chain, *ranked.values()]):
        return _failure(FailureClass.INFRASTRUCTURE, error, chain)
    if any(_communication(e) for e in [*chain, *ranked.values()]):
        return _failure(FailureClass.INFRASTRUCTURE, error, chain)
    if any(type(e).__name__ in CONFIGURATION for e in chain):
        return _failure(FailureClass.CONFIGURATION, error, chain)
    # Ray keeps only the text of an actor's constructor error (Train V2's controller opens the storage).
    if any(
        STORAGE_TEXT.search(str(e)) and (isinstance(e, OSError) or getattr(e, "actor_init_failed", False))
        for e in chain
    ):
        return _failure(FailureClass.STORAGE, error, chain)
    if user_code:
        return user_failure(error)
    return _failure(FailureClass.INFRASTRUCTURE, error, chain)


def worker_exception(error: BaseException) -> BaseException:
    """What a worker raised, as ``WorkerGroupError.worker_failures`` holds it. Train V2 of Ray 2.50 to 2.54
    wraps it there (``UserExceptionWithTraceback``, the exception in ``_base_exc``); 2.55 and later unwrap
    it themselves."""
    inner = getattr(error, "_base_exc", None)
    return inner if isinstance(inner, BaseException) else error


def mark_user_error(error: BaseException, rank: int | None = None) -> None:
    """In a worker: the exception came out of the user's training function. A communication error
    raised there is no bug of the user's (a peer died); anything else is."""
    if _communication(error) or _died(error) or getattr(error, "ahp_user_error", None):  # marked where it arose
        return
    try:
        error.ahp_user_error = user_failure(error, rank).to_dict()  # type: ignore[attr-defined]
    except AttributeError:  # an exception type without a __dict__
        pass


def user_failure(error: BaseException, rank: int | None = None) -> Failure:
    """An error out of the user's function; a module it imports that the cluster lacks, or a script
    missing from the job's working_dir, is a matter of configuration (the runtime_env), not of its code."""
    summary = f"{type(error).__name__}: {first_line(error)}"
    configuration = isinstance(error, ImportError) or type(error).__name__ in CONFIGURATION
    failure_class = FailureClass.CONFIGURATION if configuration else FailureClass.USER_CODE
    # A full disk or quota, or an S3 that refuses (pyarrow's "AWS Error ...", as under a checkpoint's upload
    # through ray.train.report), is no bug of the code: the next attempt may go through.
    if any(out_of_space(e) or refused_by_s3(e) for e in error_chain(error)):
        failure_class = FailureClass.STORAGE
    return Failure(
        failure_class,
        summary,
        rank=rank,
        error_type=type(error).__name__,
        message=str(error),
        traceback=user_frames(error),
    )


def user_frames(error: BaseException) -> str:
    """The exception's traceback, trimmed to the user's own frames (not Ray's, Horovod's, torch's,
    Python's or the provider's), as Python prints them. A file that Ray shipped (a script's folder, the
    job's working_dir or py_modules) is named by its path in what was shipped, as ``python train.py``
    would name it, not by Ray's copy on the node."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if _users(f.filename)]
    if not frames:
        return ""
    frames = [traceback.FrameSummary(_SHIPPED.sub("", f.filename), f.lineno, f.name, line=f.line) for f in frames]
    return "Traceback (the user's own frames):\n" + "".join(traceback.format_list(frames))


# Where Ray unpacks a job's working_dir and py_modules on a node.
_SHIPPED = re.compile(r"^.*/runtime_resources/(?:working_dir|py_modules)_files/_ray_pkg_[0-9a-f]+/")


def _users(filename: str) -> bool:
    path = filename.replace("\\", "/")
    provider = "/airflow_provider_horovod/" in path and "/airflow_provider_horovod/examples/" not in path
    return not (
        path.startswith("<")
        or "/site-packages/" in path
        or "/dist-packages/" in path
        or provider
        or re.search(r"/lib/python3\.\d+/", path) is not None
    )


def out_of_space(error: BaseException) -> bool:
    """An OSError of a full volume or quota (pyarrow's carry the errno in their text only)."""
    return isinstance(error, OSError) and (
        error.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(error)
    )


def refused_by_s3(error: BaseException) -> bool:
    """An OSError of pyarrow's S3 filesystem (SlowDown, access denied, no connection): its text says so."""
    return isinstance(error, OSError) and "AWS Error" in str(error)


def error_chain(error: BaseException | None) -> list[BaseException]:
    """The error and its causes (Ray's RayTaskError keeps the cause as ``cause``)."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__ or getattr(error, "cause", None)
    return chain


def first_line(error: BaseException) -> str:
    """The first line of an error's message; for an actor that failed in its constructor (Ray
    Train's controller when the storage cannot be reached), also that error, on Ray's last line."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(error)).splitlines() if line.strip()]
    if not lines:
        return ""
    if getattr(error, "actor_init_failed", False) and len(lines) > 1:
        return f"{lines[0]} ... {lines[-1]}"
    return lines[0]


def _failure(failure_class: FailureClass, error: BaseException, chain: list[BaseException]) -> Failure:
    summary = " <- ".join(f"{type(e).__name__}: {first_line(e)}" for e in chain)
    return Failure(failure_class, summary, error_type=type(chain[-1]).__name__, message=first_line(chain[-1]))


def _controller_failures(chain: list[BaseException]) -> list[BaseException]:
    return [f for e in chain if (f := getattr(e, "controller_failure", None)) is not None]


def _died(error: BaseException) -> bool:
    # Train V1 names a wrapped death "RayTaskError(ActorDiedError)". An actor whose constructor
    # raised did not die under load: its own error says what is wrong.
    return not getattr(error, "actor_init_failed", False) and bool(DIED & set(re.findall(r"\w+", type(error).__name__)))


def _communication(error: BaseException) -> bool:
    name = type(error).__name__
    return name in COMMUNICATION or (
        name in ("RuntimeError", "OSError", "TimeoutError") and bool(COMMUNICATION_TEXT.search(str(error)))
    )


def class_of_provider_error(error: BaseException) -> FailureClass:
    """An error of the provider's own that ended a wait: the connection's settings are the task's to
    fix; anything else (the dashboard gone) is infrastructure."""
    settings = (
        exceptions.RayConnectionConfigError,
        exceptions.RayAuthenticationError,
        exceptions.RayVersionMismatchError,
        exceptions.InvalidParameterError,
    )
    return FailureClass.CONFIGURATION if isinstance(error, settings) else FailureClass.INFRASTRUCTURE


# --- what Ray said ----------------------------------------------------------------------------------

# The Jobs API's error types of a job that never ran the runtime, or lost its supervisor.
JOB_ERRORS = {
    "RUNTIME_ENV_SETUP_FAILURE": FailureClass.CONFIGURATION,
    "JOB_ENTRYPOINT_COMMAND_START_ERROR": FailureClass.CONFIGURATION,
    "JOB_SUPERVISOR_ACTOR_START_FAILURE": FailureClass.INFRASTRUCTURE,
    "JOB_SUPERVISOR_ACTOR_START_TIMEOUT": FailureClass.CAPACITY,
    "JOB_SUPERVISOR_ACTOR_DIED": FailureClass.INFRASTRUCTURE,
    "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE": FailureClass.CAPACITY,
}


def stopped_by_request(failure: dict) -> bool:
    """Whether a failure (as ``to_dict`` keeps it) is Ray's STOPPED status itself, as ``of_job`` sums it
    up with no verdict of the runtime's: a stop request ended the job (a killed task's ``on_kill``, or
    ``ray job stop``), not the training. The provider's own stops (its timeouts) give their reason."""
    return not failure.get("error_type") and str(failure.get("summary") or "").startswith(
        f"{JobStatus.STOPPED.value}: "
    )


def kept_by_stopper(record: dict) -> bool:
    """Whether an attempt's record is the one the side that stopped its job kept (``jobs.stop``): a stop
    request's failure and none of the driver's timings. The driver replaces it with its own."""
    return not record.get("timings") and stopped_by_request(record.get("failure") or {})


def of_job(info: dict | None, runtime: Failure | None, *, provider_job: bool = True) -> Failure:
    """The attempt's class: the runtime's verdict when it gave one; else what Ray's job info says (a
    driver killed by a signal, a runtime_env that could not be set up, a supervisor lost). A job not
    of the provider's (a sensor's) whose entrypoint failed failed in its own code."""
    info = info or {}
    if runtime is not None:
        return runtime
    error_type, code = info.get("error_type"), info.get("driver_exit_code")
    text = (info.get("message") or "").strip()
    summary = f"{error_type or info.get('status') or 'the job failed'}: {first_line_of(text)}"
    if error_type in JOB_ERRORS:
        return Failure(JOB_ERRORS[error_type], summary, message=text)
    if isinstance(code, int) and (code < 0 or code > 128):
        signal = abs(code) if code < 0 else code - 128
        return Failure(
            FailureClass.INFRASTRUCTURE,
            f"the job's driver was killed (exit code {code}, signal {signal}): the kernel's OOM killer, or a lost node",
            message=text,
        )
    if not provider_job and error_type == "JOB_ENTRYPOINT_COMMAND_ERROR":
        return Failure(FailureClass.USER_CODE, summary, message=text)
    return Failure(FailureClass.INFRASTRUCTURE, summary, message=text)


# Gloo's reason, in the line a worker's abort leaves ("[.../gloo/transport/tcp/pair.cc:799] connect
# [127.0.1.1]:4492: Connection refused /path/lib.so(+0x..)"): the one line of a C++ dump worth reading.
GLOO_REASON = re.compile(r"\[\S*gloo/\S+\.(?:cc|h):\d+\] (?P<reason>.+?)\s*(?= /\S+\.so|$)")
NETWORK_HINT = (
    "Horovod's ranks could not reach each other: check that the nodes reach each other on the "
    "interfaces chosen (horovod_nics), that no firewall drops Gloo's ports, and horovod_timeout_s "
    "(docs/multi-node.md)."
)


def network_reason(lines: Sequence[str]) -> str | None:
    """Gloo's reason in a job's log lines (the last one), or None."""
    return next((found["reason"] for line in reversed(lines) if (found := GLOO_REASON.search(line))), None)


def with_network_reason(failure: Failure, lines: Sequence[str]) -> Failure:
    """An infrastructure failure whose log shows Gloo's reason (a worker aborted in C++, seen by Ray
    only as a dead actor): the reason and what to check, instead of a bare death."""
    reason = network_reason(lines) if failure.failure_class is FailureClass.INFRASTRUCTURE else None
    if reason is None or reason in failure.summary:
        return failure
    return dataclasses.replace(failure, summary=f"{NETWORK_HINT} Gloo: {reason}. ({failure.summary})")


def first_line_of(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
