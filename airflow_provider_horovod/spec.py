"""The contract between the Airflow side and the Ray cluster: the training spec and the result record.

Both are small, versioned JSON documents. The Airflow side renders a ``TrainingSpec`` and ships it
with the job; the runtime on the cluster writes one ``ResultRecord`` per attempt next to that
attempt's checkpoints. Standard library only: this module is imported on both sides.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

SPEC_VERSION = 1
RESULT_VERSION = 1

SPEC_FILE = "spec.json"
RESULT_FILE = "result.json"
RETURN_VALUE_FILE = "return_value.json"
TIMELINE_FILE = "horovod_timeline.json"
HISTORY_FILE = "metrics_history.json"
# Written by the Airflow side once a task try has consumed an attempt's result: a later try of the
# same task run (a user clearing a succeeded task) then trains again instead of reusing it.
CONSUMED_FILE = "consumed.json"
ATTEMPT_PREFIX = "attempt-"

TRAINER_APIS = ("v2", "legacy")

# The Ray versions the runtime supports, [min, max): it uses Ray Train V2's backend API, which moves
# between Ray releases. The cluster extra in pyproject.toml declares the same range.
RAY_VERSIONS = ((2, 60), (2, 61))


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_ray_version(version: str | None) -> str | None:
    """None when the runtime supports this Ray version; else what is wrong and the fix."""
    low, high = RAY_VERSIONS
    wanted = f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"
    if version and low <= _release(version)[:2] < high:
        return None
    return (f"it runs Ray {version or 'of an unknown version'}, and airflow-provider-horovod's runtime supports "
            f"Ray {wanted}. Install ray[default,train]{wanted} on the cluster (the provider's [cluster] extra "
            "does), or use a provider release that supports Ray " + (version or "") + ".")
DATASET_FORMATS = ("parquet", "csv", "json")


def attempt_dir(storage_uri: str, attempt: int) -> str:
    """Folder of one attempt (one Ray job) inside a task run's storage folder."""
    return f"{storage_uri.rstrip('/')}/{ATTEMPT_PREFIX}{attempt}"


def result_uri(storage_uri: str, attempt: int) -> str:
    return f"{attempt_dir(storage_uri, attempt)}/{RESULT_FILE}"


def consumed_uri(storage_uri: str, attempt: int) -> str:
    return f"{attempt_dir(storage_uri, attempt)}/{CONSUMED_FILE}"


@dataclasses.dataclass(frozen=True)
class TrainingSpec:
    """What to run: everything the runtime needs, as plain JSON-serialisable data.

    ``train_fn`` is ``{"import": "pkg.mod:fn"}`` or ``{"pickle": "<file in the payload>"}``.
    ``datasets`` maps a name to ``{"uri": ..., "format": ...}`` or ``{"pickle": "<file>"}``.
    ``storage_uri`` is the task run's own folder; attempt ``N`` writes under
    ``<storage_uri>/attempt-N``. ``resume_from`` lists earlier attempts' folders, newest first,
    whose last checkpoint the run resumes from.
    """

    submission_id: str
    train_fn: dict[str, str]
    storage_uri: str
    attempt: int = 1
    train_loop_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    datasets: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    num_workers: int = 2
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    trainer_api: str = "v2"
    checkpoint_num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"
    max_failures: int = 0
    horovod_timeout_s: int = 30
    horovod_nics: list[str] | None = None
    horovod_env: dict[str, str] = dataclasses.field(default_factory=dict)
    resume_from: list[str] = dataclasses.field(default_factory=list)
    # How long the workers may wait for their resources (e.g. GPUs no node has) before the run fails.
    pending_timeout_s: float | None = None
    # The Airflow side's Python ("3.12"): a pickled function loads only on the same minor version.
    python_version: str = ""
    # Read the datasets before the workers start (see runtime.trainers.materialized).
    materialize_datasets: bool = True
    # Record Horovod's timeline on rank 0 and keep it next to the checkpoints.
    horovod_timeline: bool = False
    # ``@task.horovod``: every worker calls ``train_fn(*train_args, **train_kwargs)`` (no config).
    train_args: list[Any] | None = None
    train_kwargs: dict[str, Any] | None = None
    version: int = SPEC_VERSION

    @property
    def run_uri(self) -> str:
        return attempt_dir(self.storage_uri, self.attempt)

    @property
    def history_uri(self) -> str:
        return f"{self.run_uri}/{HISTORY_FILE}"

    @property
    def timeline_uri(self) -> str:
        return f"{self.run_uri}/{TIMELINE_FILE}"

    @property
    def timeline_local_path(self) -> str:
        """Where Horovod writes the timeline on the node of rank 0, before it is stored."""
        return f"/tmp/ahp-horovod-timeline-{self.submission_id}.json"

    @property
    def return_value_uri(self) -> str:
        """Where rank 0 leaves what the training function returned, for the result record."""
        return f"{self.run_uri}/{RETURN_VALUE_FILE}"

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
        """What all the workers ask of the cluster together."""
        return {name: amount * self.num_workers for name, amount in self.worker_resources().items() if amount}

    def pickled_files(self) -> dict[str, str]:
        """Parameter -> payload file, for the functions that travel pickled (they load only on the
        Python minor version that pickled them)."""
        refs = {"train_fn": self.train_fn, **{f"datasets[{name!r}]": ref for name, ref in self.datasets.items()}}
        return {name: ref["pickle"] for name, ref in refs.items() if "pickle" in ref}

    @property
    def result_uri(self) -> str:
        return result_uri(self.storage_uri, self.attempt)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> TrainingSpec:
        data = json.loads(text)
        if data.get("version") != SPEC_VERSION:
            raise ValueError(
                f"Training spec version {data.get('version')!r} is not {SPEC_VERSION}: the provider "
                "on the cluster and in Airflow differ. The job ships its own copy, so resubmit it."
            )
        return _build(cls, data)


def _build(cls, data: dict):
    """A dataclass from JSON, ignoring fields it does not know (written by a newer provider)."""
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known})


@dataclasses.dataclass(frozen=True)
class ResultRecord:
    """What a finished attempt produced. Written once, atomically, by the runtime."""

    submission_id: str
    attempt: int
    storage_uri: str
    run_uri: str
    checkpoint_uri: str | None
    best_checkpoint_uri: str | None
    metrics: dict[str, Any]
    world_size: int
    trainer_api: str
    resumed_from: str | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    # What the training function returned on rank 0 (JSON).
    return_value: Any = None
    # Horovod's timeline (Chrome tracing JSON) of rank 0, when it was recorded.
    timeline_uri: str | None = None
    # Rank 0's reports in order: {"report", "time", "metrics", "checkpoint"} (runtime.history).
    history: list[dict] = dataclasses.field(default_factory=list)
    version: int = RESULT_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1, default=str)

    @classmethod
    def from_json(cls, text: str) -> ResultRecord:
        data = json.loads(text)
        if data.get("version") != RESULT_VERSION:
            raise ValueError(f"Result record version {data.get('version')!r} is not {RESULT_VERSION}.")
        return _build(cls, data)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One Python function run as one Ray job (``RayTaskOperator``, ``@task.ray``).

    ``function`` is ``{"import": "pkg.mod:fn"}`` or ``{"pickle": "<file>"}``; ``args`` and ``kwargs``
    are JSON. Attempt ``N`` writes its record under ``<storage_uri>/attempt-N``.
    """

    submission_id: str
    function: dict[str, str]
    storage_uri: str
    attempt: int = 1
    args: list[Any] = dataclasses.field(default_factory=list)
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    python_version: str = ""
    version: int = SPEC_VERSION

    @property
    def run_uri(self) -> str:
        return attempt_dir(self.storage_uri, self.attempt)

    @property
    def result_uri(self) -> str:
        return result_uri(self.storage_uri, self.attempt)

    def pickled_files(self) -> dict[str, str]:
        return {"python_callable": self.function["pickle"]} if "pickle" in self.function else {}

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> TaskSpec:
        return _build(cls, json.loads(text))


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """What a finished task job returned (JSON), written once, atomically, by the runtime."""

    submission_id: str
    attempt: int
    storage_uri: str
    run_uri: str
    return_value: Any = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    version: int = RESULT_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> TaskRecord:
        return _build(cls, json.loads(text))
