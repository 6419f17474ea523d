"""The contract between the Airflow side and the Ray cluster: the names both sides use.

Whatever crosses the boundary is named here once: the defaults, the job states and kinds, the
files of a job's payload and of its storage folder (the layout and its inverse), the markers the
runtime prints, the XCom and job metadata keys, and the Ray versions the provider runs on. The
documents built from them (a job's spec, an attempt's record, a task's result) are in
``documents``. Standard library only: the runtime imports it on the cluster, which has no Airflow.
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
from typing import Any

from airflow_provider_horovod.exceptions import UnknownJobStatusError

VERSION = "0.2.0"
# Of the spec and the record: a reader refuses a spec of another version and ignores unknown fields.
FORMAT = 1

# --- Defaults, decided once ------------------------------------------------------------------------

POLL_INTERVAL_S = 1.0
# Wait in the triggerer, not in a worker slot: a training waits for hours (unlike Airflow's own
# [operators] default_deferrable, which is off in a stock install).
DEFERRABLE = True
# Airflow's configuration section of the provider's options ([horovod] smoke_run, ...).
CONFIG_SECTION = "horovod"
# A deferrable task first follows its job this long in the worker ([horovod] defer_after_seconds): a job
# that ends within it never defers, so it never waits for the resume guard below. Ray Train's own start
# takes a good part of a minute on a busy cluster: a shorter follow defers short trainings just before their end.
SYNC_WAIT_BEFORE_DEFER_S = 60.0
# A trigger holds its event until this long after the deferral: Airflow 3.3.2 fails a task whose
# resume it queues before it has seen the deferring worker exit (apache/airflow#67287); a loaded
# LocalExecutor was seen to report that exit more than 10 s after the deferral.
RESUME_GUARD_S = 20.0
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
# verdict on the failure (failures.Failure, JSON). Each mark carries the attempt's own token (``marked``;
# JobSpec.mark_token, META_MARK_TOKEN), so that a line the user's code prints with a mark, or one copied
# from another job's log, is not taken for the runtime's. A job without a token (an older provider's)
# uses the bare marks.
RESULT_MARK = "AHP_RESULT "
ERROR_MARK = "AHP_ERROR "
FAILURE_MARK = "AHP_FAILURE "


def marked(mark: str, token: str) -> str:
    """The mark as the runtime of an attempt with ``token`` prints it: ``AHP_ERROR:<token> ``."""
    return f"{mark.rstrip()}:{token} " if token else mark


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
# A script run (runtime.script): the folder whose files rank 0 leaves are the checkpoint (a retry finds the
# last checkpoint's files there), and how rank 0 prints its metrics without an import of Ray.
SCRIPT_CHECKPOINT_ENV = "AHP_CHECKPOINT_DIR"
SCRIPT_METRICS_PREFIX = "METRICS "
# What a script's rank process (runtime/script_rank.py) is told by its Ray worker: the socket that answers its
# calls of Ray Train, and the worker's pid (the rank ends if that worker has ended).
SCRIPT_BRIDGE_FD_ENV = "AHP_SCRIPT_BRIDGE_FD"
SCRIPT_PARENT_PID_ENV = "AHP_SCRIPT_WORKER_PID"
# The modules a script's rank imports before it is handed its script (runtime.rank_process.start_in_worker).
SCRIPT_EARLY_IMPORTS_ENV = "AHP_SCRIPT_EARLY_IMPORTS"
# Before each line a script's rank writes, as horovodrun marks them: [1]<stdout>: (runtime/rank_process.py).
SCRIPT_LINE_MARK = "[{rank}]<{stream}>:"
SCRIPT_LINE_MARKED = r"^\[\d+\]<std(?:out|err)>:"
# Read by each Ray worker process at its start: its Python thread's niceness (Ray's default is 15; Ray's own
# threads stay at 0). A job's runtime_env cannot set it (Ray's job supervisor removes it there); an actor's
# runtime_env, or a driver's ray.init, can.
RAY_WORKER_NICENESS_ENV = "RAY_worker_niceness"
RAY_WORKER_NICENESS = 15  # Ray's default for it
# A script's ranks run at niceness 0, as horovodrun's do: the env of its job's Ray workers.
RANKS_AT_NICENESS_0 = {RAY_WORKER_NICENESS_ENV: "0"}

# XCom keys the provider pushes (the return value aside).
XCOM_CHECKPOINT_URI = "checkpoint_uri"
XCOM_SUBMISSION_ID = "submission_id"
XCOM_JOB = "ray_job"  # the SubmittedJob, pushed at submission
XCOM_COST = "cost"  # the job's Cost (a training's return value holds it too)
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
# The attempt's token of its runtime's marks (``marked``).
META_MARK_TOKEN = f"{META_PREFIX}mark_token"
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
