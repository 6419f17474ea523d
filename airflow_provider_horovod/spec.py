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
# Written by the Airflow side once a task try has consumed an attempt's result: a later try of the
# same task run (a user clearing a succeeded task) then trains again instead of reusing it.
CONSUMED_FILE = "consumed.json"
ATTEMPT_PREFIX = "attempt-"

TRAINER_APIS = ("v2", "legacy")
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
    version: int = SPEC_VERSION

    @property
    def run_uri(self) -> str:
        return attempt_dir(self.storage_uri, self.attempt)

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
        return cls(**data)


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
    version: int = RESULT_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1, default=str)

    @classmethod
    def from_json(cls, text: str) -> ResultRecord:
        data = json.loads(text)
        if data.get("version") != RESULT_VERSION:
            raise ValueError(f"Result record version {data.get('version')!r} is not {RESULT_VERSION}.")
        return cls(**data)
