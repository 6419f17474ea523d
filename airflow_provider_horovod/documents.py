"""The documents that cross the boundary: what a job is asked to do (its spec, in the job's payload),
what its attempt leaves beside its checkpoints (its record), and what a task returns (its XCom).

JSON in and out, standard library only, as ``contract``: the runtime reads and writes them on the
cluster, which has no Airflow. The names, files and defaults they use are ``contract``'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, TypedDict

from airflow_provider_horovod.contract import (
    ELASTIC_RESIZE_MONITOR_INTERVAL_S,
    FORMAT,
    HISTORY_FILE,
    HOROVOD_TIMEOUT_S,
    NUM_WORKERS,
    RETURN_VALUE_FILE,
    TIMELINE_FILE,
    TrainerApi,
    attempt_uri,
    result_uri,
    worker_groups_uri,
)


class _Document:
    """JSON in and out. A reader ignores fields it does not know (a newer provider wrote them)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1, default=str)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, text: str) -> Any:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """The document of ``data``; ValueError naming the document for anything that is not one (a
        file cut short or edited by hand, another document), as for another format."""
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__} must be a JSON object, not {type(data).__name__}.")
        if data.get("version", FORMAT) != FORMAT:
            raise ValueError(
                f"{cls.__name__} of format {data.get('version')!r} is not {FORMAT}: the provider on the "
                "cluster and in Airflow differ. The job ships its own copy, so resubmit it."
            )
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        missing = [
            f.name
            for f in fields
            if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ValueError(f"{cls.__name__} lacks {', '.join(missing)}: it was cut short or edited.")
        hints = typing.get_type_hints(cls)
        for field in fields:
            if field.name in data and not _fits(data[field.name], hints[field.name]):
                raise ValueError(
                    f"{cls.__name__}'s {field.name}={data[field.name]!r} is not of its type "
                    f"({field.type}): it was edited, or written by another program."
                )
        known = {f.name for f in fields}
        return cls(**{k: v for k, v in data.items() if k in known})


def _fits(value: Any, annotation: Any) -> bool:
    """Whether a JSON value is of a field's type: its own type and, in a dict or a list, its items'."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if annotation is type(None):
        return value is None
    if annotation in (int, float):  # JSON has no int of bool; 2 is a float's value too
        kinds = (int, float) if annotation is float else (int,)
        return isinstance(value, kinds) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    if origin is list:
        return isinstance(value, list) and all(_fits(item, args[0]) for item in value)
    return isinstance(value, origin or annotation)


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
    # The attempt's token in its marked lines (contract.marked), drawn at submission.
    mark_token: str = ""
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
    # Read the datasets before the workers start (runtime.datasets.materialized).
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
    # A script run unchanged on every worker instead of ``train_fn`` (runtime.script):
    # ``{"path": "train.py"}`` (relative to the job's working_dir) or ``{"module": "pkg.train"}``, and ``args``.
    script: dict[str, Any] | None = None

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


# The field of a record that holds the checksum of its other fields (``sealed``): the finish step refuses
# a record whose fields do not match it (edited after the job wrote it).
CHECKSUM = "checksum"


def checksum(fields: Mapping[str, Any]) -> str:
    """Of a record's fields as JSON holds them (``sealed``'s), the checksum itself left out."""
    body = {k: v for k, v in fields.items() if k != CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def sealed(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A record's fields as JSON holds them, with their checksum: what every writer of a record stores."""
    body = json.loads(json.dumps({k: v for k, v in fields.items() if k != CHECKSUM}, default=str))
    return {**body, CHECKSUM: checksum(body)}


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

    def to_json(self) -> str:
        """Its fields and their checksum (``sealed``)."""
        return json.dumps(sealed(dataclasses.asdict(self)), sort_keys=True, indent=1)


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
    # The script a script run ran (``TrainingSpec.script``'s path or module); None for a function. A script
    # may end without a checkpoint; a function may not.
    script: str | None = None


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
    """A training task's ``return_value`` (docs/tasks.md documents it)."""

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
