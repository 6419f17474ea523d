"""Experiment tracking on the cluster: every training with ``mlflow_tracking_uri`` logs to one MLflow
run, whatever its function does.

The job's driver finds the task run's MLflow run (by a tag naming the task run, so a retry's next
attempt goes on with the run of the attempts before it) or creates it, logs the parameters and the
Airflow identifiers, and hands the run id to the workers in the spec. Rank 0 logs every
``ray.train.report`` as it is recorded (``storage.History``), at its step: the report's number, after
the steps that earlier attempts logged. When the attempt ends the driver tags the checkpoint URI and
ends the run, FINISHED or FAILED.

MLflow is imported only here, inside functions, and only when the spec asks for tracking. A tracking
server that cannot be reached does not fail the training: the log says so and the result has no run.
Credentials from an MLflow connection travel in the job's payload (``MLFLOW_AUTH_FILE``), never in its
``runtime_env``, and reach MLflow's client through its environment variables.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import urllib.parse
from typing import Any

from airflow_provider_horovod.contract import MLFLOW_AUTH_FILE
from airflow_provider_horovod.documents import TrainingSpec

# The tag a task run's MLflow run is found by: the task run's submission id stem (contract.TaskRun.base_id).
TASK_RUN_TAG = "airflow_provider_horovod.task_run"
# MLflow's client retries a failing request 7 times with growing waits (minutes); a training should
# not stall that long on a tracking server that is gone.
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
# The connection's credentials -> the variables MLflow's client reads.
AUTH_ENV = {
    "username": "MLFLOW_TRACKING_USERNAME",
    "password": "MLFLOW_TRACKING_PASSWORD",
    "token": "MLFLOW_TRACKING_TOKEN",
}
# MLflow's limit on a parameter's value (6000 characters) and on one log_batch call (100 parameters).
PARAM_CHARS = 6000
PARAMS_PER_BATCH = 100
_UNSAFE_KEY = re.compile(r"[^A-Za-z0-9_\-. /]+")


# --- pure: what is logged -------------------------------------------------------------------------


def flat(values: dict, prefix: str = "") -> dict[str, str]:
    """Nested dicts as ``a.b`` keys; other values as MLflow keeps them (strings, lists as JSON)."""
    out: dict[str, str] = {}
    for key, value in values.items():
        name = metric_key(f"{prefix}.{key}" if prefix else str(key))
        if isinstance(value, dict) and value:
            out.update(flat(value, name))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[name] = text[:PARAM_CHARS]
    return out


def params(spec: TrainingSpec) -> dict[str, str]:
    """The training's parameters: ``train_loop_config`` (or a ``@task.horovod`` call's arguments), the
    world size and the trainer."""
    values = {
        **flat(spec.train_loop_config),
        **flat(spec.train_kwargs or {}),
        **flat({"args": spec.train_args} if spec.train_args else {}),
    }
    values.update(
        {
            "world_size": json.dumps(spec.num_workers),
            "trainer": "horovod",
            "trainer_api": spec.trainer_api,
            "use_gpu": str(spec.use_gpu),
        }
    )
    return values


def tags(spec: TrainingSpec) -> dict[str, str]:
    """The Airflow side's tags (dag, run, task, try, map index) and this attempt's."""
    tracking = spec.tracking or {}
    return {
        **tracking.get("tags", {}),
        TASK_RUN_TAG: tracking["run_key"],
        "ray.submission_id": spec.submission_id,
        "ray.attempt": str(spec.attempt),
    }


def metric_key(name: str) -> str:
    """A name MLflow takes (letters, digits and ``_-. /``)."""
    return _UNSAFE_KEY.sub("_", name) or "_"


def step_of(point: dict, offset: int) -> int:
    """A report's step in the run: its number in the attempt, after the steps of earlier attempts."""
    return offset + int(point["report"])


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The run's page in the MLflow UI, for an http(s) tracking server (credentials in the URI left out)."""
    parts = urllib.parse.urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def run_filter(run_key: str) -> str:
    """The search that finds the task run's MLflow run (run keys are ``[A-Za-z0-9._-]``)."""
    return f"tags.`{TASK_RUN_TAG}` = '{run_key}'"


def summary(spec: TrainingSpec) -> dict[str, Any] | None:
    """What the result record (and the task's XCom) says of the run; None without one."""
    tracking = spec.tracking or {}
    if not tracking.get("run_id"):
        return None
    return {key: tracking.get(key) for key in ("run_id", "experiment_id", "run_url")}


def auth_env(folder: str) -> dict[str, str]:
    """The MLflow client's credential variables, from the job's payload (an MLflow connection's)."""
    path = os.path.join(folder, MLFLOW_AUTH_FILE)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        auth = json.load(f)
    return {AUTH_ENV[key]: str(value) for key, value in auth.items() if key in AUTH_ENV and value}


# --- the driver: find or create the run, end it ----------------------------------------------------


def client(tracking_uri: str):
    for name, value in CLIENT_ENV.items():
        os.environ.setdefault(name, value)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def experiment_id(mlflow_client, name: str) -> str:
    """The experiment's id; created when it does not exist (by this training or one beside it)."""
    from mlflow.exceptions import MlflowException

    found = mlflow_client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return mlflow_client.create_experiment(name)
    except MlflowException:  # created meanwhile by a training beside this one (a mapped task)
        found = mlflow_client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def last_step(mlflow_client, run) -> int:
    """The highest step logged in the run so far (0 for a new run)."""
    steps = [m.step for key in run.data.metrics for m in mlflow_client.get_metric_history(run.info.run_id, key)]
    return max(steps, default=0)


def find_or_create_run(mlflow_client, spec: TrainingSpec, experiment: str) -> tuple[str, int]:
    """(run id, steps already logged): the task run's run, running again, or a new one."""
    tracking = spec.tracking or {}
    found = mlflow_client.search_runs(
        [experiment],
        filter_string=run_filter(tracking["run_key"]),
        max_results=1,
        order_by=["attributes.start_time ASC"],
    )
    if found:
        run = found[0]
        mlflow_client.update_run(run.info.run_id, status="RUNNING")
        return run.info.run_id, last_step(mlflow_client, run)
    run = mlflow_client.create_run(experiment, tags=tags(spec), run_name=tracking.get("run_name"))
    return run.info.run_id, 0


def log_params(mlflow_client, run_id: str, values: dict[str, str]) -> None:
    from mlflow.entities import Param

    items = sorted(values.items())
    for start in range(0, len(items), PARAMS_PER_BATCH):
        mlflow_client.log_batch(run_id, params=[Param(k, v) for k, v in items[start : start + PARAMS_PER_BATCH]])


def started(spec: TrainingSpec, folder: str) -> TrainingSpec:
    """In the job's driver, before training: the spec with its MLflow run (``run_id``,
    ``experiment_id``, ``run_url``, ``step_offset`` in ``spec.tracking``); the spec as it is without
    tracking, or when the tracking server fails."""
    if not spec.tracking:
        return spec
    os.environ.update(auth_env(folder))
    try:
        mlflow_client = client(spec.tracking["tracking_uri"])
        experiment = experiment_id(mlflow_client, spec.tracking["experiment_name"])
        run_id, offset = find_or_create_run(mlflow_client, spec, experiment)
        mlflow_client.log_batch(run_id, tags=_tags(tags(spec)))
        try:
            log_params(mlflow_client, run_id, params(spec))
        except Exception as err:  # params are immutable in MLflow: a retry may not change them
            print(f"MLflow: the parameters of run {run_id} were not logged: {type(err).__name__}: {err}", flush=True)
    except Exception as err:
        print(f"MLflow tracking is off for this attempt: {type(err).__name__}: {err}", flush=True)
        return spec
    url = run_url(spec.tracking["tracking_uri"], experiment, run_id)
    verb = "continues" if offset else "is"
    print(
        f"MLflow run {run_id} (experiment {spec.tracking['experiment_name']!r}) {verb} this training's run"
        f"{f', from step {offset + 1}' if offset else ''}: {url or run_id}",
        flush=True,
    )
    return dataclasses.replace(
        spec,
        tracking={
            **spec.tracking,
            "run_id": run_id,
            "experiment_id": experiment,
            "run_url": url,
            "step_offset": offset,
        },
    )


def ended(spec: TrainingSpec, checkpoints: dict[str, str | None] | None) -> None:
    """In the driver, after training: the checkpoint URIs tagged, the run FINISHED; or, with no
    ``checkpoints`` (the attempt failed), the run FAILED (a retry's attempt sets it running again)."""
    tracking = spec.tracking or {}
    if not tracking.get("run_id"):
        return
    try:
        mlflow_client = client(tracking["tracking_uri"])
        if checkpoints is not None:
            mlflow_client.log_batch(tracking["run_id"], tags=_tags({k: v for k, v in checkpoints.items() if v}))
        mlflow_client.set_terminated(tracking["run_id"], status="FINISHED" if checkpoints is not None else "FAILED")
    except Exception as err:
        print(f"MLflow: run {tracking['run_id']} could not be ended: {type(err).__name__}: {err}", flush=True)


def _tags(values: dict[str, Any]) -> list:
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)) for k, v in sorted(values.items())]


# --- rank 0: every report, at its step ---------------------------------------------------------------


class Tracker:
    """Rank 0's MLflow logging in a worker process: ``log`` is called with each report that
    ``storage.History`` records. A failing tracking server stops the logging, not the training."""

    def __init__(self) -> None:
        self.tracking: dict[str, Any] | None = None
        self.client: Any = None
        self.stopped = False

    def follow(self, spec: TrainingSpec, listeners: list) -> None:
        """Log this worker's reports to the spec's run (nothing without one)."""
        if not (spec.tracking or {}).get("run_id"):
            return
        self.tracking = spec.tracking
        if self.log not in listeners:
            listeners.append(self.log)

    def log(self, point: dict) -> None:
        if self.tracking is None or self.stopped or not point.get("metrics"):
            return
        try:
            from mlflow.entities import Metric

            if self.client is None:
                self.client = client(self.tracking["tracking_uri"])
            step = step_of(point, int(self.tracking.get("step_offset") or 0))
            timestamp = int(point["time"] * 1000)
            self.client.log_batch(
                self.tracking["run_id"],
                metrics=[Metric(metric_key(k), v, timestamp, step) for k, v in sorted(point["metrics"].items())],
            )
        except Exception as err:
            self.stopped = True
            print(
                f"MLflow: logging metrics to run {self.tracking['run_id']} stopped: {type(err).__name__}: {err}",
                flush=True,
            )


TRACKER = Tracker()
