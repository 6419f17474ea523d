"""The contract between the Airflow side and the Ray cluster, in the one module both import.

Whatever crosses the boundary is named here once: the defaults, the job states and kinds, the
files of a job's payload and of its storage folder (the layout and its inverse), the markers the
runtime prints, the XCom and job metadata keys, the training spec and the record an attempt leaves,
and the result a task returns. Standard library only: the runtime imports it on the cluster, which
has no Airflow.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import inspect
import json
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TypedDict

from airflow_provider_horovod.exceptions import UnknownJobStatusError

VERSION = "0.2.0"
# Of the spec and the record: a reader refuses a spec of another version and ignores unknown fields.
FORMAT = 1

# --- Defaults, decided once ------------------------------------------------------------------------

POLL_INTERVAL_S = 1.0
# Wait in the triggerer, not in a worker slot: a training waits for hours (unlike Airflow's own
# [operators] default_deferrable, which is off in a stock install).
DEFERRABLE = True
# A deferred task first follows its job this long in the worker: a job that ends within its first
# seconds then never goes through a deferral (whose resume Airflow can lose, apache/airflow#67287).
SYNC_WAIT_BEFORE_DEFER_S = 15.0
# A trigger holds its event until this long after the deferral: Airflow 3.3.2 fails a task whose
# resume it queues before it has seen the deferring worker exit (apache/airflow#67287).
RESUME_GUARD_S = 10.0
PENDING_TIMEOUT_S: float | None = 600.0
# A sensor waits for a job it did not submit, which may queue as long as its owner lets it: no limit.
SENSOR_PENDING_TIMEOUT_S: float | None = None
STALL_TIMEOUT_S: float | None = None
# Horovod's Gloo rendezvous and collective timeout, HOROVOD_GLOO_TIMEOUT_SECONDS: Horovod's own default
# (horovodrun --gloo-timeout-seconds), on both trainer APIs. Ray's HorovodConfig defaults to 300 s, but
# Ray Train V1 uses it only to wait for its rendezvous to start, not for Gloo's own waits.
HOROVOD_TIMEOUT_S = 30
NUM_WORKERS = 2
# Ray Train's default for ScalingConfig(elastic_resize_monitor_interval_s).
ELASTIC_RESIZE_MONITOR_INTERVAL_S = 60.0
# How many of a failed job's last log lines its error shows.
LOG_TAIL_LINES = 40
# How long Ray waits after SIGTERM to a stopped job's driver before SIGKILL (its RAY_JOB_STOP_WAIT_TIME_S, 3 s
# by default, read by the job's supervisor from the job's env_vars): the driver keeps the stopped attempt's
# record in that time, over S3 from a busy node too.
JOB_STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
JOB_STOP_WAIT_S = 10
# The Ray minors the provider is tested with, [min, max) (docs/compatibility.md). The runtime reaches
# into Ray Train's private modules, which move between minors (runtime/ray_compat.py probes them): an
# older Ray is refused; a newer, untested one runs with a warning when every probe passes. The [cluster]
# extra in pyproject.toml declares the same range.
RAY_VERSIONS = ((2, 50), (2, 61))
# The first Ray minor with Ray Train's elastic scaling (ScalingConfig(num_workers=(min, max))).
RAY_ELASTIC_SINCE = (2, 55)


class JobStatus(str, enum.Enum):
    """Ray's job states; a str, so it goes into JSON (trigger events, XCom) as it is."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED)

    @property
    def ended_without_success(self) -> bool:
        """FAILED or STOPPED: the job's log tail then says why."""
        return self.is_terminal and self is not JobStatus.SUCCEEDED

    @classmethod
    def known(cls, value: Any) -> JobStatus | None:
        """The state Ray reported, or None for one this provider does not know (or no state)."""
        try:
            return cls(value)
        except ValueError:
            return None

    @classmethod
    def of(cls, value: Any) -> JobStatus:
        """The state Ray reported; a state this provider does not know is an error, never a wait."""
        status = cls.known(value)
        if status is None:
            raise UnknownJobStatusError(
                f"Ray reported the job status {value!r}, which airflow-provider-horovod {VERSION} does not know "
                f"(it knows {', '.join(s.value for s in cls)}): check that the cluster runs a Ray version it "
                "supports (the [cluster] extra's)."
            )
        return status


class TrainerApi(str, enum.Enum):
    """``v2``: Ray Train V2 with the provider's Horovod backend; ``legacy``: Ray's HorovodTrainer (V1);
    ``auto``: the runtime chooses on the cluster (``runtime.ray_compat.choose_trainer``) and the result
    record says which it ran."""

    AUTO = "auto"
    V2 = "v2"
    LEGACY = "legacy"


class JobKind(str, enum.Enum):
    """A training (``HorovodTrainOperator``, ``@task.horovod``) or one function (``@task.ray``)."""

    TRAIN = "train"
    TASK = "task"


# --- Files, markers and keys -----------------------------------------------------------------------

# In the job's payload package.
SPEC_FILE = "spec.json"
SESSION_FILE = "aws_session.json"
# An MLflow connection's credentials (runtime.tracking.AUTH_ENV's keys), never in the runtime_env.
MLFLOW_AUTH_FILE = "mlflow_auth.json"
PAYLOAD_PREFIX = "ahp_payload_"
# In an attempt's storage folder.
ATTEMPT_PREFIX = "attempt-"
RESULT_FILE = "result.json"
RETURN_VALUE_FILE = "return_value.json"
TIMELINE_FILE = "horovod_timeline.json"
HISTORY_FILE = "metrics_history.json"
# Rank 0 adds a line at every start of the attempt's worker group: when its workers held their
# resources, and how many (the cost's worker-seconds start there).
WORKER_GROUPS_FILE = "worker_groups.json"
# Written by the Airflow side once a task try has taken an attempt's result: a later try of the same
# task run (a user clearing a succeeded task) trains again instead of reusing it.
CONSUMED_FILE = "consumed.json"
# Written by the Airflow side just before it submits an attempt: an attempt number is used once. A later
# try that finds the note but no job of that id on the cluster knows the job vanished (its Ray head was
# replaced, or the job deleted) rather than never submitted, and goes on with the next attempt.
SUBMITTED_FILE = "submitted.json"

# The lines the runtime ends a job's log with: its record (success), or its one-line reason and its
# verdict on the failure (failures.Failure, JSON).
RESULT_MARK = "AHP_RESULT "
ERROR_MARK = "AHP_ERROR "
FAILURE_MARK = "AHP_FAILURE "

# Why a run's worker group (re)started at its size, in ResultRecord.segments.
SEGMENT_START, SEGMENT_GROW, SEGMENT_SHRINK, SEGMENT_NODE_LOST, SEGMENT_FAILURE = (
    "start",
    "grow",
    "shrink",
    "node lost",
    "failure",
)
SEGMENT_REASONS = (SEGMENT_START, SEGMENT_GROW, SEGMENT_SHRINK, SEGMENT_NODE_LOST, SEGMENT_FAILURE)
# The runtime's backend tells each worker of a group the reason, for rank 0's note of it.
WORKER_GROUP_REASON_ENV = "AHP_WORKER_GROUP_REASON"
# Set to "1" in a smoke run's driver and every worker, so the user's code can shrink itself further.
SMOKE_RUN_ENV = "AHP_SMOKE_RUN"
# Rows a smoke run reads of each Ray dataset, unless smoke_rows says otherwise.
SMOKE_ROWS = 64

# XCom keys the provider pushes (the return value aside).
XCOM_CHECKPOINT_URI = "checkpoint_uri"
XCOM_SUBMISSION_ID = "submission_id"
XCOM_JOB = "ray_job"  # the SubmittedJob, pushed at submission
XCOM_COST = "cost"  # a @task.ray job's Cost (a training's is in its return value)
# How far the job's log is in the task log (the task_state_store key, and the XCom a trigger reads).
XCOM_LOG_CURSOR = "ray_log_cursor"

# Ray job metadata keys. Ray shows metadata to every dashboard reader: names and paths only, no secrets.
META_PREFIX = "ahp_"
META_KIND = f"{META_PREFIX}kind"
META_STORAGE_URI = f"{META_PREFIX}storage_uri"
META_ATTEMPT = f"{META_PREFIX}attempt"
META_RESULT_URI = f"{META_PREFIX}result_uri"
META_NUM_WORKERS = f"{META_PREFIX}num_workers"
META_RESOURCES = f"{META_PREFIX}resources"
# What one worker holds (a task job: its driver), JSON: the cost's CPU- and GPU-seconds follow it.
META_WORKER_RESOURCES = f"{META_PREFIX}worker_resources"
# The names of the user's job_tags among the metadata (JSON list), so they come back apart from ours.
META_TAGS = f"{META_PREFIX}tags"
# The prices the cost is reckoned at (JSON: cpu_hour, gpu_hour, currency), when given.
META_PRICES = f"{META_PREFIX}prices"
# "true" on a smoke run's job (smoke.py): the dashboard and the Training view tell it from a real run.
META_SMOKE_RUN = f"{META_PREFIX}smoke_run"
# Metadata keys a user's job_tags cannot take: the provider's (the prefix above, a task run's ids) and Ray's own.
RESERVED_META_KEYS = ("airflow_dag_id", "airflow_task_id", "airflow_run_id", "airflow_map_index", "job_submission_id")


# --- Ids and the storage layout --------------------------------------------------------------------

SUBMISSION_PREFIX = "ahp"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAP_PART = re.compile(r"^map-\d+$")


def short_hash(*parts: object, length: int = 10) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:length]


def safe_name(text: str, max_len: int = 60) -> str:
    """A readable, path- and URL-safe form of an Airflow id (``:`` and ``+`` of run ids go)."""
    return _UNSAFE.sub("_", text).strip("_")[:max_len] or "x"


@dataclasses.dataclass(frozen=True)
class TaskRun:
    """The Airflow task run a Ray job belongs to: its submission ids and storage folder derive from
    it, so they are known before anything is submitted and a retry finds what an earlier try started."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1

    @classmethod
    def of(cls, ti: Any) -> TaskRun:
        """From a task instance (or anything with the four attributes; an unmapped one's map index is -1,
        whether it says -1 or None)."""
        index = getattr(ti, "map_index", -1)
        return cls(ti.dag_id, ti.task_id, ti.run_id, -1 if index is None else int(index))

    @property
    def base_id(self) -> str:
        """The stem of this run's submission ids: readable parts for people, a hash of all four for
        uniqueness (truncation and sanitising could otherwise make two runs collide)."""
        digest = short_hash(self.dag_id, self.task_id, self.run_id, self.map_index)
        return f"{SUBMISSION_PREFIX}-{safe_name(self.dag_id, 40)}-{safe_name(self.task_id, 40)}-{digest}"

    def submission_id(self, attempt: int) -> str:
        return f"{self.base_id}-a{attempt}"

    def storage_uri(self, storage_path: str) -> str:
        """The task run's own folder under ``storage_path``: backfills and reruns never share one."""
        run_part = f"{safe_name(self.run_id, 80)}-{short_hash(self.run_id, length=6)}"
        parts = [storage_path.rstrip("/"), safe_name(self.dag_id, 120), safe_name(self.task_id, 120), run_part]
        if self.map_index >= 0:
            parts.append(f"map-{self.map_index}")
        return "/".join(parts)

    def metadata(self) -> dict[str, str]:
        """The Ray job metadata naming this task run (plain strings, shown in the dashboard)."""
        return {
            "airflow_dag_id": self.dag_id,
            "airflow_task_id": self.task_id,
            "airflow_run_id": self.run_id,
            "airflow_map_index": str(self.map_index),
        }


def attempt_of(submission_id: str) -> int | None:
    """The attempt number at the end of a submission id made here (``...-a3`` -> 3)."""
    stem, sep, number = submission_id.rpartition("-a")
    return int(number) if sep and stem and number.isdigit() else None


def attempt_uri(storage_uri: str, attempt: int) -> str:
    """The folder of one attempt (one Ray job) inside a task run's storage folder."""
    return f"{storage_uri.rstrip('/')}/{ATTEMPT_PREFIX}{attempt}"


def result_uri(storage_uri: str, attempt: int) -> str:
    return f"{attempt_uri(storage_uri, attempt)}/{RESULT_FILE}"


def attempt_of_record(record_uri: str) -> tuple[str, int]:
    """(the task run's storage folder, the attempt) of an attempt's ``result_uri``: the layout's inverse.
    ValueError for a URI that is not one."""
    folder, _, name = record_uri.rpartition("/")
    storage_uri, _, part = folder.rpartition("/")
    number = part[len(ATTEMPT_PREFIX) :]
    if name != RESULT_FILE or not part.startswith(ATTEMPT_PREFIX) or not number.isdigit() or not storage_uri:
        raise ValueError(f"{record_uri!r} is not the record of an attempt (<storage>/{ATTEMPT_PREFIX}N/{RESULT_FILE})")
    return storage_uri, int(number)


def worker_groups_uri(run_uri: str) -> str:
    return f"{run_uri.rstrip('/')}/{WORKER_GROUPS_FILE}"


def job_tags_of(metadata: dict[str, str]) -> dict[str, str]:
    """The user's ``job_tags`` among a job's metadata (none for a job the provider did not submit)."""
    try:
        names = json.loads(metadata.get(META_TAGS) or "[]")
    except ValueError:
        return {}
    return {name: metadata[name] for name in names if name in metadata}


def consumed_uri(storage_uri: str, attempt: int) -> str:
    return f"{attempt_uri(storage_uri, attempt)}/{CONSUMED_FILE}"


def submitted_uri(storage_uri: str, attempt: int) -> str:
    return f"{attempt_uri(storage_uri, attempt)}/{SUBMITTED_FILE}"


def storage_root(uri: str) -> str:
    """The ``storage_path`` a task run's (or an attempt's) folder lies under: the layout's inverse."""
    parts = uri.rstrip("/").split("/")
    if parts[-1].startswith(ATTEMPT_PREFIX):
        parts.pop()
    if _MAP_PART.match(parts[-1]):
        parts.pop()
    return "/".join(parts[:-3])


def default_storage_path() -> str:
    """Where checkpoints go when ``storage_path`` is not given: a folder under ``AIRFLOW_HOME``."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return os.path.join(home, "horovod-storage")


# --- How a function is called ----------------------------------------------------------------------


def required_positional(fn: Callable) -> int:
    """How many positional parameters ``fn`` needs: Ray Train passes ``config`` only to a training
    function that needs one, so the Airflow side checks it and the runtime calls by it."""
    return len(
        [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    )


def python_minor() -> str:
    """This interpreter's Python minor version (``"3.12"``): pickled code loads only on the same one."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def timings(started_at: float, **more: float) -> dict[str, float]:
    """A record's ``timings``: when the job's driver started and finished (epoch seconds), ``more``
    (``fit_s``: how long the training itself ran), and ``total_s``."""
    now = time.time()
    return {"started_at": started_at, "finished_at": now, **more, "total_s": round(now - started_at, 3)}


def ray_minor(version: str | None) -> tuple[int, int] | None:
    """``(2, 55)`` of ``"2.55.1"``; None when the text is no Ray version."""
    found = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(found[1]), int(found[2])) if found else None


def minor_text(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


def tested_ray_range() -> str:
    """The tested minors, for messages: ``2.50 to 2.60``."""
    low, high = RAY_VERSIONS
    return f"{minor_text(low)} to {minor_text((high[0], high[1] - 1))}"


def check_ray_version(version: str | None) -> str | None:
    """None when the provider runs on this Ray version (the tested range, or a newer minor); else what is
    wrong and the fix. A Ray older than the range is refused: its Train modules lack what the runtime uses."""
    minor = ray_minor(version)
    if minor is not None and minor >= RAY_VERSIONS[0]:
        return None
    low = minor_text(RAY_VERSIONS[0])
    return (
        f"it runs Ray {version or 'of an unknown version'}, and airflow-provider-horovod runs on Ray {low} or "
        f"newer (tested: {tested_ray_range()}). Install ray[default,train]>={low} on the cluster (the provider's "
        "[cluster] extra does)."
    )


def untested_ray_version(version: str | None) -> str | None:
    """A warning for a Ray newer than the tested range (it runs when the runtime's probes pass); else None."""
    minor = ray_minor(version)
    if minor is None or minor < RAY_VERSIONS[1]:
        return None
    return (
        f"Ray {version} is newer than the minors airflow-provider-horovod {VERSION} is tested with "
        f"({tested_ray_range()}): it runs when the Ray Train internals it uses are there (the job checks them at "
        "its start and fails naming any that are missing). See docs/compatibility.md."
    )


def elastic_ray_problem(version: str | None) -> str | None:
    """What is wrong with an elastic ``num_workers`` on this Ray version; None when it has elastic scaling."""
    minor = ray_minor(version)
    if minor is not None and minor >= RAY_ELASTIC_SINCE:
        return None
    return (
        f"elastic training (num_workers=(min, max)) needs Ray Train's elastic scaling, which the cluster's Ray "
        f"{version or 'of an unknown version'} lacks: it first comes with Ray {minor_text(RAY_ELASTIC_SINCE)}. "
        f"Give a number of workers, or run the cluster on Ray >={minor_text(RAY_ELASTIC_SINCE)}."
    )


# --- The documents: what a job is asked to do, and what its attempt leaves -------------------------


class _Document:
    """JSON in and out. A reader ignores fields it does not know (a newer provider wrote them)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1, default=str)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, text: str) -> Any:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        if data.get("version", FORMAT) != FORMAT:
            raise ValueError(
                f"{cls.__name__} of format {data.get('version')!r} is not {FORMAT}: the provider on the "
                "cluster and in Airflow differ. The job ships its own copy, so resubmit it."
            )
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclasses.dataclass(frozen=True)
class JobSpec(_Document):
    """What every job of the provider carries: which attempt of which task run, and where it writes.
    Attempt ``N`` writes under ``<storage_uri>/attempt-N``."""

    submission_id: str
    storage_uri: str
    attempt: int = 1
    # The Airflow side's Python ("3.12"): a pickled function loads only on the same minor version.
    python_version: str = ""
    # A smoke run (smoke.py): scaled to the cluster, first rows only, stopped after the first checkpoint.
    smoke_run: bool = False
    version: int = FORMAT

    @property
    def run_uri(self) -> str:
        return attempt_uri(self.storage_uri, self.attempt)

    @property
    def result_uri(self) -> str:
        return result_uri(self.storage_uri, self.attempt)

    def pickled_files(self) -> dict[str, str]:
        """Parameter -> payload file, for the functions that travel pickled."""
        return {}


@dataclasses.dataclass(frozen=True)
class TrainingSpec(JobSpec):
    """A training: ``train_fn`` is ``{"import": "pkg.mod:fn"}`` or ``{"pickle": "<payload file>"}``;
    ``datasets`` map a name to ``{"uri", "format"}`` or a function reference; ``resume_from`` lists
    earlier attempts' folders, newest first, whose last checkpoint the run resumes from."""

    train_fn: dict[str, str] = dataclasses.field(default_factory=dict)
    train_loop_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    datasets: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    # A number of workers, or an elastic [min, max] (checks.check_num_workers).
    num_workers: int | list[int] = NUM_WORKERS
    # Elastic runs: how often Ray Train looks for room to grow (its ScalingConfig's interval).
    elastic_resize_monitor_interval_s: float = ELASTIC_RESIZE_MONITOR_INTERVAL_S
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    # ``auto``: the runtime chooses; it runs the spec with the API it chose (``ResultRecord.trainer_api``).
    trainer_api: str = TrainerApi.AUTO.value
    checkpoint_num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"
    max_failures: int = 0
    # A user's error fails the run at once (Ray Train restarts workers only for lost ones).
    retry_on_user_error: bool = False
    horovod_timeout_s: int = HOROVOD_TIMEOUT_S
    horovod_nics: list[str] | None = None
    horovod_env: dict[str, str] = dataclasses.field(default_factory=dict)
    resume_from: list[str] = dataclasses.field(default_factory=list)
    # How long the workers may wait for their resources before the run fails (None: no limit).
    pending_timeout_s: float | None = None
    # Read the datasets before the workers start (runtime.trainers.materialized).
    materialize_datasets: bool = True
    # Record Horovod's timeline on rank 0 and keep it next to the checkpoints.
    horovod_timeline: bool = False
    # ``@task.horovod``: every worker calls ``train_fn(*train_args, **train_kwargs)`` (no config).
    train_args: list[Any] | None = None
    train_kwargs: dict[str, Any] | None = None
    # MLflow tracking (plan.tracking_settings): tracking_uri, experiment_name, run_name, run_key (the tag a
    # retry finds the run by), tags; the driver adds run_id, experiment_id, run_url, step_offset.
    tracking: dict[str, Any] | None = None
    # A smoke run reads this many rows of each dataset (None: all of them).
    smoke_rows: int | None = None

    @property
    def history_uri(self) -> str:
        return f"{self.run_uri}/{HISTORY_FILE}"

    @property
    def worker_groups_uri(self) -> str:
        return worker_groups_uri(self.run_uri)

    @property
    def timeline_uri(self) -> str:
        return f"{self.run_uri}/{TIMELINE_FILE}"

    @property
    def timeline_local_path(self) -> str:
        """Where Horovod writes the timeline on the node of rank 0, before it is stored."""
        return f"/tmp/ahp-horovod-timeline-{self.submission_id}.json"

    @property
    def return_value_uri(self) -> str:
        """Where rank 0 leaves what the training function returned, for the record."""
        return f"{self.run_uri}/{RETURN_VALUE_FILE}"

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, list)

    @property
    def min_workers(self) -> int:
        """The workers a run needs to start: what the resource check and the pending timeout count."""
        return self.num_workers[0] if isinstance(self.num_workers, list) else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers[1] if isinstance(self.num_workers, list) else self.num_workers

    def worker_resources(self) -> dict[str, float]:
        """What Ray Train asks for each worker (its ScalingConfig rule): the given resources, else 1 CPU
        or 1 GPU; with use_gpu, 1 GPU unless the resources say otherwise."""
        if self.resources_per_worker is None:
            per_worker = {"GPU": 1.0} if self.use_gpu else {"CPU": 1.0}
        else:
            per_worker = {k: float(v) for k, v in self.resources_per_worker.items() if v}
        if self.use_gpu:
            per_worker.setdefault("GPU", 1.0)
        return per_worker

    def total_resources(self) -> dict[str, float]:
        """What all the workers ask of the cluster together (an elastic run starts with its minimum)."""
        return {name: amount * self.min_workers for name, amount in self.worker_resources().items() if amount}

    def pickled_files(self) -> dict[str, str]:
        refs = {"train_fn": self.train_fn, **{f"datasets[{name!r}]": ref for name, ref in self.datasets.items()}}
        return {name: ref["pickle"] for name, ref in refs.items() if "pickle" in ref}


@dataclasses.dataclass(frozen=True)
class TaskSpec(JobSpec):
    """One function run in the job's driver (``@task.ray``): ``function`` as ``train_fn`` above;
    ``args`` and ``kwargs`` are JSON."""

    function: dict[str, str] = dataclasses.field(default_factory=dict)
    args: list[Any] = dataclasses.field(default_factory=list)
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def pickled_files(self) -> dict[str, str]:
        return {"python_callable": self.function["pickle"]} if "pickle" in self.function else {}


@dataclasses.dataclass(frozen=True)
class TaskRecord(_Document):
    """What an attempt left beside its checkpoints, written atomically: a task's return value (JSON);
    for a failed attempt ``failure`` (``failures.Failure.to_dict()``, written by the runtime and
    completed by the Airflow side with the log's last lines), so the reason outlives the cluster."""

    submission_id: str
    attempt: int
    storage_uri: str
    run_uri: str
    return_value: Any = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    failure: dict[str, Any] | None = None
    log_tail: list[str] = dataclasses.field(default_factory=list)
    # What the task run cost up to this attempt (``Cost``), added by the Airflow side once the job
    # ended: Ray's own end time is known only then.
    cost: dict[str, Any] | None = None
    version: int = FORMAT


@dataclasses.dataclass(frozen=True)
class ResultRecord(TaskRecord):
    """A training attempt's record: its checkpoints, last metrics and world size, and ``history``,
    rank 0's reports in order (``{"report", "time", "metrics", "checkpoint"}``, ``checkpoint`` the
    name of the checkpoint's folder in the attempt's folder, or None)."""

    checkpoint_uri: str | None = None
    best_checkpoint_uri: str | None = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    world_size: int = 0
    trainer_api: str = TrainerApi.V2.value
    resumed_from: str | None = None
    # Horovod's timeline (Chrome tracing JSON) of rank 0, when it was recorded.
    timeline_uri: str | None = None
    history: list[dict] = dataclasses.field(default_factory=list)
    # The worker groups the run trained with, in order: {"started_at", "world_size", "reason"}, reason
    # one of SEGMENT_REASONS. world_size above is the last one's.
    segments: list[dict] = dataclasses.field(default_factory=list)
    checkpoint_score_attribute: str | None = None
    # The MLflow run the training logged to: {"run_id", "experiment_id", "run_url"}; None without one.
    tracking: dict[str, Any] | None = None
    # A smoke run's record: its checkpoint is real, its model is not one to promote.
    smoke_run: bool = False


# --- What a task returns (its XCom) ---------------------------------------------------------------


class SubmittedJob(TypedDict):
    """Pushed under ``XCOM_JOB`` at submission, and returned when the task does not wait."""

    submission_id: str
    dashboard_url: str
    storage_uri: str | None
    attempt: int
    kind: str
    # For the Training view: which metric ranks the checkpoints, and how the storage is read.
    checkpoint_score_attribute: str | None
    aws_conn_id: str | None
    # The task's job_tags (the job's metadata holds them too).
    job_tags: dict[str, str]


class TrainingResult(TypedDict):
    """A training task's ``return_value`` (the README documents it)."""

    checkpoint_uri: str | None
    best_checkpoint_uri: str | None
    metrics: dict[str, Any]
    submission_id: str
    dashboard_url: str
    storage_uri: str
    run_uri: str
    world_size: int
    attempt: int
    trainer_api: str
    resumed_from: str | None
    timings: dict[str, float]
    return_value: Any
    timeline_uri: str | None
    checkpoint_score_attribute: str | None
    # The worker groups of the attempt (ResultRecord.segments).
    segments: list[dict[str, Any]]
    # The attempts of this task run before this one: {"attempt", "submission_id", "failure_class", "summary"}.
    attempts: list[dict[str, Any]]
    # What the task run's attempts cost, failed ones included (``Cost``).
    cost: Cost | None
    # The task's job_tags, as they travelled in the Ray job's metadata.
    job_tags: dict[str, str]
    # The MLflow run (ResultRecord.tracking), with mlflow_tracking_uri or mlflow_conn_id; else None.
    mlflow: dict[str, Any] | None
    # True for a smoke run ([horovod] smoke_run or the task's smoke_run): never a model to promote.
    smoke_run: bool


class AttemptCost(TypedDict):
    """What one attempt (one Ray job) held, from Ray's timestamps and the worker groups' starts.
    ``wall_s``: submission to end (Ray's ``start_time``/``end_time``); ``queued_s``: submission until
    the workers held their resources (the whole attempt when they never did); ``held_s``: the
    workers' time; ``worker_s``: worker-seconds, the sum over worker groups of size x duration;
    ``cpu_s``/``gpu_s``: worker-seconds x what one worker holds; ``amount``: at ``Cost.prices``, or None."""

    attempt: int
    submission_id: str | None
    failed: bool
    submitted_at: float | None
    workers_started_at: float | None
    ended_at: float | None
    wall_s: float
    queued_s: float
    held_s: float
    world_size: int
    worker_s: float
    cpu_s: float
    gpu_s: float
    amount: float | None


class Cost(TypedDict):
    """A task run's cost: each attempt's, and the ``total`` of the same figures over all of them
    (failed attempts included; their share again as ``failed_worker_s``, ``failed_amount``)."""

    attempts: list[AttemptCost]
    total: dict[str, Any]
    resources_per_worker: dict[str, float]
    prices: dict[str, Any] | None


def training_result(
    record: ResultRecord,
    *,
    dashboard_url: str,
    attempts: list[dict] | None = None,
    cost: Cost | None = None,
    job_tags: dict[str, str] | None = None,
) -> TrainingResult:
    """The one place a training's result is built from its attempt's record."""
    return TrainingResult(
        checkpoint_uri=record.checkpoint_uri,
        best_checkpoint_uri=record.best_checkpoint_uri or record.checkpoint_uri,
        metrics=record.metrics,
        submission_id=record.submission_id,
        dashboard_url=dashboard_url,
        storage_uri=record.storage_uri,
        run_uri=record.run_uri,
        world_size=record.world_size,
        attempt=record.attempt,
        trainer_api=record.trainer_api,
        resumed_from=record.resumed_from,
        timings=record.timings,
        return_value=record.return_value,
        timeline_uri=record.timeline_uri,
        checkpoint_score_attribute=record.checkpoint_score_attribute,
        segments=list(record.segments),
        attempts=list(attempts or []),
        cost=cost,
        job_tags=dict(job_tags or {}),
        mlflow=record.tracking,
        smoke_run=record.smoke_run,
    )
